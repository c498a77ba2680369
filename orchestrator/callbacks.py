"""The end of a sweep, owned by one Hydra callback object: the MLflow store and the sweep's parent run before the
jobs start; at the end, the summary of every point, the report, the parent run closed with both, and the exit status.

Nothing passes between the jobs, the callback and ``sweep.py`` through module state: a job writes its outcome to
``<job folder>/rlvr_outcome.json`` (:func:`record_outcome`), the callback reads those files back (they also come back
from SLURM nodes) and writes the sweep's own outcome to ``<sweep folder>/rlvr_sweep.json`` (:func:`read_sweep`), which
``sweep.py`` reads for the exit status, or to close the parent run when the sweep stopped before its end (the
callback puts the sweep folder's path in the process environment, ``RLVR_SWEEP_DIR``, since Hydra keeps no sweep-level
config once the sweep returns).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hydra.experimental.callback import Callback

from core import tags
from orchestrator.point.identity import point_name
from orchestrator.store import mlflow_views, tracking

log = logging.getLogger("rlvr")

OUTCOME_FILE = "rlvr_outcome.json"
SWEEP_FILE = "rlvr_sweep.json"
SWEEP_DIR_ENV = "RLVR_SWEEP_DIR"  # where this process's sweep folder is (set when the sweep starts; read by sweep.py)


def record_outcome(outcome: dict) -> None:
    """Write how this job's point ended (``status``: finished, duplicate, failed, killed; ``error``; ``run_id``) to
    ``<job output dir>/rlvr_outcome.json``, which the sweep's callback reads back wherever the job ran (this process,
    submitit, SLURM). Never raises: a full disk must not hide the point's own error (a job without an outcome file
    counts as not finished)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        num, point, out_dir = str(hc.job.get("num")), point_name(hc.job.override_dirname), Path(hc.runtime.output_dir)
    except Exception:
        return
    rec = {"job_num": num, "point": point, **{k: outcome.get(k) for k in ("status", "error", "run_id", "duplicate_of")}}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / OUTCOME_FILE).write_text(json.dumps(rec))
    except OSError as e:
        log.error("could not record the outcome of point %s in %s: %s", point, out_dir, e)


def read_outcomes(sweep_dir: Path) -> dict[str, dict]:
    """Outcomes of every job of the sweep, by job number, from the files the jobs wrote to their folders."""
    out = {}
    for f in sorted(Path(sweep_dir).glob(f"*/{OUTCOME_FILE}")):
        try:
            rec = json.loads(f.read_text())
            out[str(rec["job_num"])] = rec
        except (OSError, ValueError, KeyError):
            continue
    return out


