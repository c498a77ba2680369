"""The ``tools`` table: exact match, tool calls per episode and episodes without an answer, per benchmark."""
from __future__ import annotations

import pandas as pd

from ..metrics.table_registry import MetricTable, register_table
from .frames import with_mean


def tool_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark whose samples called tools (a ``tool_calls`` count): exact match (the share of correct samples),
    tool calls per episode, and the share of episodes that ended without an answer; with an unweighted ``mean`` row.
    Empty when no sample carries a tool-call count. Source: TR-GRPO's Table 3 (EM), Search-R1."""
    if "tool_calls" not in samples or samples["tool_calls"].isna().all():
        return pd.DataFrame()
    df = samples[samples["tool_calls"].notna()]
    rows = {b: {"exact_match": float(g["correct"].mean()), "tool_calls": float(g["tool_calls"].astype(float).mean()),
                "no_answer_share": float(g["extracted_answer"].isna().mean())} for b, g in df.groupby("benchmark")}
    return with_mean(pd.DataFrame(rows).T)


register_table(MetricTable("tools", lambda samples, s: tool_table(samples).pipe(lambda t: t if len(t) else None),
               section="Tool use", columns=("exact_match", "tool_calls", "no_answer_share"),
               doc="Exact match, tool calls per episode and the share of episodes without an answer."))
