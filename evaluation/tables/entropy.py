"""The ``entropy`` table: mean token entropy per benchmark, over all samples, the correct ones and the wrong ones."""
from __future__ import annotations

import pandas as pd

from ..metrics.table_registry import MetricTable, register_table
from .frames import with_mean


def entropy_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Mean token entropy (nats) per benchmark: over all samples, correct ones and wrong ones."""
    df = samples.dropna(subset=["mean_token_entropy"])
    if df.empty:
        return pd.DataFrame()
    rows = {}
    for bench, grp in df.groupby("benchmark"):
        rows[bench] = {"entropy": grp["mean_token_entropy"].mean(),
                       "entropy_correct": grp.loc[grp["correct"], "mean_token_entropy"].mean(),
                       "entropy_wrong": grp.loc[~grp["correct"], "mean_token_entropy"].mean()}
    return with_mean(pd.DataFrame(rows).T)


register_table(MetricTable("entropy", lambda samples, s: entropy_table(samples), section="Entropy",
               columns=("entropy", "entropy_correct", "entropy_wrong"),
               doc="Mean token entropy (nats): all samples, correct ones, wrong ones."))
