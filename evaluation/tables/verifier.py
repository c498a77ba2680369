"""The ``verifier`` table and its ``verifier_disagreements`` listing: how often this suite's verdict differs from plain
math-verify's."""
from __future__ import annotations

import pandas as pd

from ..metrics.table_registry import TableSettings, register_table
from .frames import with_mean


VERIFIER_COLUMNS = ["benchmark", "prompt_id", "sample_idx", "gold", "extracted_answer", "correct",
                    "reference_correct", "response_tail"]


def verifier_tables(samples: pd.DataFrame, tail_chars: int = 400) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The disagreement audit: how often this suite's verdict differs from plain math-verify's.

    Args:
        samples: the samples table; only rows with a ``reference_correct`` verdict count (math tasks; rows
            of other tasks, or sampled before the audit existed, have none).
        tail_chars: characters of each disagreeing response kept in the listing.
    Returns:
        (table, listing): ``table`` per benchmark (and ``mean``, unweighted): ``verifier_disagreement`` (the
        share of samples whose two verdicts differ), ``verifier_only_suite`` (correct here, wrong for plain
        math-verify) and ``verifier_only_math_verify`` (the reverse), all in [0, 1]; ``listing`` the
        disagreeing samples (:data:`VERIFIER_COLUMNS`). Both empty when no sample has a reference verdict.
    Source: this suite (no peer reports it); the reference grader is :mod:`core.verify`'s plain reading.
    """
    if "reference_correct" not in samples or samples["reference_correct"].isna().all():
        return pd.DataFrame(), pd.DataFrame(columns=VERIFIER_COLUMNS)
    rows = samples[samples["reference_correct"].notna()]
    ours, ref = rows["correct"].astype(bool), rows["reference_correct"].astype(bool)
    frame = pd.DataFrame({"benchmark": rows["benchmark"], "verifier_disagreement": (ours != ref).astype(float),
                          "verifier_only_suite": (ours & ~ref).astype(float),
                          "verifier_only_math_verify": (~ours & ref).astype(float)})
    table = with_mean(frame.groupby("benchmark").mean())
    listing = rows[ours != ref].assign(response_tail=lambda d: d["response"].astype(str).str[-tail_chars:])
    listing = listing.sort_values(["benchmark", "prompt_id", "sample_idx"]).reindex(columns=VERIFIER_COLUMNS)
    return table, listing.reset_index(drop=True)


def _verifier(samples, s: TableSettings):
    table, listing = verifier_tables(samples)
    return {"verifier": table, "verifier_disagreements": listing} if len(table) else None


register_table("verifier", _verifier, section="Grader check: this suite's verifier against plain math-verify",
               columns=("verifier_disagreement", "verifier_only_suite", "verifier_only_math_verify"),
               listings=("verifier_disagreements",),
               doc="How often this suite's verdict differs from plain math-verify's (and the disagreeing samples).")