class SweepCallback(Callback):
    """The sweep's beginning and end, as one object that owns its state.

    ``on_multirun_start``: create the store and experiment once (parallel jobs creating an SQLite schema at the same
    time can race), open the sweep's parent run and keep its lease's heartbeat fresh while the sweep runs (a later run
    of the sweep ends a parent whose heartbeat went stale: :func:`orchestrator.point.act.end_dead_sweeps`), count the
    points, write ``rlvr_sweep.json``. ``on_multirun_end``:
    print a table of the sweep's points (point, status, MLflow run id, SLURM job id, wall time, error), build the
    report (``report``: the dotted name of a function ``(config, parent_run_id) -> report.html path or None`` that
    never raises; the config tree names ``reports.build.sweep_report``, so this layer does not import the reports
    layer), close the parent run with the summary and the report, and write the outcome to ``rlvr_sweep.json``.

    Args:
        report: dotted name of the report function, or None for no report.
    """

    def __init__(self, report: str | None = None):
        self.report = report
        self.parent_run_id: str | None = None
        self.expected_points: int | None = None
        self.heartbeat = None  # the parent run's lease, kept fresh while the sweep runs (orchestrator.store.lease)

    def __getstate__(self) -> dict:
        # the heartbeat's thread stays in the sweep's process: submitit pickles the callbacks with its jobs
        return self.__dict__ | {"heartbeat": None}

    def on_multirun_start(self, config, **kwargs) -> None:
        from orchestrator.checks.preflight import count_points
        from orchestrator.point.identity import git_commit

        sweep_id = str(config.hydra.sweep.dir)  # as the jobs see it (rlvr.sweep_id): they find the parent run by it
        sweep_dir = Path(sweep_id)
        os.environ[SWEEP_DIR_ENV] = str(sweep_dir.resolve())  # Hydra keeps no sweep-level config once the sweep returns
        store = tracking.Store.of(config)
        exp_id = store.open(config.tracking.uri, config.experiment_name, config.tracking.artifact_root)
        try:
            self.expected_points = count_points(list(config.hydra.overrides.task),
                                                dict(config.hydra.sweeper.get("params") or {}))
        except Exception as e:  # pre-flight parsed them already; without the count, missing jobs go unnoticed
            log.warning("could not count the sweep's points: %s: %s", type(e).__name__, e)
        try:
            self.parent_run_id = mlflow_views.open_sweep_run(exp_id, sweep_id, git_commit(), store=store)
        except Exception as e:  # the points still run; they are then top-level runs
            log.warning("could not create the sweep's parent run: %s: %s", type(e).__name__, e)
        if self.parent_run_id is not None:  # a later run of the sweep tells a live parent from a dead one by it
            from orchestrator.store.lease import Heartbeat

            self.heartbeat = Heartbeat(store, self.parent_run_id)
            self.heartbeat.start()
        write_sweep(sweep_dir, {"status": "running", "parent_run_id": self.parent_run_id,
                                "expected_points": self.expected_points, "outage_s": store.wait_s})

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        bad, failed_base, summary, runs = self.summarise(config)
        report_html = None
        if self.report:
            from hydra.utils import get_method

            try:
                report_html = get_method(self.report)(config, self.parent_run_id)
            except Exception as e:  # the report function reports its own failures; this is a wrong name
                log.error("the report could not be built: %s: %s", type(e).__name__, e)
        status = close_parent(self.parent_run_id, summary, out_dir=sweep_dir, children=runs, report_html=report_html,
                              store=tracking.Store.of(config))
        if self.heartbeat is not None:  # alive until its parent run is closed (the report takes a while)
            self.heartbeat.stop.set()
            self.heartbeat = None
        failed = [f"{rec.get('point') or job}: {rec.get('error') or rec.get('status')}" for job, rec in bad.items()]
        write_sweep(sweep_dir, {"status": status or "ended", "parent_run_id": self.parent_run_id,
                                "expected_points": self.expected_points, "failed_points": failed,
                                "failed_base": failed_base, "report": str(report_html) if report_html else None})

    def summarise(self, config) -> tuple[dict, list, list[dict], list]:
        """Print the sweep's summary table. Returns ``(bad, failed_base, summary, runs)``: the points that did not
        finish by job number (their outcome records), the failed base-model runs, one summary row per run and
        per point that left no run, and the sweep's MLflow runs."""
        sweep_id = str(config.hydra.sweep.dir)
        outcomes = read_outcomes(Path(sweep_id))
        runs, store_error, exp_id = _sweep_runs(config, sweep_id)
        rows, failed_base, seen_jobs, summary = _run_rows(runs, outcomes, config)
        bad = _unfinished(runs, outcomes, self.expected_points or 0, store_error)
        for job, rec in sorted(bad.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 1 << 30):
            if job not in seen_jobs:
                rows.append((job, rec.get("point") or "?", str(rec.get("status", "?")).upper(), rec.get("run_id") or "-",
                             "-", "-", str(rec.get("error") or "")[:120]))
                summary.append({"job": job, "point": rec.get("point") or "?", "status": str(rec.get("status", "?")).upper(),
                                "run_id": rec.get("run_id"), "error": str(rec.get("error") or "")[:300]})
        header = ("#", "point", "status", "MLflow run", "job id", "wall s", "error")
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in [header, *rows]]
        print("\nSweep summary (" + sweep_id + ")\n" + "\n".join(lines), flush=True)
        if store_error is None:
            print(mlflow_views.ui_hint(str(config.tracking.uri), exp_id), flush=True)
        print(disk_line(Path(sweep_id)), flush=True)
        if bad:
            print(f"{len(bad)} point(s) did not finish; tracebacks of failed runs are in MLflow (traceback.txt). "
                  "Re-running the same command trains only the points that did not finish.", flush=True)
        if failed_base:
            print("The base model's evaluation failed (traceback.txt in its MLflow run); the trained points have no "
                  "flip rates. Re-running the same command evaluates it again.", flush=True)
        return bad, failed_base, summary, runs


