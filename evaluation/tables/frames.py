"""What the tables share: the samples grouped by prompt, and a table's unweighted ``mean`` row over its benchmarks."""
from __future__ import annotations

import pandas as pd


def with_mean(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``mean`` row (the unweighted mean of each numeric column over its rows, when it has any) and
    its index named ``benchmark``."""
    if len(table):
        table = table.copy()
        table.loc["mean"] = table.mean(axis=0, numeric_only=True)
    table.index.name = "benchmark"
    return table


def by_prompt(samples: pd.DataFrame):
    """``(benchmark, prompt_id, rows)`` for each prompt of ``samples``, sorted, its rows in ``sample_idx`` order."""
    for (bench, pid), grp in samples.sort_values("sample_idx").groupby(["benchmark", "prompt_id"], sort=True):
        yield bench, pid, grp
