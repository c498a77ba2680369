"""Training curves: one panel per per-step training metric (:func:`reports.data.train_panels`: the update's, each
algorithm's declared panels, the training-inference mismatch), one line per run, and their means over steps."""
import numpy as np

from .. import data
from . import register_section


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    hist = ctx.history(data.train_panels())
    if not hist:
        page.note("No per-step training metrics were logged.")
        return
    keys = [k for k in data.train_panels() if k in hist]
    cols = min(3, len(keys))
    rows_ = int(np.ceil(len(keys) / cols))
    fig, axes = plt.subplots(rows_, cols, figsize=(4.6 * cols, 3.2 * rows_), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for label, (steps, values) in hist[key].items():
            ax.plot(steps, values, marker="o", ms=3, label=label, color=ctx.color(label))
        ax.set_title(key.removeprefix("train/"))
        ax.set_xlabel("step")
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    render.legend(axes.flat[0], fig=fig if len(keys) > 1 else None)
    page.figure(fig, "training_curves")
    page.table(data.train_summary(hist), "training_summary", fmt=".4g")


register_section("training_curves", "Training curves", order=40, show=_show)
