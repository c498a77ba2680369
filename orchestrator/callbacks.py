"""Hydra callbacks of the sweep: create the MLflow store before jobs start; print a summary at the end."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from hydra.experimental.callback import Callback

from . import tracking, window

log = logging.getLogger("rlvr")

FAILED_POINTS: list[str] = []  # read by sweep.py to set the exit status
FAILED_BASE: list[str] = []  # failed base-model evaluations of the sweep: exit status 1 too
EXPECTED_POINTS: int | None = None  # the number of points pre-flight composed (set by sweep.py)
OUTCOMES: dict[str, dict] = {}  # job number -> outcome of the points run in this process
OUTCOME_FILE = "rlvr_outcome.json"
PARENT_RUN_ID: str | None = None  # the sweep's parent MLflow run (orchestrator.window), made by on_multirun_start
PARENT_CLOSED = False
REPORT_HTML: Path | None = None  # set by the report callback (it runs first at the end: Hydra reverses the order)


def record_outcome(outcome: dict) -> None:
    """Remember how this job's point ended (``status``: finished, duplicate, failed, killed; ``error``; ``run_id``),
    in this process and in ``<job output dir>/rlvr_outcome.json`` (read back when jobs run elsewhere:
    submitit, SLURM). Never raises: a full disk must not hide the point's own error."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        num, point, out_dir = str(hc.job.get("num")), hc.job.override_dirname or "", Path(hc.runtime.output_dir)
    except Exception:
        return
    rec = {"job_num": num, "point": point, **{k: outcome.get(k) for k in ("status", "error", "run_id", "duplicate_of")}}
    OUTCOMES[num] = rec
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / OUTCOME_FILE).write_text(json.dumps(rec))
    except OSError as e:
        log.error("could not record the outcome of point %s in %s: %s", point, out_dir, e)


def read_outcomes(sweep_dir: Path) -> dict[str, dict]:
    """Outcomes of every job of the sweep: the ones written to the job folders, then this process's own."""
    out = {}
    for f in sorted(Path(sweep_dir).glob(f"*/{OUTCOME_FILE}")):
        try:
            rec = json.loads(f.read_text())
            out[str(rec["job_num"])] = rec
        except (OSError, ValueError, KeyError):
            continue
    return out | OUTCOMES


