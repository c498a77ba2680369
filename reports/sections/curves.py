"""Compute-performance curves (docs/curves.md): each run's validation pass@1 along training against the training
compute spent (``train.validate_every``), ScaleRL's sigmoid fitted per method (pooled over its seeds) with its
bootstrap band, the parameters with 95% intervals, the extrapolation check, and each method's ceiling and
efficiency against the baseline's. Files under ``curves/`` let ``python -m evaluation.recompute --curves`` rebuild
every number."""
from pathlib import Path

import numpy as np
import pandas as pd

from .. import load, pairing
from ..seed_groups import eval_seed_note, seed_group
from . import register_section


def _methods(runs, labels) -> dict:
    methods: dict = {}
    for lab in runs["label"] if len(runs) else []:
        if lab in labels:
            methods.setdefault(seed_group(lab), []).append(lab)
    return methods


def _show(ctx, page) -> None:
    import evaluation.curves as curves

    runs = load.finished_or_training(ctx.runs)  # during a sweep: the curves so far (validated in the loop, live)
    if not len(runs) or not ctx.work_dir:
        page.note("No trained runs.")
        return
    files = load.download_validation(ctx.tracking_uri, runs, Path(ctx.work_dir) / "validation")
    if not files:
        page.note("No run validated along training (set train.validate_every=N with data.validation_prompts=M).")
        return
    frames = {lab: pd.read_parquet(f) for lab, f in files.items()}
    going = sorted(set(runs.loc[runs["status"] == "RUNNING", "label"]) & set(frames))
    if going:
        page.note(f"Still training, drawn up to their latest validation point: {', '.join(going)}.")
    methods = _methods(runs, frames)
    against, refused = pairing.method_pairs(runs, methods, ctx.baseline)  # the report's one pairing rule
    out = Path(ctx.work_dir) / "curves"
    curves.write_manifest(out / "runs.json", files, methods, against)
    tables = curves.curve_tables(frames, methods, against)
    for name in ("points", "fits", "run_fits", "differences"):
        tables[name].to_csv(out / f"{name}.csv")
    seeds = eval_seed_note(runs[runs["label"].isin(list(frames))])
    for line in ([seeds] if seeds else []) + [f"{m}'s curve is not compared with {ctx.baseline}: {why}."
                                              for m, why in refused.items()]:
        page.note(line)
    _figure(ctx, page, tables, methods)
    fits = tables["fits"]
    shown = pd.DataFrame({
        "R0": fits["R0"].map("{:.4f}".format),
        "A (ceiling) [95% CI]": [_ci(r, "A", "{:.3f}") for _, r in fits.iterrows()],
        "B [95% CI]": [_ci(r, "B", "{:.2f}") for _, r in fits.iterrows()],
        "C_mid (FLOPs) [95% CI]": [_ci(r, "C_mid", "{:.3g}") for _, r in fits.iterrows()],
        "points (first stretch left out)": [f"{int(r['points'])} ({int(r['first_stretch'])})" for _, r in fits.iterrows()],
        "extrapolation: mean / max error, in band": [_extrapolation(r) for _, r in fits.iterrows()],
        "note": fits["note"]}, index=fits.index)
    page.markdown("ScaleRL's sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) per method (its seeds pooled; "
                  "prompt and seed bootstrap 95% intervals; the extrapolation check fits the first half of the compute "
                  "and predicts the second):")
    page.table(shown, "curve_fits")
    if len(tables["run_fits"]):
        runs = tables["run_fits"]
        page.markdown("Each run on its own (its seed's points only):")
        page.table(pd.DataFrame({"A [95% CI]": [_ci(r, "A", "{:.3f}") for _, r in runs.iterrows()],
                                 "B [95% CI]": [_ci(r, "B", "{:.2f}") for _, r in runs.iterrows()],
                                 "C_mid (FLOPs) [95% CI]": [_ci(r, "C_mid", "{:.3g}") for _, r in runs.iterrows()],
                                 "note": runs["note"]}, index=runs.index), "curve_run_fits")
    diffs = tables["differences"]
    if len(diffs):
        page.markdown(f"Against `{ctx.baseline}` (column `against`: the method each was compared with, at its own "
                      "level of the sweep's other factors; paired over the validation prompts; 95% intervals):")
        page.table(pd.DataFrame({
            "against": diffs["against"],
            "ceiling A": [f"{r['dA']:+.3f} [{r['dA_low']:+.3f}, {r['dA_high']:+.3f}]" for _, r in diffs.iterrows()],
            "exponent B": [f"{r['dB']:+.2f} [{r['dB_low']:+.2f}, {r['dB_high']:+.2f}]" for _, r in diffs.iterrows()],
            "log10 C_mid": [f"{r['dlog10_cmid']:+.2f} [{r['dlog10_cmid_low']:+.2f}, {r['dlog10_cmid_high']:+.2f}]"
                            for _, r in diffs.iterrows()],
            "ceiling differs": diffs["ceiling_differs"].map({True: "yes", False: "no"}),
            "efficiency differs": diffs["efficiency_differs"].map({True: "yes", False: "no"})}, index=diffs.index),
            "curve_differences")


