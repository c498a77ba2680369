"""Asynchronous staleness (``train.rollout.staleness``, issue 58): what each algorithm reaches as its rollouts come
from a policy k steps older, with and without a rollout correction. The QUATRO paper argues robustness to staleness
from inner-loop updates (its Fig. 1 and 4, the section ``quatro_staleness``); this section draws the same reading
with true asynchronous staleness, as verl's async trainers, AReaL and prime-rl train: final reward and pass@1 against
k per algorithm and correction, with 95% confidence intervals over training seeds (Student's t on the seeds' values;
none with one seed), and the clip fraction and the trust-region KL (``ppo_kl``, mean over steps) against k."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from . import register_section

K_KEY, CORRECTION_KEY = "train.rollout.staleness", "train.rollout.correction"
_STEP_MEANS = {"clip_fraction": "train/clip_fraction", "ppo_kl": "train/ppo_kl", "staleness": "train/staleness_mean"}
_FIGURE = (("final_reward", "final reward"), ("pass@1", "pass@1 (mean over benchmarks)"),
           ("clip_fraction", "clip fraction (mean over steps)"), ("ppo_kl", "trust-region KL (mean over steps)"))


def ci95(values) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval) of the seeds' ``values``; half-width NaN with fewer than two."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if not len(v):
        return float("nan"), float("nan")
    if len(v) < 2:
        return float(v.mean()), float("nan")
    from scipy import stats

    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def _per_run(ctx) -> pd.DataFrame:
    """One row per trained run: algorithm, correction, k, seed and the measures of the figure."""
    from .. import data

    runs = ctx.done
    if runs.empty or not any(K_KEY in p for p in runs["params"]):
        return pd.DataFrame()
    hist = ctx.history(tuple(_STEP_MEANS.values()))
    passk = data.passk_table(runs)
    pass1 = {}
    if len(passk) and "pass@1" in passk.columns and "mean" in passk.index.get_level_values("benchmark"):
        pass1 = passk.xs("mean", level="benchmark")["pass@1"].to_dict()
    rows = []
    for _, r in runs.iterrows():
        p, lab = r["params"], r["label"]
        row = {"algorithm": r["algo"], "correction": str(p.get(CORRECTION_KEY, "none")),
               "k": int(float(p.get(K_KEY, 0) or 0)), "seed": p.get("seed", ""),
               "final_reward": r["metrics"].get("train/reward_mean", np.nan), "pass@1": pass1.get(lab, np.nan)}
        for name, key in _STEP_MEANS.items():
            steps_values = (hist.get(key) or {}).get(lab)
            row[name] = float(np.mean(steps_values[1])) if steps_values and len(steps_values[1]) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def _table(ctx) -> pd.DataFrame:
    """Rows (algorithm, correction, k); per measure its mean over seeds and the 95% CI's half-width (``±``)."""
    per = _per_run(ctx)
    if per.empty or per["k"].nunique() < 2:
        return pd.DataFrame()
    out = {}
    for key, g in per.groupby(["algorithm", "correction", "k"], sort=True):
        rec = {"seeds": len(g)}
        for name in ("final_reward", "pass@1", "clip_fraction", "ppo_kl", "staleness"):
            mean, half = ci95(g[name])
            rec[name], rec[f"{name} ±"] = mean, half
        out[key] = rec
    df = pd.DataFrame.from_dict(out, orient="index")
    df.index = pd.MultiIndex.from_tuples(df.index, names=["algorithm", "correction", "k"])
    return df


def _figure(ctx, table: pd.DataFrame):
    import matplotlib.pyplot as plt

    if table.empty:
        return None
    fig, axs = plt.subplots(1, len(_FIGURE), figsize=(3.4 * len(_FIGURE), 2.8), squeeze=False)
    lines = table.reset_index()
    for (algo, corr), g in lines.groupby(["algorithm", "correction"], sort=True):
        g = g.sort_values("k")
        for ax, (name, title) in zip(axs[0], _FIGURE):
            ax.errorbar(g["k"], g[name], yerr=g[f"{name} ±"].fillna(0), marker="o", capsize=3,
                        ls="-" if corr == "none" else "--", label=f"{algo} ({corr})")
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("staleness k (steps)")
    axs[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


register_section(
    "async_staleness", "Asynchronous staleness: final reward, pass@1, clip fraction and trust-region KL against k "
    "(mean and 95% CI over seeds)", needs=K_KEY, build=_table, figure=_figure, order=55,
    heading="Staleness k (asynchronous rollouts): the QUATRO paper's staleness reading, true off-policy",
    doc="Runs that vary `train.rollout.staleness` (any sweep that does: experiment=quatro_async_staleness and its CPU "
        "twin name it among their paper tables; a sweep without a preset shows it here): per "
        "algorithm and correction, final reward and pass@1 against k with 95% t-intervals over training seeds, "
        "and the clip fraction and trust-region KL (`ppo_kl`) against k, beside QUATRO's inner-epoch staleness.")
