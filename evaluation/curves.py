"""Compute-performance curves: the validation pass rate against training compute, fitted with ScaleRL's sigmoid and
checked against held-out compute (docs/curves.md).

The ScaleRL study (Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute", Eq. 1) models the
expected pass rate on a held-out set after compute C as

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

with R0 the starting pass rate, A the asymptote (the ceiling a recipe reaches with unbounded compute), B > 0 the
scaling exponent and C_mid the compute at which half the gain A - R0 is reached (B and C_mid: the efficiency). The
study fits it after the first stretch of training, which it leaves out as noisy, and finds that a fit on early
compute predicts later compute.

The readings chosen here (RECONSTRUCTED where the paper does not say, as docs/algorithms.md marks them):

- **R0** is measured, not fitted: the validation pass rate at compute 0 (the step-0 policy; the mean over a method's
  seeds). A series without a step-0 point is refused.
- **The first stretch**: points with compute below ``skip`` (default 0.1) times the series' largest compute are
  left out of the fit (ScaleRL leaves out its first ~1.5k of 16k-100k GPU-hours, about a tenth); they are still
  drawn.
- **Fit**: bounded least squares (``scipy.optimize.least_squares``, trust-region reflective) on the mean pass rate of
  each kept point, over A in [0, 1], B in [0.1, 10] and log C_mid within a factor 100 of the kept compute range; one
  fit per run, and per method over all its seeds' points together (pooled).
- **Uncertainty**: a bootstrap over the validation prompts (the same prompt draw at every point, and for every
  method, so differences are paired) and, for a method, over its seeds (resampled with replacement); percentile 95%
  intervals of A, B and C_mid (Efron & Tibshirani 1993). The test (tests/evaluation/test_curves.py) checks coverage
  on synthetic curves with binomial noise.
- **Refusals** (no line is drawn; the reason is said): fewer than ``MIN_POINTS`` kept points (three parameters need
  at least one more point than they have), no step-0 point, or a flat series: the mean of the last third of the
  kept points within three standard errors (prompt-to-prompt) of R0.
- **Extrapolation check**: the same fit on the kept points with at most half the largest compute, its prediction at
  each later point against the measured value (mean and largest absolute error, and the share of later points inside
  the half fit's bootstrap 95% band); "not made" when the first half has too few points.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_POINTS = 4
SKIP = 0.1
B_BOUNDS = (0.1, 10.0)


def sigmoid(compute, A: float, B: float, c_mid: float, r0: float):
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) (ScaleRL Eq. 1); C = 0 gives R0. ``compute``: array (any shape)."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = np.where(c > 0, (c_mid / np.where(c > 0, c, 1.0)) ** B, np.inf)
    return r0 + (A - r0) / (1.0 + ratio)


@dataclass
class Fit:
    """One fitted curve: ``A``, ``B``, ``c_mid`` with their 95% bootstrap intervals (``ci``: {name: (low, high)}),
    ``r0``, the points used (``compute``, ``rate``: the kept points) and those left out as the first stretch
    (``skipped``), the bootstrap replicates (``boot``: (n, 3) array of A, B, C_mid; NaN rows where a replicate was
    refused), and ``extrapolation`` (:func:`extrapolation_check`'s dict) when made. ``reason`` is None for a fit, else
    why none was made (then the parameters are NaN)."""

    A: float = float("nan")
    B: float = float("nan")
    c_mid: float = float("nan")
    r0: float = float("nan")
    ci: dict = field(default_factory=dict)
    compute: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    skipped: int = 0
    boot: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    extrapolation: dict | None = None
    reason: str | None = None

    @property
    def ok(self) -> bool:
        """Whether a fit was made (no refusal)."""
        return self.reason is None

    def predict(self, compute):
        """R(C) at ``compute`` with the fitted parameters."""
        return sigmoid(compute, self.A, self.B, self.c_mid, self.r0)


@dataclass
class Points:
    """The validation series of one method (or run): ``values`` (S, T, P) per-prompt pass rates of S seeds at T
    validation points on the same P prompts, ``compute`` (S, T) the training compute before each point (NaN where a
    seed has no such point; its values are then ignored)."""

    values: np.ndarray
    compute: np.ndarray

    def rates(self, prompts=None, seeds=None) -> tuple[np.ndarray, np.ndarray]:
        """(compute, mean pass rate) of every point of the seeds ``seeds`` (default all) over ``prompts`` (default
        all), flattened over seeds; points with NaN compute dropped."""
        v = self.values if seeds is None else self.values[seeds]
        c = self.compute if seeds is None else self.compute[seeds]
        v = v if prompts is None else v[:, :, prompts]
        rate = np.nanmean(v, axis=2).ravel()
        c = c.ravel()
        ok = ~np.isnan(c) & ~np.isnan(rate)
        return c[ok], rate[ok]


def points_from(series: pd.DataFrame, runs: list) -> Points:
    """:class:`Points` of ``runs`` from a long table with columns ``run``, ``step``, ``compute``, ``prompt_id`` and
    ``value`` (the per-prompt pass rate at that validation); steps are aligned by index across runs and prompts by id
    (those every point has).

    Raises:
        ValueError: no rows for ``runs``.
    """
    df = series[series["run"].isin(runs)]
    if df.empty:
        raise ValueError(f"no validation points for runs {runs}")
    prompts = sorted(set.intersection(*[set(g["prompt_id"]) for _, g in df.groupby(["run", "step"])]))
    steps = sorted(df["step"].unique())
    values = np.full((len(runs), len(steps), len(prompts)), np.nan)
    compute = np.full((len(runs), len(steps)), np.nan)
    pos = {p: i for i, p in enumerate(prompts)}
    for si, run in enumerate(runs):
        for ti, step in enumerate(steps):
            g = df[(df["run"] == run) & (df["step"] == step)]
            if g.empty:
                continue
            g = g[g["prompt_id"].isin(pos)]
            compute[si, ti] = float(g["compute"].iloc[0])
            values[si, ti, [pos[p] for p in g["prompt_id"]]] = g["value"].to_numpy(dtype=float)
    return Points(values, compute)


def _least_squares(c: np.ndarray, y: np.ndarray, r0: float, start=None) -> np.ndarray:
    """(A, B, C_mid) minimising sum (R(c) - y)^2 within the bounds of the module docstring."""
    from scipy.optimize import least_squares

    lo_c, hi_c = np.log(c.min() / 100.0), np.log(c.max() * 100.0)

    def resid(th):
        return sigmoid(c, th[0], th[1], np.exp(th[2]), r0) - y

    def jac(th):
        A, B, lc = th
        z = (np.exp(lc) / c) ** B  # (C_mid / C)^B
        s = 1.0 / (1.0 + z)
        d_a = s
        d_common = -(A - r0) * s * s * z  # d/dz of (A - r0) s, times dz
        d_b = d_common * np.log(np.exp(lc) / c)
        d_lc = d_common * B
        return np.stack([d_a, d_b, d_lc], axis=1)

    if start is None:
        start = (float(np.clip(y.max() + 0.02, 0.0, 1.0)), 1.0, float(np.log(np.median(c))))
    x0 = np.clip(np.array(start, dtype=float), [0.0, B_BOUNDS[0], lo_c], [1.0, B_BOUNDS[1], hi_c])
    res = least_squares(resid, x0, jac=jac, bounds=([0.0, B_BOUNDS[0], lo_c], [1.0, B_BOUNDS[1], hi_c]),
                        method="trf", x_scale="jac")
    A, B, lc = res.x
    return np.array([A, B, np.exp(lc)])


def _kept(c: np.ndarray, skip: float) -> np.ndarray:
    """Mask of the points after the first stretch: compute > 0 and >= skip x the largest compute."""
    return (c > 0) & (c >= skip * c.max())


def _refusal(pts: Points, prompts, seeds, skip: float) -> tuple[str | None, float, np.ndarray, np.ndarray]:
    """(reason or None, R0, kept compute, kept rates) of the series on ``prompts`` and ``seeds``."""
    c, y = pts.rates(prompts, seeds)
    if not (c == 0).any():
        return "no step-0 validation point (R0 is measured there)", float("nan"), c, y
    r0 = float(y[c == 0].mean())
    keep = _kept(c, skip)
    if keep.sum() < MIN_POINTS:
        return (f"too few points: {int(keep.sum())} after the first stretch (compute >= {skip:g} x the largest), "
                f"need at least {MIN_POINTS}"), r0, c[keep], y[keep]
    return None, r0, c[keep], y[keep]


def _flat(pts: Points, c: np.ndarray, y: np.ndarray, r0: float) -> str | None:
    """Why the series is flat (the later third within three standard errors of R0: a flat series passes for a
    rising one in 0.3% of draws), else None."""
    v = pts.values.reshape(-1, pts.values.shape[-1])
    P = v.shape[-1]
    se = float(np.nanmean(np.nanstd(v, axis=1, ddof=1))) / np.sqrt(P) if P > 1 else float("inf")
    order = np.argsort(c)
    last = y[order][-max(1, len(y) // 3):]
    rise = float(last.mean() - r0)
    bound = 3.0 * se * np.sqrt(1.0 + 1.0 / len(last))
    if np.ptp(np.append(y, r0)) == 0:  # every point the same (all 0.0, say): nothing to fit, whatever the noise
        return f"flat: every point is {r0:.4f} (R0 included), no rise to fit"
    if abs(rise) <= bound:  # (a standard error of 0 with no rise is flat too)
        return (f"flat: the last third of the points is {rise:+.4f} from R0 = {r0:.4f}, within three standard errors "
                f"({bound:.4f}; {P} prompts)")
    return None


def fit_curve(pts: Points, n_boot: int = 200, seed: int = 0, skip: float = SKIP, extrapolate: bool = True,
              draws: "Draws | None" = None) -> Fit:
    """The sigmoid fit of one method's (or run's) validation series with bootstrap intervals.

    Args:
        pts: the series (:class:`Points`); n_boot: bootstrap replicates (0: none, no intervals); seed: the
            bootstrap's random seed (or ``draws``: the replicates' prompt and seed draws, shared across methods for
            paired differences); skip: the first stretch (module docstring); extrapolate: also run
            :func:`extrapolation_check`.
    Returns:
        :class:`Fit` (``reason`` set, parameters NaN, when no fit can be made).
    """
    reason, r0, c, y = _refusal(pts, None, None, skip)
    if reason is None:
        reason = _flat(pts, c, y, r0)
    if reason is not None:
        return Fit(r0=r0, compute=c, rate=y, reason=reason)
    theta = _least_squares(c, y, r0)
    all_c, _ = pts.rates()
    fit = Fit(*theta, r0=r0, compute=c, rate=y, skipped=int(((all_c > 0) & ~_kept(all_c, skip)).sum()))
    draws = draws or Draws.of(pts, n_boot, seed)
    boot = np.full((draws.n, 3), np.nan)
    for i in range(draws.n):
        _, r0_b, cb, yb = _refusal(pts, draws.prompts[i], draws.seeds_for(i, pts), skip)
        if len(cb) >= MIN_POINTS and np.isfinite(r0_b):
            boot[i] = _least_squares(cb, yb, r0_b, start=(theta[0], theta[1], np.log(theta[2])))
    fit.boot = boot
    if draws.n:
        ok = boot[~np.isnan(boot).any(axis=1)]
        fit.ci = {name: tuple(np.quantile(ok[:, j], [0.025, 0.975])) for j, name in enumerate(("A", "B", "c_mid"))}
    if extrapolate:
        fit.extrapolation = extrapolation_check(pts, draws, skip)
    return fit


@dataclass
class Draws:
    """Bootstrap draws: ``prompts`` (n, P) prompt indices and ``seed_draw`` (n, S_max) seed indices in [0, 1) scaled
    to each series' seed count (so methods with different seed counts share one draw)."""

    prompts: np.ndarray
    seed_draw: np.ndarray

    @property
    def n(self) -> int:
        return int(self.prompts.shape[0])

    @classmethod
    def of(cls, pts: Points, n_boot: int, seed: int, max_seeds: int | None = None) -> "Draws":
        """``n_boot`` draws for ``pts``' P prompts (with replacement) and up to ``max_seeds`` seeds (default: its S),
        from ``numpy.random.default_rng(seed)``."""
        rng = np.random.default_rng(seed)
        P = pts.values.shape[-1]
        S = max_seeds or pts.values.shape[0]
        return cls(rng.integers(0, P, size=(n_boot, P)), rng.random(size=(n_boot, S)))

    def seeds_for(self, i: int, pts: Points) -> np.ndarray:
        """Replicate ``i``'s seed indices for a series of S seeds: (S,) ints in [0, S), with replacement."""
        S = pts.values.shape[0]
        return np.minimum((self.seed_draw[i, :S] * S).astype(int), S - 1)


