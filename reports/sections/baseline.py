"""Per-prompt accuracy of each run minus the baseline's (``report.baseline``, else the base model), with a paired
prompt-bootstrap 95% CI (:func:`reports.data.baseline_differences`)."""
from . import register_section


def _show(ctx, page) -> None:
    from .. import data

    label = ctx.baseline_label()
    if label is None or ctx.shown.empty:
        page.note("No baseline: no base-model run finished and none was given (python -m reports --baseline "
                  "RUN_OR_ALGO).")
        return
    samples = ctx.samples
    if label not in samples:
        bad = [p for p in ctx.sample_problems if p.startswith(f"{label} (run ")]
        page.note(f"Baseline {label!r}: " + (bad[0] if bad else "no samples.parquet among the finished runs."))
        return
    diffs = data.baseline_differences(samples, label, protocols=data.protocols(ctx.shown),
                                   bases=data.base_by_protocol(ctx.runs))
    page.markdown(f"Per-prompt accuracy minus baseline `{label}`" + (
        " (each run against the base model evaluated under its own protocol, column `against`)"
        if "against" in diffs else "") + ":")
    page.table(diffs, "baseline_differences", fmt=".4f")
    for run, base in diffs.attrs.get("refused", {}).items():
        page.note(f"{run} is not compared with {base}: evaluated under another protocol "
                  f"({data.protocol_difference(ctx.runs, run, base)}), and no base model was evaluated under its own.")


register_section("baseline", "Differences against the baseline (paired prompt bootstrap, 95% CI)", order=150,
                 show=_show)