def _sweep_runs(config, sweep_id: str) -> tuple[list, str | None, str | None]:
    """The sweep's runs read back from its MLflow experiment (the sweep's own parent run left out). Returns
    ``(runs, store_error, experiment id)``: a store that cannot be read is logged and named in ``store_error`` (one
    line), with no runs, so that the summary is still printed."""
    runs, store_error, exp_id = [], None, None
    try:
        store = tracking.Store.of(config)
        exp_id = tracking.setup_experiment(str(config.tracking.uri), str(config.experiment_name),
                                           str(config.tracking.artifact_root))
        runs = store.search(exp_id, f"tags.`rlvr.sweep_id` = '{sweep_id}'", max_results=5000)
    except Exception as e:
        store_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.error("could not read the sweep's runs back from MLflow: %s", store_error)
    runs = [r for r in runs if r.data.tags.get(tags.KIND) != mlflow_views.SWEEP_KIND]
    return runs, store_error, exp_id


def _run_rows(runs: list, outcomes: dict, config) -> tuple[list, list, set, list[dict]]:
    """One summary table row and one summary record per run (its status, wall seconds, error from its job's outcome,
    headline metrics at the config's ``eval.n`` samples). Returns ``(rows, failed_base, seen_jobs, summary)``: the failed base-model
    runs by name and the job numbers of the points that left a run."""
    rows, failed_base, seen_jobs, summary = [], [], set(), []
    for r in runs:
        kind = r.data.tags.get(tags.KIND, "?")
        status = "DUPLICATE" if kind == "duplicate" else r.info.status
        active = r.data.tags.get(tags.ACTIVE_S)
        wall = float(active) if active else (
            ((r.info.end_time or r.info.start_time) - r.info.start_time) / 1000 if r.info.start_time else 0.0)
        point = "base model (Initialization)" if kind == "base" else (r.info.run_name or "")
        job = r.data.tags.get(tags.JOB_NUM, "?")
        if kind != "base":
            seen_jobs.add(job)
        note = (outcomes.get(job) or {}).get("error") or "" if status not in ("FINISHED", "DUPLICATE") else ""
        # the "#" column numbers the sweep's points; the base model's run is none of them (its job ran point 0 too)
        rows.append(("-" if kind == "base" else job, point, status, r.info.run_id, r.data.tags.get(tags.SLURM_JOB_ID, "") or "-",
                     f"{wall:.1f}", note[:120]))
        summary.append({"job": job, "point": point, "status": status, "run_id": r.info.run_id, "wall_s": round(wall, 1),
                        "error": note[:300], **mlflow_views.headline(r.data.metrics, config.eval.get("n"))})
        if status in ("FAILED", "KILLED") and kind == "base":
            failed_base.append(r.info.run_name or r.info.run_id)
    return rows, failed_base, seen_jobs, summary


def _unfinished(runs: list, outcomes: dict, expected: int, store_error: str | None) -> dict:
    """The points that did not end FINISHED or DUPLICATE, by job number: by their own outcome record, by their run
    left FAILED, KILLED or RUNNING, or because job ``i < expected`` left nothing behind (its error then the store's,
    when the runs could not be read)."""
    finished_jobs = {str(r.data.tags.get(tags.JOB_NUM)) for r in runs if r.data.tags.get(tags.KIND) != "base"
                     and (r.info.status == "FINISHED" or r.data.tags.get(tags.KIND) == "duplicate")}
    bad = {}
    for job, rec in outcomes.items():
        if rec.get("status") not in ("finished", "duplicate"):
            bad[job] = rec
    for r in runs:
        job = str(r.data.tags.get(tags.JOB_NUM))
        if r.data.tags.get(tags.KIND) != "base" and r.info.status in ("FAILED", "KILLED", "RUNNING") \
                and job not in finished_jobs:
            bad.setdefault(job, {"job_num": job, "point": r.info.run_name, "status": r.info.status.lower()})
    for i in range(expected):
        if str(i) not in outcomes and str(i) not in finished_jobs and str(i) not in bad:
            bad[str(i)] = {"job_num": str(i), "point": "?", "status": "no outcome",
                           "error": store_error or "the job ended without recording an outcome (see its log)"}
    return bad


