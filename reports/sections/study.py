"""A study over seeds (docs/study.md): each method's mean over seeds and prompts against the baseline method with a
paired prompt-bootstrap CI pooled over seeds, the prompts that would resolve it, each method's pass@k against the
base model's at every k (Yue et al. 2025: do the curves cross), and the KL to the reference and the mismatch over
training (mean over seeds, band min to max). Files under ``study/`` let ``python -m evaluation.recompute --study``
recompute every number."""
from pathlib import Path

import numpy as np
import pandas as pd

from .. import data, load
from ..seed_groups import seed_band, study_baseline, study_methods
from . import register_section

_UCC = {"similarity_metric": "rouge_l", "threshold": 0.7}
_TRAIN_KEYS = ("train/kl_ref", "train/mismatch_kl", "train/entropy", "train/reward_mean")


def _show(ctx, page) -> None:
    import evaluation.study as study_tables

    samples = ctx.samples
    methods = study_methods(ctx.done, samples)
    study_base = study_baseline(methods, ctx.done, ctx.baseline)
    if not methods:
        page.note("No method was trained with two or more seeds (add seed=0,1 to the sweep): no study comparison.")
        return
    if study_base is None:
        page.note(f"No baseline method among {sorted(methods)} (report.baseline={ctx.baseline!r}): no study comparison.")
        return
    methods, left_out = _one_protocol(ctx, methods, study_base)
    if left_out:
        page.note(f"Runs evaluated under another protocol than {study_base}'s are left out of the study (a pair is "
                  f"never formed across protocols): {', '.join(left_out)}.")
    out = Path(ctx.work_dir) / "study"
    out.mkdir(parents=True, exist_ok=True)
    ks = [int(c.split("@")[1]) for c in data.passk_table(ctx.shown).columns if c.startswith("pass@") and c.split("@")[1].isdigit()]
    proto = data.protocols(ctx.shown).get(methods[study_base][0])
    base_lab = data.base_by_protocol(ctx.runs).get(proto, load.base_label(ctx.runs)) if proto else load.base_label(ctx.runs)
    base_lab = base_lab if base_lab in samples else None
    files = {lab: Path(ctx.work_dir) / "samples" / rid / "samples.parquet"
             for lab, rid in zip(ctx.shown["label"], ctx.shown["run_id"])
             if lab in samples and (lab == base_lab or any(lab in v for v in methods.values()))}
    study_tables.write_manifest(out / "runs.json", files, methods, study_base, base_lab, ks, **_UCC)
    study = study_tables.study_tables(samples, methods, study_base, base_lab, ks, **_UCC)
    for name, table in study.items():
        table.to_csv(out / f"{name}.csv")
    comp = study["comparisons"]
    shown_cmp = study_tables.formatted(comp, study_base)
    page.markdown(f"**Against `{study_base}`** ({int(comp['n_prompts'].iloc[0])} prompts; entropy in nats per token):")
    page.table(shown_cmp, "study_comparisons")
    if "family" in comp:
        page.note(f"Holm: Holm-Bonferroni over the table's {int(comp['family'].iloc[0])} comparisons (the family: every "
                  f"method x metric against {study_base}), family-wise error 5%; 'resolved' is each CI alone.")
    if study["base_curves"].empty:
        page.note("No base-model run with samples: no comparison with the base model.")
    else:
        _base_curves(ctx, page, study_tables, study, methods)
    _training(ctx, page, methods, out)


def _one_protocol(ctx, methods: dict, baseline: str) -> tuple[dict, list]:
    """(methods with only the runs evaluated under the baseline method's protocol, the labels left out)."""
    protocols = data.protocols(ctx.shown)
    mine = protocols.get(methods[baseline][0])
    kept, left = {}, []
    for m, labels in methods.items():
        ok = [lab for lab in labels if mine is None or protocols.get(lab) in (None, mine)]
        left += [lab for lab in labels if lab not in ok]
        if ok:
            kept[m] = ok
    return kept, left


def _base_curves(ctx, page, study_tables, study, methods) -> None:
    import matplotlib.pyplot as plt

    from .. import render

    curves = study["base_curves"]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    meths = list(dict.fromkeys(curves.index.get_level_values("method")))
    for i, m in enumerate(meths):
        g = curves.xs(m, level="method").sort_index()
        x = np.log2(g.index.to_numpy(dtype=float)) + (i - (len(meths) - 1) / 2) * 0.06
        ax.errorbar(x, g["diff"], yerr=np.clip([g["diff"] - g["ci_low"], g["ci_high"] - g["diff"]], 0, None), marker="o",
                    ms=4, capsize=2, label=m, color=ctx.color(methods[m][0]))
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_xlabel("log2 k")
    ax.set_ylabel("pass@k minus the base model's")
    render.legend(ax)
    page.figure(fig, "study_base_crossing")
    page.markdown("Each method's pass@k minus the base model's (paired prompt-bootstrap 95% CI over prompts "
                  "and seeds); below 0 at large k means the curves cross (Yue et al. 2025):")
    page.table(study["crossings"], "study_crossings")
    page.markdown("pass@k (difference from the base model [95% CI]; * resolved after Holm-Bonferroni over the "
                  "table's methods x k):")
    page.table(study_tables.formatted_curves(curves), "study_base_curves")


def _training(ctx, page, methods, out: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    hist = ctx.history(data.train_panels())
    kl_keys = [k for k in _TRAIN_KEYS if k in hist]
    if not kl_keys:
        return
    fig, axs = plt.subplots(1, len(kl_keys), figsize=(4.2 * len(kl_keys), 3.2), squeeze=False)
    rows_kl = {}
    for ax, key in zip(axs[0], kl_keys):
        for m, (st, mean_, lo, hi) in seed_band(hist, methods, key).items():
            c = ctx.color(methods[m][0])
            ax.plot(st, mean_, marker="o", ms=3, label=m, color=c)
            ax.fill_between(st, lo, hi, color=c, alpha=0.15)
            rows_kl.setdefault(m, {})[f"{key.removeprefix('train/')} first"] = mean_[0]
            rows_kl[m][f"{key.removeprefix('train/')} last"] = mean_[-1]
        ax.set_title(key.removeprefix("train/"))
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fullest = max(axs[0], key=lambda a: len(a.get_lines()))  # the panel every method logged (GSPO has no KL term)
    render.legend(fullest, fig=fig)
    page.figure(fig, "study_training")
    kl_table = pd.DataFrame.from_dict(rows_kl, orient="index").rename_axis("method (mean over seeds)")
    kl_table.to_csv(out / "training.csv")
    page.table(kl_table, "study_training", fmt=".4g")


register_section(
    "study", "Study: methods over seeds against the baseline and the base model", order=160, show=_show,
    doc="For sweeps that train each method with several seeds (`experiment=cpu_study`, docs/study.md): each method's "
        "mean over seeds and prompts, its difference from the baseline method with a paired prompt-bootstrap 95% CI "
        "pooled over the seeds (prompts resampled together, each method's seeds on their own), whether the CI excludes "
        "0 and whether it still does after Holm-Bonferroni over the table's comparisons, and the prompts that would resolve the difference at 80% power with the same seeds (from the prompt part of "
        "the spread); then each method's pass@k against the base model's at every k (does the curve cross it, Yue et "
        "al. 2025), and the KL to the reference and the training-inference mismatch over training (mean over seeds, "
        "band: min to max). Every number here is recomputed from the samples by "
        "`python -m evaluation.recompute --study <report folder>/study/runs.json`.")