class SweepSummaryCallback(Callback):
    """``on_multirun_start``: create the store and experiment once (parallel jobs creating an SQLite
    schema at the same time can race). ``on_multirun_end``: print a table of the sweep's points
    (point, status, MLflow run id, SLURM job id, wall time) and remember failures."""

    def on_multirun_start(self, config, **kwargs) -> None:
        global PARENT_RUN_ID, PARENT_CLOSED
        exp_id = tracking.retry(tracking.setup_experiment, str(config.tracking.uri), str(config.experiment_name),
                                str(config.tracking.artifact_root))
        from .run import _git_commit

        try:
            PARENT_RUN_ID, PARENT_CLOSED = window.open_sweep_run(exp_id, str(config.hydra.sweep.dir), _git_commit()), False
        except Exception as e:  # the points still run; they are then top-level runs
            log.warning("could not create the sweep's parent run: %s: %s", type(e).__name__, e)

    def on_multirun_end(self, config, **kwargs) -> None:
        from mlflow.tracking import MlflowClient

        sweep_id = str(config.hydra.sweep.dir)
        outcomes = read_outcomes(Path(sweep_id))
        runs, store_error = [], None
        try:
            exp_id = tracking.setup_experiment(str(config.tracking.uri), str(config.experiment_name), str(config.tracking.artifact_root))
            runs = MlflowClient().search_runs([exp_id], filter_string=f"tags.`rlvr.sweep_id` = '{sweep_id}'",
                                              order_by=["attributes.start_time ASC"], max_results=5000)
        except Exception as e:
            store_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            log.error("could not read the sweep's runs back from MLflow: %s", store_error)
        runs = [r for r in runs if r.data.tags.get(tracking.TAG_KIND) != window.SWEEP_KIND]
        rows, failed_base, seen_jobs, summary = [], [], set(), []
        for r in runs:
            kind = r.data.tags.get(tracking.TAG_KIND, "?")
            status = "DUPLICATE" if kind == "duplicate" else r.info.status
            active = r.data.tags.get("rlvr.active_s")
            wall = float(active) if active else (
                ((r.info.end_time or r.info.start_time) - r.info.start_time) / 1000 if r.info.start_time else 0.0)
            point = "base model (Initialization)" if kind == "base" else (r.info.run_name or "")
            job = r.data.tags.get("rlvr.job_num", "?")
            if kind != "base":
                seen_jobs.add(job)
            note = (outcomes.get(job) or {}).get("error") or "" if status not in ("FINISHED", "DUPLICATE") else ""
            rows.append((job, point, status, r.info.run_id, r.data.tags.get("rlvr.slurm_job_id", "") or "-",
                         f"{wall:.1f}", note[:120]))
            summary.append({"job": job, "point": point, "status": status, "run_id": r.info.run_id, "wall_s": round(wall, 1),
                            "error": note[:300], **window.headline(r.data.metrics, config.eval.get("n"))})
            if status in ("FAILED", "KILLED") and kind == "base":
                failed_base.append(r.info.run_name or r.info.run_id)
        # a point that did not end FINISHED or DUPLICATE, by its own word or because it left nothing behind
        finished_jobs = {str(r.data.tags.get("rlvr.job_num")) for r in runs if r.data.tags.get(tracking.TAG_KIND) != "base"
                         and (r.info.status == "FINISHED" or r.data.tags.get(tracking.TAG_KIND) == "duplicate")}
        bad = {}
        for job, rec in outcomes.items():
            if rec.get("status") not in ("finished", "duplicate"):
                bad[job] = rec
        for r in runs:
            job = str(r.data.tags.get("rlvr.job_num"))
            if r.data.tags.get(tracking.TAG_KIND) != "base" and r.info.status in ("FAILED", "KILLED", "RUNNING") \
                    and job not in finished_jobs:
                bad.setdefault(job, {"job_num": job, "point": r.info.run_name, "status": r.info.status.lower()})
        expected = EXPECTED_POINTS or 0
        for i in range(expected):
            if str(i) not in outcomes and str(i) not in finished_jobs and str(i) not in bad:
                bad[str(i)] = {"job_num": str(i), "point": "?", "status": "no outcome",
                               "error": store_error or "the job ended without recording an outcome (see its log)"}
        for job, rec in sorted(bad.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 1 << 30):
            if job not in seen_jobs:
                rows.append((job, rec.get("point") or "?", str(rec.get("status", "?")).upper(), rec.get("run_id") or "-",
                             "-", "-", str(rec.get("error") or "")[:120]))
                summary.append({"job": job, "point": rec.get("point") or "?", "status": str(rec.get("status", "?")).upper(),
                                "run_id": rec.get("run_id"), "error": str(rec.get("error") or "")[:300]})
        FAILED_POINTS.extend(f"{rec.get('point') or job}: {rec.get('error') or rec.get('status')}" for job, rec in bad.items())
        header = ("#", "point", "status", "MLflow run", "job id", "wall s", "error")
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        print("\nSweep summary (" + sweep_id + ")\n" + "\n".join(lines), flush=True)
        if store_error is None:
            print(window.ui_hint(str(config.tracking.uri), exp_id), flush=True)
        if FAILED_POINTS:
            print(f"{len(bad)} point(s) did not finish; tracebacks of failed runs are in MLflow (traceback.txt). "
                  "Re-running the same command trains only the points that did not finish.", flush=True)
        close_parent(summary, out_dir=Path(sweep_id), children=runs)
        if failed_base:
            print("The base model's evaluation failed (traceback.txt in its MLflow run); the trained points have no "
                  "flip rates. Re-running the same command evaluates it again.", flush=True)
            FAILED_BASE.extend(failed_base)


def close_parent(summary: list[dict], status: str | None = None, out_dir: Path | None = None, children=()) -> None:
    """End the sweep's parent run once (:func:`orchestrator.window.close_sweep_run`), with the report when one was
    built and the union of its ``children``'s datasets; never raises."""
    global PARENT_CLOSED
    if PARENT_RUN_ID is None or PARENT_CLOSED:
        return
    PARENT_CLOSED = True
    try:
        window.log_union_of_datasets(PARENT_RUN_ID, children)
    except Exception as e:
        log.warning("the sweep's parent run %s: datasets not logged: %s: %s", PARENT_RUN_ID, type(e).__name__, e)
    try:
        final = window.close_sweep_run(PARENT_RUN_ID, summary, status, REPORT_HTML, out_dir)
        log.info("sweep run %s: %s", PARENT_RUN_ID, final)
    except Exception as e:
        log.error("could not close the sweep's parent run %s: %s: %s", PARENT_RUN_ID, type(e).__name__, e)
