"""A plug-in report section: the example of docs/extending.md. One module, one :func:`register_section` call; a sweep
imports it with ``plugins=[tests.plugins.toy_section]``, and then the report shows, after the built-in sections
(``order``), the section's heading, its table and its figure, exported under ``paper/``; ``report.sections`` may name
it (it builds a table), so it is also shown among the paper's tables. No other file changes."""
import pandas as pd

from reports.sections import register_section


def reward_range(ctx) -> pd.DataFrame:
    """Rows = the finished trained runs, columns ``first``, ``last`` and ``range`` (max - min) of the per-step mean
    reward ``train/reward_mean`` over training; empty without a trained run that logged it."""
    hist = ctx.history(["train/reward_mean"]).get("train/reward_mean", {})
    rows = {label: {"first": float(v[0]), "last": float(v[-1]), "range": float(v.max() - v.min())}
            for label, (_steps, v) in hist.items() if len(v)}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("run")


def range_bars(ctx, table: pd.DataFrame):
    """One bar per run: its reward range, in the run's colour."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(range(len(table)), table["range"], color=[ctx.color(label) for label in table.index])
    ax.set_xticks(range(len(table)), table.index, rotation=30)
    ax.set_xlabel("run")
    ax.set_ylabel("reward range over training")
    return fig


register_section("toy_reward_range", "Reward range over training (a plug-in section)", build=reward_range,
                 figure=range_bars, order=500, needs="a trained run that logs train/reward_mean",
                 doc="The first, last and spread (max - min) of each run's mean reward per step.")