def extrapolation_check(pts: Points, draws: "Draws", skip: float = SKIP) -> dict:
    """Fit on the kept points with compute <= half the largest, predict the later points.

    Returns:
        {"made": bool, "reason" (when not made), "points_fitted", "points_predicted", "mae", "max_error" (absolute
        pass-rate errors of the prediction at the later points), "in_band" (share of later points inside the half
        fit's bootstrap 95% band)}.
    """
    c_all, y_all = pts.rates()
    if not (c_all == 0).any():
        return {"made": False, "reason": "no step-0 point"}
    r0 = float(y_all[c_all == 0].mean())
    half = c_all.max() / 2.0
    keep = _kept(c_all, skip)
    early, late = keep & (c_all <= half), keep & (c_all > half)
    if early.sum() < MIN_POINTS or not late.any():
        return {"made": False, "reason": f"{int(early.sum())} points in the first half of the compute (need "
                                         f"{MIN_POINTS}) and {int(late.sum())} after it"}
    theta = _least_squares(c_all[early], y_all[early], r0)
    pred = sigmoid(c_all[late], theta[0], theta[1], theta[2], r0)
    band = []
    for i in range(draws.n):
        cb, yb = pts.rates(draws.prompts[i], draws.seeds_for(i, pts))
        if not (cb == 0).any():
            continue
        r0_b = float(yb[cb == 0].mean())
        e = _kept(cb, skip) & (cb <= half)
        if e.sum() >= MIN_POINTS:
            tb = _least_squares(cb[e], yb[e], r0_b, start=(theta[0], theta[1], np.log(theta[2])))
            band.append(sigmoid(c_all[late], tb[0], tb[1], tb[2], r0_b))
    inside = float("nan")
    if band:
        lo, hi = np.quantile(np.array(band), [0.025, 0.975], axis=0)
        inside = float(((y_all[late] >= lo) & (y_all[late] <= hi)).mean())
    err = np.abs(pred - y_all[late])
    return {"made": True, "points_fitted": int(early.sum()), "points_predicted": int(late.sum()),
            "mae": float(err.mean()), "max_error": float(err.max()), "in_band": inside}