def _ci(r, name: str, fmt: str) -> str:
    if not np.isfinite(r[name]):
        return "-"
    lo, hi = r[f"{name}_low"], r[f"{name}_high"]
    return fmt.format(r[name]) + (f" [{fmt.format(lo)}, {fmt.format(hi)}]" if np.isfinite(lo) else "")


def _extrapolation(r) -> str:
    if not np.isfinite(r["extrapolation_mae"]):
        return "-"
    band = "" if not np.isfinite(r["extrapolation_in_band"]) else f", {r['extrapolation_in_band']:.0%}"
    return f"{r['extrapolation_mae']:.3f} / {r['extrapolation_max_error']:.3f}{band}"


def _figure(ctx, page, tables, methods) -> None:
    import matplotlib.pyplot as plt

    from .. import render

    pts = tables["points"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, labels in methods.items():
        color = ctx.color(labels[0])
        for lab in labels:
            if lab not in pts.index.get_level_values("run"):
                continue
            p = pts.xs(lab, level="run")
            ax.errorbar(p["compute"], p["pass_at_1"], yerr=p["se"], marker="o", ms=3, lw=0, elinewidth=0.8,
                        color=color, label=lab)
        fit = tables["_fits"].get(method)
        if fit is not None and fit.ok:
            grid = np.linspace(0.0, float(np.nanmax(pts["compute"])) * 1.05, 200)
            ax.plot(grid, fit.predict(grid), color=color, lw=1.5, label=f"{method}: fit")
            boot = fit.boot[~np.isnan(fit.boot).any(axis=1)]
            if len(boot):
                from evaluation.curves import sigmoid

                band = np.array([sigmoid(grid, a, b, c, fit.r0) for a, b, c in boot])
                lo, hi = np.quantile(band, [0.025, 0.975], axis=0)
                ax.fill_between(grid, lo, hi, color=color, alpha=0.15)
    ax.set_xlabel("training compute (estimated FLOPs)")
    ax.set_ylabel("validation pass@1")
    render.legend(ax)
    page.figure(fig, "compute_curves")


register_section(
    "curves", "Compute-performance curves (validation along training)", order=165, show=_show,
    doc="For runs with `train.validate_every` (docs/curves.md): each run's validation pass@1 against the training "
        "compute spent before it (points with their prompt standard error), ScaleRL's sigmoid fitted per method with "
        "its bootstrap band (none drawn where the fit is refused: too few points, a flat series), the parameters with "
        "95% intervals, the extrapolation check (fit on the first half of the compute, error on the second), and each "
        "method's ceiling and efficiency against the baseline's. Every number is rebuilt by "
        "`python -m evaluation.recompute --curves <report folder>/curves/runs.json`.")
