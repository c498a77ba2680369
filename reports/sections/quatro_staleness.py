"""QUATRO's staleness study (its Fig. 1 and 4): clip fraction, entropy and reward by the number of inner epochs and
the learning rate; the paper table (means over steps) and the body's figure (a column per number of inner epochs,
a colour per learning rate, a line style per algorithm)."""
from .. import data
from . import _tables, register_section

_PANELS = ("train/clip_fraction", "train/entropy", "train/reward_mean")


def _table(ctx):
    t = _tables.train_means(ctx, ["train/clip_fraction", "train/entropy", "train/reward_mean", "train/seq_ratio_mean"])
    return _tables.with_params(t, ctx.runs, ["train.ppo_epochs", "train.lr"]).sort_values(["ppo_epochs", "lr"]) if len(t) else t


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt

    from .. import render

    hist = ctx.history(data.train_panels())
    axes_ = data.staleness_axes(ctx.done)
    if axes_ is None or not hist:
        page.note("The sweep does not vary train.ppo_epochs (experiment=quatro_staleness and its CPU twin do).")
        return
    epochs, lrs = axes_
    panels = [k for k in _PANELS if k in hist]
    cmap = plt.get_cmap("viridis")
    lr_color = {lr: cmap(i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}
    styles = dict(zip(sorted(set(ctx.done["algo"])), ["-", "--", ":", "-."]))
    fig, axs = plt.subplots(len(panels), len(epochs), figsize=(3.2 * len(epochs), 2.5 * len(panels)), squeeze=False,
                            sharex=True)
    for _, r in ctx.done.iterrows():
        e, lr = int(r["params"].get("train.ppo_epochs", 0)), float(r["params"].get("train.lr", 0))
        if e not in epochs:
            continue
        for row, key in enumerate(panels):
            if r["label"] in hist[key]:
                steps, values = hist[key][r["label"]]
                axs[row, epochs.index(e)].plot(steps, values, color=lr_color.get(lr), ls=styles.get(r["algo"], "-"),
                                               label=f"{r['algo']} lr={lr:g}")
    for col, e in enumerate(epochs):
        axs[0, col].set_title(f"{e} inner epoch(s)")
        axs[-1, col].set_xlabel("step")
    for row, key in enumerate(panels):
        axs[row, 0].set_ylabel(key.removeprefix("train/"))
    by_label = {}
    for ax in axs[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            by_label.setdefault(lab, h)
    if by_label:
        render.legend(axs[0, -1], list(by_label.values()), list(by_label.keys()), fig=fig)
    page.figure(fig, "staleness")


register_section(
    "quatro_staleness", "QUATRO Fig. 1 and 4: clip fraction, entropy and reward by inner epochs and learning rate "
    "(means over steps)", needs="train.ppo_epochs", build=_table, show=_show, order=50,
    heading="QUATRO Fig. 1 and 4: staleness (inner epochs x learning rate)",
    doc="The QUATRO paper's Fig. 1 and 4: rows clip fraction, entropy and reward; one column per number of inner "
        "epochs; colour by learning rate, line style by algorithm.")
