"""Tables several report sections share (a paper table and the body's section of the same topic): the files of this
folder whose name starts with ``_`` register nothing (the registry's scan skips them)."""
from __future__ import annotations

import pandas as pd

from .. import data


def mean_passk(ctx) -> pd.DataFrame:
    """pass@k (and avg@n) of the mean over benchmarks, rows = runs (the base model first)."""
    p = data.passk_table(ctx.shown)
    return p.xs("mean", level="benchmark") if len(p) and "mean" in p.index.get_level_values("benchmark") else pd.DataFrame()


def by_benchmark(ctx) -> pd.DataFrame:
    """pass@k per benchmark side by side: rows = runs, columns (benchmark, pass@k)."""
    p = data.passk_table(ctx.shown)
    if p.empty:
        return p
    wide = p.unstack("benchmark").swaplevel(axis=1)
    benches = [b for b in dict.fromkeys(p.index.get_level_values("benchmark")) if b != "mean"] + ["mean"]
    return wide.reindex(columns=[c for b in benches for c in wide.columns if c[0] == b])


def with_params(table: pd.DataFrame, runs: pd.DataFrame, keys) -> pd.DataFrame:
    """``table`` (indexed by run label) with the runs' values of the config ``keys`` as leading columns."""
    if table.empty:
        return table
    params = {lab: p for lab, p in zip(runs["label"], runs["params"])}
    lead = pd.DataFrame({k.split(".")[-1]: [params.get(lab, {}).get(k, "") for lab in table.index] for k in keys},
                        index=table.index)
    return pd.concat([lead, table], axis=1)


def train_means(ctx, keys) -> pd.DataFrame:
    """Rows = trained runs, columns = the mean over steps of the training metrics ``keys`` that were logged."""
    summary = data.train_summary({k: v for k, v in ctx.hist().items() if k in keys})
    summary.index.name = "run"
    return summary


def per_step(ctx, key: str) -> pd.DataFrame:
    """Rows = trained runs, columns = steps: the training metric ``key``."""
    series = ctx.hist().get(key, {})
    if not series:
        return pd.DataFrame()
    return pd.DataFrame({lab: pd.Series(v, index=s) for lab, (s, v) in series.items()}).T.rename_axis("run")


def shared_d(ctx) -> pd.DataFrame:
    """ExPPO's Table 2B: disagreement D on the Shared set (prompts where every run compared has two or more correct
    samples) and Delta-D against the baseline, with a paired prompt-bootstrap 95% CI; one block per baseline run
    (:func:`reports.pairing.pair_runs`: an algorithm's run at each level of the other factors, under one protocol),
    holding the runs compared with it and the base model evaluated under the same protocol, each block on its own
    Shared set (column ``against``). Empty without a pair with samples."""
    from core.tasks import get_task, task_names
    from evaluation.metrics.modes import shared_set_disagreement

    from .. import data, pairing

    pairs, _ = pairing.pair_runs(ctx.shown, ctx.baseline_spec())
    samples = ctx.samples
    if not samples:
        return pd.DataFrame()
    benches = {b for df in samples.values() for b in df["benchmark"].unique()}
    same = {b: get_task(b).same_answer for b in benches if b in task_names()}
    protos, bases = data.protocols(ctx.shown), data.base_by_protocol(ctx.shown)
    blocks = []
    for ref in dict.fromkeys(p.against for p in pairs):
        members = [ref, *[p.run for p in pairs if p.against == ref]]
        base = bases.get(protos.get(ref))
        members += [base] if base is not None and base not in members else []
        group = {lab: samples[lab] for lab in members if lab in samples}
        if ref in group and len(group) > 1:
            table = shared_set_disagreement(group, ref, same)
            blocks.append(table.assign(against=ref) if len(table) else table)
    return pd.concat(blocks) if blocks else pd.DataFrame()
