"""Hydra callbacks of the sweep: create the MLflow store before jobs start; print a summary at the end."""
from __future__ import annotations

import logging

from hydra.experimental.callback import Callback

from . import tracking

log = logging.getLogger("rlvr")

FAILED_POINTS: list[str] = []  # read by sweep.py to set the exit status
FAILED_BASE: list[str] = []  # failed base-model evaluations of the sweep: exit status 1 too


class SweepSummaryCallback(Callback):
    """``on_multirun_start``: create the store and experiment once (parallel jobs creating an SQLite
    schema at the same time can race). ``on_multirun_end``: print a table of the sweep's points
    (point, status, MLflow run id, SLURM job id, wall time) and remember failures."""

    def on_multirun_start(self, config, **kwargs) -> None:
        tracking.retry(tracking.setup_experiment, str(config.tracking.uri), str(config.experiment_name),
                       str(config.tracking.artifact_root))

    def on_multirun_end(self, config, **kwargs) -> None:
        from mlflow.tracking import MlflowClient

        sweep_id = str(config.hydra.sweep.dir)
        try:
            exp_id = tracking.setup_experiment(str(config.tracking.uri), str(config.experiment_name), str(config.tracking.artifact_root))
            runs = MlflowClient().search_runs([exp_id], filter_string=f"tags.`rlvr.sweep_id` = '{sweep_id}'",
                                              order_by=["attributes.start_time ASC"], max_results=5000)
        except Exception as e:
            log.error("could not read the sweep's runs back from MLflow: %s", e)
            return
        rows, failed_base = [], []
        for r in runs:
            kind = r.data.tags.get(tracking.TAG_KIND, "?")
            status = "DUPLICATE" if kind == "duplicate" else r.info.status
            wall = ((r.info.end_time or r.info.start_time) - r.info.start_time) / 1000 if r.info.start_time else 0.0
            point = "base model (Initialization)" if kind == "base" else (r.info.run_name or "")
            rows.append((r.data.tags.get("rlvr.job_num", "?"), point, status, r.info.run_id,
                         r.data.tags.get("rlvr.slurm_job_id", "") or "-", f"{wall:.1f}"))
            if status == "FAILED":
                (failed_base if kind == "base" else FAILED_POINTS).append(r.info.run_name or r.info.run_id)
        header = ("#", "point", "status", "MLflow run", "job id", "wall s")
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [header, *rows]]
        print("\nSweep summary (" + sweep_id + ")\n" + "\n".join(lines), flush=True)
        if FAILED_POINTS:
            print(f"{len(FAILED_POINTS)} point(s) failed; their tracebacks are in MLflow (traceback.txt). "
                  "Re-running the same command trains only the points that did not finish.", flush=True)
        if failed_base:
            print("The base model's evaluation failed (traceback.txt in its MLflow run); the trained points have no "
                  "flip rates. Re-running the same command evaluates it again.", flush=True)
            FAILED_BASE.extend(failed_base)
