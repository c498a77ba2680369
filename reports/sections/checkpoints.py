"""Evaluation over training: pass@k at the largest k against the training step for runs evaluated at every kept
checkpoint, from the base model at step 0 (ExPPO's Fig. 1, coverage): the paper table and the body's figure."""
import pandas as pd

from .. import data, load
from . import register_section


def _trajectories(ctx) -> tuple[str | None, dict]:
    key = data.largest_k_key(ctx.shown)
    return key, (load.eval_trajectories(ctx.tracking_uri, ctx.runs, key) if key else {})


def _table(ctx) -> pd.DataFrame:
    _key, traj = _trajectories(ctx)
    if not traj:
        return pd.DataFrame()
    return pd.DataFrame({lab: pd.Series(v, index=s) for lab, (s, v) in traj.items()}).T.rename_axis("run")


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    key, traj = _trajectories(ctx)
    if not traj:
        page.note("No run was evaluated at intermediate checkpoints (train.save_every=N eval.checkpoints=all).")
        return
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, (steps, values) in traj.items():
        ax.plot(steps, values, marker="o", label=label, color=ctx.color(label))
    ax.set_xlabel("training step")
    ax.set_ylabel(data.find_table(key).column + " (mean over benchmarks)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    render.legend(ax)
    page.figure(fig, "checkpoint_trajectory")
    traj_table = pd.DataFrame({lab: pd.Series(v, index=st) for lab, (st, v) in traj.items()}).rename_axis("step")
    page.table(traj_table, "checkpoint_trajectory", fmt=".4f")


register_section(
    "exppo_coverage", "ExPPO Fig. 1: coverage (pass@k at the largest k) over checkpoints",
    needs="train.save_every=N eval.checkpoints=all", build=_table, show=_show, order=140,
    heading="Evaluation over training (checkpoints)",
    doc="pass@k at the largest k against the training step, for runs evaluated at every kept checkpoint "
        "(`train.save_every=N eval.checkpoints=all`), starting from the base model at step 0 (ExPPO's Fig. 1).")