def compare_fits(fits: dict, baseline) -> pd.DataFrame:
    """Each method's fitted parameters against its reference's, from their bootstrap replicates (drawn with the same
    :class:`Draws`, so prompts are paired): the difference in A (the ceiling), in B and in log10 C_mid (the
    efficiency) with percentile 95% intervals, and whether each interval excludes 0.

    Args:
        fits: {method: :class:`Fit`}.
        baseline: the reference method of every other method, or {method: its reference method} (the report's
            pairing rule, reports/pairing.py: a baseline algorithm matched within each level of the sweep's other
            factors and never across evaluation protocols).
    Returns:
        index method; columns ``against``, ``dA``, ``dA_low``, ``dA_high``, ``ceiling_differs``, ``dB`` ...,
        ``dlog10_cmid`` ..., ``efficiency_differs`` (B's or C_mid's interval excludes 0). Methods without a fit, or
        whose reference has none, are left out.
    """
    against = baseline if isinstance(baseline, dict) else {m: baseline for m in fits if m != baseline}
    rows = {}
    for m, ref in against.items():
        f, base = fits.get(m), fits.get(ref)
        if f is None or base is None or m == ref or not base.ok:
            continue
        if not f.ok or len(f.boot) != len(base.boot) or not len(f.boot):
            continue
        d = np.column_stack([f.boot[:, 0] - base.boot[:, 0], f.boot[:, 1] - base.boot[:, 1],
                             np.log10(f.boot[:, 2]) - np.log10(base.boot[:, 2])])
        d = d[~np.isnan(d).any(axis=1)]
        point = [f.A - base.A, f.B - base.B, np.log10(f.c_mid) - np.log10(base.c_mid)]
        row = {"against": ref}
        for j, name in enumerate(("dA", "dB", "dlog10_cmid")):
            lo, hi = np.quantile(d[:, j], [0.025, 0.975])
            row.update({name: point[j], f"{name}_low": lo, f"{name}_high": hi})
        row["ceiling_differs"] = bool(row["dA_low"] > 0 or row["dA_high"] < 0)
        row["efficiency_differs"] = bool(row["dB_low"] > 0 or row["dB_high"] < 0 or row["dlog10_cmid_low"] > 0
                                         or row["dlog10_cmid_high"] < 0)
        rows[m] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def fit_table(fits: dict) -> pd.DataFrame:
    """The fits as a table: per method A, B, C_mid with intervals, R0, points kept and left out, the extrapolation
    check's errors, or the reason no fit was made."""
    rows = {}
    for m, f in fits.items():
        ex = f.extrapolation or {}
        rows[m] = {"R0": f.r0, "A": f.A, "A_low": f.ci.get("A", (np.nan,) * 2)[0], "A_high": f.ci.get("A", (np.nan,) * 2)[1],
                   "B": f.B, "B_low": f.ci.get("B", (np.nan,) * 2)[0], "B_high": f.ci.get("B", (np.nan,) * 2)[1],
                   "C_mid": f.c_mid, "C_mid_low": f.ci.get("c_mid", (np.nan,) * 2)[0],
                   "C_mid_high": f.ci.get("c_mid", (np.nan,) * 2)[1], "points": len(f.compute), "first_stretch": f.skipped,
                   "extrapolation_mae": ex.get("mae", np.nan), "extrapolation_max_error": ex.get("max_error", np.nan),
                   "extrapolation_in_band": ex.get("in_band", np.nan),
                   "note": f.reason or ("" if ex.get("made") else f"extrapolation check not made: {ex.get('reason')}")}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def fit_methods(series: pd.DataFrame, methods: dict, n_boot: int = 200, seed: int = 0, skip: float = SKIP) -> dict:
    """{method: :class:`Fit`} for ``methods`` ({method: [runs]}) from the long validation table (:func:`points_from`),
    every method's bootstrap drawn with the same prompt and seed draws (paired)."""
    pts = {m: points_from(series, runs) for m, runs in methods.items()}
    if not pts:
        return {}
    P = {p.values.shape[-1] for p in pts.values()}
    S = max(p.values.shape[0] for p in pts.values())
    shared = Draws.of(next(iter(pts.values())), n_boot, seed, max_seeds=S) if len(P) == 1 else None
    return {m: fit_curve(p, n_boot, seed, skip, draws=shared) for m, p in pts.items()}


