"""The ``verifier`` table and its ``verifier_disagreements`` listing: the grader audit. How often this suite's verdict
differs from plain math-verify's, how often a response gave no answer in the form its prompt asks for, and how often
an answer that restates the prompt was refused (or, a leak, accepted)."""
from __future__ import annotations

import pandas as pd

from ..metrics.table_registry import MetricTable, TableSettings, register_table
from .frames import with_mean

VERIFIER_COLUMNS = ["benchmark", "prompt_id", "sample_idx", "gold", "extracted_answer", "answer_status", "correct",
                    "reference_correct", "response_tail"]
#: the audit's columns (each a share of the benchmark's samples, in [0, 1])
AUDIT_COLUMNS = ("verifier_disagreement", "verifier_only_suite", "verifier_only_math_verify", "format_miss",
                 "echo_refused", "echo_paid_by_math_verify", "accepted_restatement")


def _accepted_restatements(rows: pd.DataFrame) -> pd.Series:
    """True for each correct sample whose answer, as its task read it (``extracted_answer``), restates its prompt
    (:func:`core.tasks.answer_forms.restates`): 0 for every task that reads its answers through an answer form, so a
    non-zero share is a leak (a task or a change that pays an echo)."""
    from core.tasks.answer_forms import restates

    ok = rows["correct"].astype(bool)
    out = pd.Series(False, index=rows.index)
    for i in rows.index[ok]:
        ans = rows.at[i, "extracted_answer"]
        out.at[i] = isinstance(ans, str) and restates(ans, str(rows.at[i, "prompt"]), str(rows.at[i, "gold"]))
    return out


def verifier_tables(samples: pd.DataFrame, tail_chars: int = 400) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The grader audit.

    Args:
        samples: the samples table; rows with a ``reference_correct`` verdict (math tasks) feed the disagreement
            columns, rows with an ``answer_status`` (tasks that read answers through an answer form,
            :mod:`core.tasks.answer_forms`) the answer-form columns; other rows, or samples graded before either
            existed, count in neither.
        tail_chars: characters of each listed response kept in the listing.
    Returns:
        (table, listing): ``table`` per benchmark (and ``mean``, unweighted), each a share of the benchmark's audited
        samples in [0, 1]: ``verifier_disagreement`` (this suite's and plain math-verify's verdicts differ),
        ``verifier_only_suite`` (correct here, wrong for plain math-verify), ``verifier_only_math_verify`` (the
        reverse), ``format_miss`` (no answer in the asked form: no credit), ``echo_refused`` (an answer refused as a
        restatement of the prompt or an expression where a value is asked), ``echo_paid_by_math_verify`` (of those,
        the ones plain math-verify would have paid), ``accepted_restatement`` (scored correct although the answer
        restates the prompt: a leak, 0 when every grader reads its answer form); ``listing`` the samples whose two
        verdicts differ (:data:`VERIFIER_COLUMNS`). Both empty when no sample has a reference verdict or a status.
    Source: this suite (no peer reports it); the reference grader is :mod:`core.verify`'s plain reading.
    """
    from core.tasks.answer_forms import ECHOES, MISSING

    has_ref = "reference_correct" in samples and samples["reference_correct"].notna().any()
    has_status = "answer_status" in samples and samples["answer_status"].notna().any()
    if not (has_ref or has_status):
        return pd.DataFrame(), pd.DataFrame(columns=VERIFIER_COLUMNS)
    parts = []
    if has_ref:
        rows = samples[samples["reference_correct"].notna()]
        ours, ref = rows["correct"].astype(bool), rows["reference_correct"].astype(bool)
        parts.append(pd.DataFrame({"benchmark": rows["benchmark"], "verifier_disagreement": (ours != ref).astype(float),
                                   "verifier_only_suite": (ours & ~ref).astype(float),
                                   "verifier_only_math_verify": (~ours & ref).astype(float)})
                     .groupby("benchmark").mean())
    if has_status:
        rows = samples[samples["answer_status"].notna()]
        status = rows["answer_status"].astype(str)
        echo = status.isin(ECHOES)
        ref = rows["reference_correct"].fillna(False).astype(bool) if "reference_correct" in rows else False
        parts.append(pd.DataFrame({"benchmark": rows["benchmark"], "format_miss": (status == MISSING).astype(float),
                                   "echo_refused": echo.astype(float),
                                   "echo_paid_by_math_verify": (echo & ref).astype(float),
                                   "accepted_restatement": _accepted_restatements(rows).astype(float)})
                     .groupby("benchmark").mean())
    table = with_mean(pd.concat(parts, axis=1).reindex(columns=[c for c in AUDIT_COLUMNS
                                                                if any(c in p for p in parts)]))
    if not has_ref:
        return table, pd.DataFrame(columns=VERIFIER_COLUMNS)
    rows = samples[samples["reference_correct"].notna()]
    differ = rows["correct"].astype(bool) != rows["reference_correct"].astype(bool)
    listing = rows[differ].assign(response_tail=lambda d: d["response"].astype(str).str[-tail_chars:])
    listing = listing.sort_values(["benchmark", "prompt_id", "sample_idx"]).reindex(columns=VERIFIER_COLUMNS)
    return table, listing.reset_index(drop=True)


def _verifier(samples, s: TableSettings):
    table, listing = verifier_tables(samples)
    return {"verifier": table, "verifier_disagreements": listing} if len(table) else None


register_table(MetricTable("verifier", _verifier, section="Grader check: answers in the asked form, echoes refused, and this "
               "suite's verifier against plain math-verify",
               columns=AUDIT_COLUMNS, listings=("verifier_disagreements",),
               doc="The grader audit: how often this suite's verdict differs from plain math-verify's (and the "
                   "disagreeing samples), the share of responses with no answer in the asked form (format_miss), the "
                   "echoes of the prompt refused (and how many plain math-verify would have paid), and any echo "
                   "accepted (a leak)."))
