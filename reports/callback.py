"""The report step of a sweep's end: :class:`orchestrator.callbacks.SweepCallback` calls :func:`sweep_report` by the
dotted name the config tree gives it (``hydra.callbacks.sweep.report``). A failure is reported, never raised."""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("rlvr")


def sweep_report(config, parent_run_id: str | None) -> Path | None:
    """Build the sweep's report (:func:`reports.build.build` with ``report.baseline`` and ``report.out_dir``) of the
    sweep's own runs, nested under the sweep's parent run ``parent_run_id``, when ``report.enabled``: by default in
    ``reports_out/<experiment>/<sweep folder name>``, linked from ``reports_out/<experiment>/latest``. Returns the path of ``report.html``, or
    None when disabled or when building failed (logged with the command that rebuilds it; the sweep's results are
    already safe in MLflow)."""
    rep = config.get("report", {}) or {}
    if not rep.get("enabled", True):
        return None
    try:
        from .build import ReportOptions, build

        res = build(str(config.experiment_name), str(config.tracking.uri), rep.get("baseline"), rep.get("out_dir"),
                    parent_run_id=parent_run_id, options=ReportOptions(sections=list(rep.get("sections") or [])))
        log.info("report: %s", res["html"])
        return Path(res["html"])
    except Exception as e:
        log.error("the sweep finished but its report could not be built: %s: %s "
                  "(rebuild with: python -m reports --experiment %s --sweep %s)", type(e).__name__, e,
                  config.experiment_name, _sweep_name(config))
        return None


def _sweep_name(config) -> str:
    try:
        return Path(str(config.hydra.sweep.dir)).name
    except Exception:  # noqa: BLE001 -- no Hydra config here: the hint names a placeholder
        return "SWEEP_FOLDER"


def check_report_config(config) -> None:
    """Pre-flight check of a sweep point's ``report`` keys (sweep.py runs it on every point before any work):
    every name in ``report.sections`` is a registered report section with a table (:mod:`reports.sections`: the paper
    tables, and a plug-in's sections once ``plugins`` imported them).

    Raises:
        ValueError: one line naming the unknown names and the known ones.
    """
    from .sections import paper_names

    names = [str(s) for s in ((config.get("report", {}) or {}).get("sections") or [])]
    known = paper_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"report.sections: {bad} {'is not a' if len(bad) == 1 else 'are not'} paper section"
                         f"{'' if len(bad) == 1 else 's'} (reports/sections/ has: {', '.join(known)})")


def check_report_baseline(configs, overrides=()) -> list[str]:
    """Pre-flight check of ``report.baseline`` over a sweep's points (sweep.py runs it once the points are composed):
    it names the base model's row (``Initialization``), an algorithm of the sweep, or a run label the report will
    show (:func:`reports.data.short_labels`: the algorithm plus the swept values that tell its runs apart). An
    algorithm that this sweep does not run is refused when the command line (``overrides``) sets it, and a warning
    when a preset set it (a preset's baseline in a sweep narrowed to other algorithms, ``experiment=trgrpo_kk
    algo=tr_grpo``): the report then compares against the base model.

    Returns:
        Warnings.
    Raises:
        ValueError: one line naming the value (neither a name of this sweep nor an algorithm, or an algorithm the
            sweep does not run given on the command line) and the names it could be.
    """
    import pandas as pd

    from orchestrator.checks.preflight import CONFIG_DIR
    from orchestrator.checks.schema import leaves

    from .data import short_labels
    from .load import BASE_LABEL

    wanted = {str(b) for c in configs if (b := (c.get("report", {}) or {}).get("baseline")) not in (None, "")}
    if not wanted:
        return []
    rows = [{"run_id": str(i), "label": "", "algo": str(c.algo.name), "kind": "trained",
             "params": {k: str(v) for k, v in leaves(c).items()}} for i, c in enumerate(configs)]
    labels = list(short_labels(pd.DataFrame(rows))["label"])
    known = list(dict.fromkeys([BASE_LABEL, *(r["algo"] for r in rows), *labels]))
    algorithms = {p.stem for p in (CONFIG_DIR / "algo").glob("*.yaml")} | {str(c.algo.name) for c in configs}
    warnings = []
    typed = any(o.split("=", 1)[0].lstrip("+~") == "report.baseline" for o in overrides)
    for b in sorted(wanted):
        if b in known:
            continue
        if b in algorithms and typed:
            raise ValueError(f"report.baseline={b!r}: this sweep runs no {b} (its names: {', '.join(known)}); add "
                             f"{b} to algo=..., name one of these, or drop report.baseline to compare with the base "
                             "model")
        if b in algorithms:
            warnings.append(f"report.baseline={b!r}: this sweep runs no {b}; its report compares against the base "
                            "model instead")
            continue
        raise ValueError(f"report.baseline={b!r}: not a run of this sweep (its names: {', '.join(known)})")
    return warnings
