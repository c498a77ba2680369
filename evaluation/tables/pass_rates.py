"""The ``passk`` table: unbiased pass@k, avg@n and maj@k per benchmark; per-prompt values for paired bootstraps."""
from __future__ import annotations

import pandas as pd

from ..metrics.majority import majority_table
from ..metrics.passk import pass_at_k, passk_table
from ..metrics.table_registry import MetricTable, TableSettings, register_table


def per_prompt_values(samples: pd.DataFrame, metric: str = "accuracy") -> pd.Series:
    """Per-prompt accuracy (or ``pass@k``) indexed by (benchmark, prompt_id), for paired bootstraps."""
    per = samples.groupby(["benchmark", "prompt_id"])["correct"].agg(n="size", c="sum")
    if metric == "accuracy":
        return per["c"] / per["n"]
    if metric.startswith("pass@"):
        k = int(metric.split("@")[1])
        return pd.Series(pass_at_k(per["n"].to_numpy(), per["c"].to_numpy(), k), index=per.index)
    raise ValueError(f"metric={metric!r}: expected 'accuracy' or 'pass@<k>'")


def _passk(samples, s: TableSettings) -> pd.DataFrame:
    table = passk_table(samples, list(s.ks)).rename(columns={"avg@n": f"avg@{s.n}"})
    if len(table):
        maj = majority_table(samples, list(s.ks), s.same_answer)
        maj.loc["mean"] = maj.mean(axis=0)
        table = table.join(maj)
    table.index.name = "benchmark"
    return table


register_table(MetricTable("passk", _passk, section="pass@k", columns=("pass@{k}", "avg@{n}", "maj@{k}"),
               summary=("pass@1",),
               doc="Unbiased pass@k (k in eval.ks), avg@n (mean accuracy over the n samples) and maj@k (majority vote "
                   "over k samples, exact over the k-subsets; evaluation.metrics.majority) per benchmark."))
