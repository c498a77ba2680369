"""Per-prompt accuracy of each run minus the baseline's (``report.baseline``, else the base model), with a paired
prompt-bootstrap 95% CI and Holm's correction over the table's comparisons; who is compared with whom is
:func:`reports.pairing.pair_runs`' rule (an algorithm's runs per level of the other factors, never across evaluation
protocols)."""
from . import register_section


def _show(ctx, page) -> None:
    from .. import pairing

    spec = ctx.baseline_spec()
    if spec is None or ctx.shown.empty:
        page.note("No baseline: no base-model run finished and none was given (python -m reports --baseline "
                  "RUN_OR_ALGO).")
        return
    pairs, refused = pairing.pair_runs(ctx.shown, spec)
    samples = ctx.samples
    diffs = pairing.differences(samples, pairs)
    if diffs.empty:
        missing = sorted({p.against for p in pairs} - set(samples))
        bad = [p for p in ctx.sample_problems if any(p.startswith(f"{m} (run ") for m in missing)]
        page.note(f"Baseline {spec!r}: " + (bad[0] if bad else "no pair of runs with samples on both sides."))
    else:
        page.markdown(f"Per-prompt accuracy minus baseline `{spec}` (column `against`: the run each was compared "
                      "with; `level`: the other factors' values it shares):")
        page.table(diffs, "baseline_differences", fmt=".4f")
        note = pairing.holm_note(diffs, "p_holm")
        if note:
            page.note(note)
    for run, why in refused.items():
        page.note(f"{run} is not compared with {spec}: {why}.")


register_section("baseline", "Differences against the baseline (paired prompt bootstrap, 95% CI)", order=150,
                 show=_show)
