"""The ``kinds`` table: pass@k and avg@n averaged over the benchmarks of each task kind."""
from __future__ import annotations

import pandas as pd

from ..metrics.table_registry import MetricTable, register_table


def kind_table(passk: pd.DataFrame, kinds: dict) -> pd.DataFrame:
    """pass@k and avg@n by task kind (math, multiple_choice, code, logic): the unweighted mean over the
    benchmarks of each kind, with their count. ``passk`` is the per-benchmark table (its ``mean`` row ignored)."""
    rows = {}
    per = passk.drop(index="mean", errors="ignore")
    for kind in sorted(set(kinds.values())):
        benches = [b for b in per.index if kinds.get(b) == kind]
        if benches:
            rows[kind] = {"benchmarks": float(len(benches)), **per.loc[benches].mean(numeric_only=True).to_dict()}
    table = pd.DataFrame(rows).T
    table.index.name = "kind"
    return table


register_table(MetricTable("kinds", lambda samples, s: kind_table(s.tables["passk"], s.kinds) if s.kinds else None,
               section="By task kind", columns=("benchmarks", "pass@{k}", "avg@{n}", "maj@{k}"), rows="kind/{kind}",
               per_group=False, doc="pass@k, avg@n and maj@k averaged over the benchmarks of each task kind (unweighted)."))