def disk_line(sweep_dir: Path) -> str:
    """What the sweep wrote to its folder (its points' checkpoints, evaluations, logs), in one line, with the command
    that lists what may be reclaimed."""
    from orchestrator.point.disk import human, size_bytes

    total = size_bytes(sweep_dir)
    ckpt = sum(size_bytes(p) for p in Path(sweep_dir).glob("*/checkpoint*"))
    return (f"Disk: the sweep wrote {human(total)} to {sweep_dir} ({human(ckpt)} of it checkpoints); "
            "python -m orchestrator.clean lists what no run needs any more")


def write_sweep(sweep_dir: Path, record: dict) -> None:
    """Write the sweep's own outcome to ``<sweep_dir>/rlvr_sweep.json``; never raises."""
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(record))
    except OSError as e:
        log.error("could not write the sweep's outcome to %s: %s", sweep_dir / SWEEP_FILE, e)


def read_sweep(sweep_dir: Path) -> dict:
    """The sweep's outcome as its callback wrote it (``status``: running or the parent run's end status;
    ``parent_run_id``; ``failed_points``, ``failed_base``: lists of one-line descriptions; ``report``; while running,
    the sweep's store outage limit); ``{}`` when the sweep wrote none."""
    try:
        return json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def close_parent(parent_run_id: str | None, summary: list[dict], status: str | None = None, out_dir: Path | None = None,
                 children=(), report_html: Path | None = None, *, store: tracking.Store) -> str | None:
    """End the sweep's parent run (:func:`orchestrator.store.mlflow_views.close_sweep_run`) with the report when one was built and
    the union of its ``children``'s datasets (store calls through ``store``, :class:`orchestrator.store.tracking.Store`).
    Returns the status it ended with (None when there is no parent or it could not be closed); never raises."""
    if parent_run_id is None:
        return None
    try:
        mlflow_views.log_union_of_datasets(parent_run_id, children, store)
    except Exception as e:
        log.warning("the sweep's parent run %s: datasets not logged: %s: %s", parent_run_id, type(e).__name__, e)
    try:
        final = mlflow_views.close_sweep_run(parent_run_id, summary, status, report_html, out_dir, store=store)
        log.info("sweep run %s: %s", parent_run_id, final)
        return final
    except Exception as e:
        log.error("could not close the sweep's parent run %s: %s: %s", parent_run_id, type(e).__name__, e)
        return None


def end_unfinished(sweep_dir: Path, status: str) -> None:
    """Close the parent run of a sweep that stopped before its end (``status``: KILLED or FAILED), when its callback
    opened one and did not close it (waiting out a store outage as long as the sweep's store did: the callback wrote
    its limit to ``rlvr_sweep.json``); never raises."""
    rec = read_sweep(sweep_dir)
    if rec.get("status") != "running" or not rec.get("parent_run_id"):
        return
    final = close_parent(rec["parent_run_id"], [], status,
                         store=tracking.Store(float(rec.get("outage_s", tracking.DEFAULT_OUTAGE_S))))
    write_sweep(Path(sweep_dir), rec | {"status": final or status})


def current_sweep_dir() -> Path | None:
    """The folder of the sweep this process ran (None when no multirun started in it)."""
    d = os.environ.get(SWEEP_DIR_ENV)
    return Path(d) if d else None


def exit_status(sweep_dir: Path) -> int:
    """1 when a point of the sweep did not finish or its base model's evaluation failed, else 0 (from
    ``rlvr_sweep.json``; a sweep that wrote no outcome there ended before its callback: 1)."""
    rec = read_sweep(sweep_dir)
    if not rec or rec.get("status") == "running":
        return 1
    return 1 if rec.get("failed_points") or rec.get("failed_base") else 0
