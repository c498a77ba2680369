"""Flip rates by the base policy's difficulty bucket (QUATRO paper, Fig. IV; ALGORITHMS.md "Flip rates").

Buckets come from the base policy's number of correct samples per prompt out of n = 256:
[0, 8) very hard, [8, 32) hard, [32, 128) medium, [128, 256] easy. For another n the edges scale
with n (the same pass-rate fractions 1/32, 1/8, 1/2). Buckets always use *all* base samples.

Two readings of "unsolved":
- literal (``k=None``): none of the prompt's n samples is correct. Then a base-unsolved prompt has
  zero correct base samples, so it always lies in the very-hard bucket and every other bucket's
  flip rate is identically 0.
- budget-k (``k`` given), RECONSTRUCTED: none of the prompt's *first k* samples (by ``sample_idx``) is
  correct, for the base and the trained policy alike. The paper's Fig. IV shows flips in the harder
  buckets, which the literal rule cannot produce; the paper does not state its budget, so k is a
  setting (``eval.flip_k``) and the report names the rule it used.
"""
from __future__ import annotations

import pandas as pd

BUCKETS = ("very_hard", "hard", "medium", "easy")
EDGES_256 = (8, 32, 128)
MEASURES = ("n_prompts", "solved_from_unsolved", "improved", "regressed")
POOLED = "all"  # the row pooling every benchmark's prompts


def difficulty_bucket(c_base: int, n_base: int) -> str:
    """Bucket name of a prompt whose base policy solved ``c_base`` of ``n_base`` samples."""
    frac = c_base / n_base
    for name, edge in zip(BUCKETS, EDGES_256):
        if frac < edge / 256:
            return name
    return "easy"


def _per_prompt(df: pd.DataFrame, k: int | None) -> pd.DataFrame:
    """(benchmark, prompt_id) -> n (samples), c (correct among all), c_k (correct among the first k, or all)."""
    df = df.sort_values(["benchmark", "prompt_id", "sample_idx"])
    g = df.groupby(["benchmark", "prompt_id"])["correct"]
    out = g.agg(n="size", c="sum")
    out["c_k"] = out["c"] if k is None else g.apply(lambda s: int(s.iloc[:k].sum()))
    return out


def flip_rates(base: pd.DataFrame, trained: pd.DataFrame, k: int | None = None) -> pd.DataFrame:
    """Per benchmark and difficulty bucket: share of prompts flipped to solved, improved, and regressed.

    Args:
        base, trained: samples tables (``benchmark``, ``prompt_id``, ``sample_idx``, ``correct``) of the
            base and the trained policy on the same prompts.
        k: None for the literal rule (all samples), else the budget-k reading (first k samples).
    Returns:
        DataFrame indexed by (benchmark, bucket), benchmark ``all`` pooling every prompt, with
        ``n_prompts``; ``solved_from_unsolved``: base unsolved, trained solved (share of the bucket);
        ``improved``: trained pass rate over all samples higher than the base's; ``regressed``: base
        solved, trained unsolved. Empty buckets are left out.
    Raises:
        ValueError: the two tables share no prompt, or k < 1, or k exceeds a prompt's samples.
    """
    if k is not None and int(k) < 1:
        raise ValueError(f"flip_k={k!r}: must be >= 1 (or None for the literal rule)")
    joined = _per_prompt(base, k).join(_per_prompt(trained, k), lsuffix="_base", rsuffix="_trained", how="inner")
    if joined.empty:
        raise ValueError("flip rates: the base and trained samples share no (benchmark, prompt_id)")
    if k is not None and int(k) > int(min(joined["n_base"].min(), joined["n_trained"].min())):
        raise ValueError(f"flip_k={k}: larger than the samples per prompt "
                         f"(base {int(joined['n_base'].min())}, trained {int(joined['n_trained'].min())})")
    joined["bucket"] = [difficulty_bucket(int(c), int(n)) for c, n in zip(joined["c_base"], joined["n_base"])]
    unsolved_b, unsolved_t = joined["c_k_base"] == 0, joined["c_k_trained"] == 0
    joined["solved_from_unsolved"] = unsolved_b & ~unsolved_t
    joined["improved"] = joined["c_trained"] / joined["n_trained"] > joined["c_base"] / joined["n_base"]
    joined["regressed"] = ~unsolved_b & unsolved_t
    pooled = joined.reset_index().assign(benchmark=POOLED).set_index(["benchmark", "prompt_id"])
    frames = []
    for df in (joined, pooled):
        agg = df.groupby([df.index.get_level_values("benchmark"), "bucket"]).agg(
            n_prompts=("c_base", "size"), solved_from_unsolved=("solved_from_unsolved", "mean"),
            improved=("improved", "mean"), regressed=("regressed", "mean"))
        frames.append(agg)
    out = pd.concat(frames)
    out.index = out.index.set_names(["benchmark", "bucket"])
    benches = sorted(b for b in out.index.get_level_values(0).unique() if b != POOLED) + [POOLED]
    order = [(b, q) for b in benches for q in BUCKETS if (b, q) in out.index]
    return out.loc[order]


def flip_rule(k: int | None) -> str:
    """Human-readable name of the rule (the report prints it)."""
    return "literal: unsolved = no correct sample among all n" if k is None else \
        f"budget-{int(k)} (RECONSTRUCTED): unsolved = no correct sample among the first {int(k)}"
