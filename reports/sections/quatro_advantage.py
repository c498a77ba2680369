"""QUATRO's advantage against the number of correct answers in a group (its Fig. 2), from the closed form for each
delta and group size of the sweep's QUATRO runs (:func:`reports.data.quatro_advantage_curves`): the paper table and
the body's figure."""
from .. import data
from . import register_section


def _table(ctx):
    c = data.quatro_advantage_curves(ctx.done)
    return c.set_index(["delta", "G", "correct"]) if len(c) else c


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    adv_curves = data.quatro_advantage_curves(ctx.done)
    if adv_curves.empty:
        page.note("No QUATRO run in this sweep.")
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, ((delta, G), grp) in enumerate(adv_curves.groupby(["delta", "G"])):
        c = plt.get_cmap("tab10")(i)
        ax.plot(grp["correct"], grp["A_correct"], marker="o", color=c, label=f"delta={delta:g}, correct")
        ax.plot(grp["correct"], grp["A_wrong"], marker="s", ls="--", color=c, label=f"delta={delta:g}, wrong")
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_xlabel(f"correct answers in the group (G = {int(adv_curves['G'].iloc[0])})")
    ax.set_ylabel("advantage")
    ax.set_ylim(max(-5.0, float(adv_curves["A_wrong"].min()) * 1.1), None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    render.legend(ax)
    page.figure(fig, "quatro_advantage")
    page.table(adv_curves.set_index(["delta", "G", "correct"]), "quatro_advantage", fmt=".4f")


register_section(
    "quatro_advantage", "QUATRO Fig. 2: advantages against the number of correct answers", needs="algo=quatro",
    build=_table, show=_show, order=60, heading="QUATRO's advantage against the number of correct answers",
    doc="For each delta of the sweep's QUATRO runs, the advantage of a correct and of a wrong answer in a group of G "
        "with 0/1 rewards (closed form from the dual; the QUATRO paper's Fig. 2). Larger delta, larger |A|; at "
        "delta >= log(G/(G-1)) a group with G-1 correct answers floors lambda and its wrong answer's advantage explodes.")
