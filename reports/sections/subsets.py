"""Accuracy per subset of a benchmark (the registered ``subsets`` table; Knights-and-Knaves puzzles by the number of
people, TR-GRPO's Table 1), with the accuracy curve over subsets."""
import re

from .. import data
from . import register_section


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    subsets = data.subset_table(ctx.shown)
    if subsets.empty:
        page.note("No per-subset metrics were logged (only K&K puzzles have subsets).")
        return
    page.table(subsets, "subsets", fmt="best")
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    xs = [int(re.findall(r"\d+", c)[0]) if re.findall(r"\d+", c) else i for i, c in enumerate(subsets.columns)]
    for label, row in subsets.iterrows():
        ax.plot(xs, row.to_numpy(dtype=float), marker="o", label=label, color=ctx.color(label))
    ax.set_xlabel("people per puzzle" if all("people" in c for c in subsets.columns) else "subset")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    render.legend(ax)
    page.figure(fig, "subset_accuracy")


register_section("subsets", "Subsets", order=170, show=_show, tables=("subsets",))