def validation_series(frames: dict) -> pd.DataFrame:
    """The long table :func:`points_from` reads, from each run's ``validation.parquet`` ({run label: samples with
    ``step`` and ``compute_flops`` columns}): one row per (run, step, prompt) with its pass rate over the samples
    (``value``), ``compute`` and the evaluation ``seed`` the samples were drawn with."""
    rows = []
    for run, df in frames.items():
        per = df.groupby(["step", "benchmark", "prompt_id"], sort=True).agg(
            value=("correct", "mean"), compute=("compute_flops", "first"), seed=("seed", "first")).reset_index()
        rows.append(per.assign(run=run, prompt_id=per["benchmark"].astype(str) + "/" + per["prompt_id"].astype(str)))
    if not rows:
        return pd.DataFrame(columns=["run", "step", "prompt_id", "value", "compute", "seed"])
    return pd.concat(rows, ignore_index=True)[["run", "step", "prompt_id", "value", "compute", "seed"]]


def write_manifest(path, files: dict, methods: dict, baseline, n_boot: int = 200, seed: int = 0,
                   skip: float = SKIP):
    """Write the curve manifest ``python -m evaluation.recompute --curves`` reads: each run's ``validation.parquet``
    (relative to the manifest), the methods ({method: [runs]}), the baseline and the bootstrap's settings."""
    import json
    import os
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = {lab: os.path.relpath(Path(f).resolve(), path.parent.resolve()) for lab, f in files.items()}
    path.write_text(json.dumps({"validation": rel, "methods": methods, "baseline": baseline, "n_boot": int(n_boot),
                                "seed": int(seed), "skip": float(skip)}, indent=1))
    return path


