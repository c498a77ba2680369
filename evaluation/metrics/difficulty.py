"""Flip rates by the base policy's difficulty bucket.

Buckets come from the base policy's number of correct samples per prompt out of n = 256:
[0, 8) very hard, [8, 32) hard, [32, 128) medium, [128, 256] easy. For another n the edges scale
with n (the same pass-rate fractions 1/32, 1/8, 1/2).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

BUCKETS = ("very_hard", "hard", "medium", "easy")
EDGES_256 = (8, 32, 128)


def difficulty_bucket(c_base: int, n_base: int) -> str:
    """Bucket name of a prompt whose base policy solved ``c_base`` of ``n_base`` samples."""
    frac = c_base / n_base
    for name, edge in zip(BUCKETS, EDGES_256):
        if frac < edge / 256:
            return name
    return "easy"


def flip_rates(base: pd.DataFrame, trained: pd.DataFrame) -> pd.DataFrame:
    """Per difficulty bucket: share of prompts flipped to solved, improved, and regressed.

    Args:
        base, trained: samples tables (``benchmark``, ``prompt_id``, ``correct``) of the base and the
            trained policy on the same prompts.
    Returns:
        DataFrame indexed by bucket with ``n_prompts``, ``solved_from_unsolved`` (base solved none,
        trained solved at least one, as a share of the bucket), ``improved`` (higher pass rate),
        ``regressed`` (base solved at least one, trained none).
    Raises:
        ValueError: the two tables share no prompt.
    """
    def per_prompt(df):
        return df.groupby(["benchmark", "prompt_id"])["correct"].agg(n="size", c="sum")

    joined = per_prompt(base).join(per_prompt(trained), lsuffix="_base", rsuffix="_trained", how="inner")
    if joined.empty:
        raise ValueError("flip rates: the base and trained samples share no (benchmark, prompt_id)")
    joined["bucket"] = [difficulty_bucket(int(c), int(n)) for c, n in zip(joined["c_base"], joined["n_base"])]
    rate_b, rate_t = joined["c_base"] / joined["n_base"], joined["c_trained"] / joined["n_trained"]
    joined["solved_from_unsolved"] = (joined["c_base"] == 0) & (joined["c_trained"] > 0)
    joined["improved"] = rate_t > rate_b
    joined["regressed"] = (joined["c_base"] > 0) & (joined["c_trained"] == 0)
    out = joined.groupby("bucket").agg(n_prompts=("c_base", "size"), solved_from_unsolved=("solved_from_unsolved", "mean"),
                                       improved=("improved", "mean"), regressed=("regressed", "mean"))
    return out.reindex([b for b in BUCKETS if b in out.index])
