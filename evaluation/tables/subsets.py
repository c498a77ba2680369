"""The ``subsets`` table: accuracy and pass@k per subset of a benchmark (K&K: people per puzzle)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..metrics.passk import pass_at_k
from ..metrics.table_registry import MetricTable, register_table


def subset_table(samples: pd.DataFrame, ks) -> pd.DataFrame:
    """Accuracy and pass@k per subset of a benchmark (e.g. K&K puzzles by number of people), for
    samples whose rows carry a ``subset``; indexed ``<benchmark>/<subset>``, sorted. Empty when none do."""
    if "subset" not in samples.columns:
        return pd.DataFrame()
    df = samples.dropna(subset=["subset"])
    if df.empty:
        return pd.DataFrame()
    rows = {}
    for (bench, subset), grp in df.groupby(["benchmark", "subset"], sort=True):
        per = grp.groupby("prompt_id")["correct"].agg(n="size", c="sum")
        n_min = int(per["n"].min())
        rows[f"{bench}/{subset}"] = {
            "n_prompts": float(len(per)), "accuracy": float((per["c"] / per["n"]).mean()),
            **{f"pass@{k}": float(np.mean(pass_at_k(per["n"].to_numpy(), per["c"].to_numpy(), k))) for k in ks if k <= n_min},
        }
    table = pd.DataFrame(rows).T
    table.index.name = "benchmark/subset"
    return table


register_table(MetricTable("subsets", lambda samples, s: subset_table(samples, list(s.ks)).pipe(lambda t: t if len(t) else None),
               section="Accuracy by subset (K&K: by number of people)", columns=("n_prompts", "accuracy", "pass@{k}"),
               rows="{benchmark}/{subset}", doc="Accuracy and pass@k per subset of a benchmark (K&K: people per puzzle)."))