def curve_tables(frames: dict, methods: dict, baseline, n_boot: int = 200, seed: int = 0,
                 skip: float = SKIP) -> dict:
    """Everything the report's curve section shows, from the runs' validation samples: ``points`` (per run and step:
    compute, pass@1 and its per-prompt standard error), ``fits`` (:func:`fit_table`: one row per method, its seeds
    pooled), ``run_fits`` (one row per run of the methods with several seeds; empty otherwise), ``differences``
    (:func:`compare_fits` against ``baseline``, a method or {method: its reference}; empty without one or without
    two fits) and the :class:`Fit` objects
    (``_fits``)."""
    series = validation_series(frames)
    pts = series.groupby(["run", "step"], sort=True).agg(compute=("compute", "first"), pass_at_1=("value", "mean"),
                                                        se=("value", lambda v: v.std(ddof=1) / np.sqrt(len(v))),
                                                        prompts=("value", "size"))
    fits = fit_methods(series, methods, n_boot, seed, skip)
    runs = {run: [run] for labels in methods.values() if len(labels) > 1 for run in labels}
    run_fits = fit_table(fit_methods(series, runs, n_boot, seed, skip)) if runs else pd.DataFrame()
    diffs = compare_fits(fits, baseline) if isinstance(baseline, dict) or baseline in fits else pd.DataFrame()
    return {"points": pts, "fits": fit_table(fits), "run_fits": run_fits.rename_axis("run"), "differences": diffs,
            "_fits": fits}
