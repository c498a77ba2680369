"""Unbiased pass@k per benchmark and the unweighted mean over benchmarks (the registered ``passk`` table), with the
pass@k curves of the mean against log2 k."""
import numpy as np

from .. import data
from . import register_section


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt

    from .. import render

    passk = data.passk_table(ctx.shown)
    if passk.empty:
        page.note("No pass@k metrics were logged.")
        return
    benches = list(passk.index.get_level_values("benchmark").unique())
    for bench in benches:
        if bench == "mean" and len(benches) == 2:
            continue  # one benchmark: its mean row is the same table
        page.markdown(f"**{bench}**")
        page.table(passk.xs(bench, level="benchmark"), f"passk_{bench}", fmt="best")
    mean = passk.xs("mean", level="benchmark") if "mean" in passk.index.get_level_values("benchmark") else None
    if mean is not None:
        entry = data.table_entry("passk")
        ks = {c: got[1]["k"] for c in mean.columns for got in [entry.parse_column(c)] if got and got[0] == "pass@{k}"}
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for label, row in mean.iterrows():
            ax.plot([np.log2(k) for k in ks.values()], [row[c] for c in ks], marker="o", label=label,
                    color=ctx.color(label))
        ax.set_xlabel("log2 k")
        ax.set_ylabel("pass@k (mean over benchmarks)")
        render.legend(ax)
        page.figure(fig, "passk_curves")


register_section("passk", "pass@k", order=70, show=_show, tables=("passk",),
                 doc="Unbiased pass@k per benchmark and the unweighted mean over benchmarks (best value per column in "
                     "bold); *Initialization* is the starting model under the same protocol.")
