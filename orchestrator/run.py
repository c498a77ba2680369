"""One sweep point: validate -> identity -> (skip, resume or train) -> MLflow run -> train -> evaluate -> log.

Identity and idempotence, by the hash of the effective config (``rlvr.config_hash``):
- a FINISHED trained run with the same hash exists: this point is recorded as a duplicate of it;
- an unfinished one (RUNNING or KILLED: preempted, requeued, interrupted) from this job or from an
  earlier sweep: it is resumed, same MLflow run, from its saved state;
- an identical point of the *same* sweep is running concurrently (SLURM): the one created first trains,
  the other is recorded as its duplicate;
- ``+force=true`` trains a new run regardless.
A point that raises marks its run FAILED with ``traceback.txt``; re-running the sweep trains it again.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import traceback
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .identity import config_hash
from .validate import validate_config

log = logging.getLogger("rlvr")


def _hydra_job() -> tuple[Path | None, str, str, int | None]:
    """(run dir, point name, sweep id, job number) from Hydra's runtime config when present."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        num = hc.job.get("num")
        sweep_id = str(hc.sweep.dir) if hc.mode.name == "MULTIRUN" else str(hc.run.dir)
        return Path(hc.runtime.output_dir), hc.job.override_dirname or "", sweep_id, num
    except Exception:
        return None, "", "", None


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def _install_preemption_handler() -> None:
    """Under SLURM, SIGUSR2 (``--signal``, sent before the time limit or on preemption) asks training to
    save its full state at the end of the current step; submitit's own handler then requeues the job."""
    if "SLURM_JOB_ID" not in os.environ:
        return
    from training.engines.local import STOP_REQUESTED

    previous = signal.getsignal(signal.SIGUSR2)

    def handler(signum, frame):
        STOP_REQUESTED.set()
        _install_preemption_handler.previous = previous

    signal.signal(signal.SIGUSR2, handler)
    _install_preemption_handler.previous = previous


def _record_duplicate(exp_id, name, tags, params, of_run_id, chash, why) -> dict:
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags={
        **tags, tracking.TAG_KIND: "duplicate", tracking.TAG_DUP_OF: of_run_id, "mlflow.note.content": why,
    }) as r:
        tracking.retry(mlflow.log_params, params)
    log.info("point %s: %s (recorded as duplicate %s)", name, why, r.info.run_id)
    return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": of_run_id, "config_hash": chash}


def run(cfg: DictConfig) -> dict:
    """Run one sweep point end to end and return a summary dict (status, run id, metrics).

    Raises:
        orchestrator.errors.ConfigError: the config is invalid (nothing has been started).
        Exception: whatever training or evaluation raised; the MLflow run is then marked FAILED
        with the traceback saved as ``traceback.txt``.
    """
    warnings = validate_config(cfg)
    for w in warnings:
        log.warning(w)
    chash = config_hash(cfg)
    hydra_dir, point, sweep_id, job_num = _hydra_job()
    run_dir = hydra_dir or Path(tempfile.mkdtemp(prefix="rlvr-run-"))
    exp_id = tracking.retry(tracking.setup_experiment, cfg.tracking.uri, cfg.experiment_name, cfg.tracking.artifact_root)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    params = {k: str(v)[:6000] for k, v in tracking.flatten(resolved).items()}
    name = point or str(cfg.algo.name)
    tags = {tracking.TAG_HASH: chash, "rlvr.algo": str(cfg.algo.name), "rlvr.host": socket.gethostname(),
            "rlvr.git_commit": _git_commit(), "rlvr.sweep_id": sweep_id, "rlvr.job_num": str(job_num),
            "rlvr.slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "rlvr.requeue_count": os.environ.get("SLURM_RESTART_COUNT", "0")}
    if warnings:
        tags["rlvr.warnings"] = " | ".join(warnings)[:5000]
    force = bool(cfg.get("force", False))

    resume = None
    if not force:
        prior = tracking.retry(tracking.find_finished_run, exp_id, chash)
        if prior is not None:
            return _record_duplicate(exp_id, name, tags, params, prior.info.run_id, chash,
                                     f"identical effective config to finished run {prior.info.run_id}; not trained again")
        for r in tracking.retry(tracking.runs_with_hash, exp_id, chash):
            if r.info.status not in ("RUNNING", "KILLED", "SCHEDULED"):
                continue
            same_job = r.data.tags.get("rlvr.sweep_id") == sweep_id and r.data.tags.get("rlvr.job_num") == str(job_num)
            if r.data.tags.get("rlvr.sweep_id") == sweep_id and not same_job:
                return _record_duplicate(exp_id, name, tags, params, r.info.run_id, chash,
                                         f"identical to point {r.data.tags.get('rlvr.job_num')} of this sweep, run {r.info.run_id}")
            resume = r
            break

    import training
    from evaluation.evaluate import evaluate_temperatures
    from training.data import load_prompts
    from training.engines.local import Preempted
    from training.models import load_checkpoint

    client = MlflowClient()
    if resume is not None:
        run_dir = Path(resume.data.tags.get("rlvr.run_dir") or run_dir)
        hist = tracking.retry(client.get_metric_history, resume.info.run_id, "train/reward_mean")
        logged_through = max((m.step for m in hist), default=-1)
        active = mlflow.start_run(run_id=resume.info.run_id)
        requeues = int(resume.data.tags.get("rlvr.requeue_count", "0") or 0) + 1
        tracking.retry(mlflow.set_tags, {k: v for k, v in tags.items() if k != "rlvr.requeue_count"}
                       | {"rlvr.requeue_count": str(max(requeues, int(tags["rlvr.requeue_count"])))})
        log.info("point %s: resuming MLflow run %s from %s (metrics logged through step %d)",
                 name, resume.info.run_id, run_dir, logged_through)
    else:
        logged_through = -1
        active = mlflow.start_run(experiment_id=exp_id, run_name=name,
                                  tags={**tags, tracking.TAG_KIND: "trained", "rlvr.run_dir": str(run_dir)})
        tracking.retry(mlflow.log_params, params)
        # an identical point of this sweep may have started at the same moment: the earliest run trains
        twins = [r for r in tracking.retry(tracking.runs_with_hash, exp_id, chash)
                 if r.data.tags.get("rlvr.sweep_id") == sweep_id and r.info.status != "FAILED"
                 and r.info.run_id != active.info.run_id and not force]
        earlier = [r for r in twins if (r.info.start_time, r.info.run_id) < (active.info.start_time, active.info.run_id)]
        if earlier:
            mlflow.set_tags({tracking.TAG_KIND: "duplicate", tracking.TAG_DUP_OF: earlier[0].info.run_id})
            mlflow.end_run()
            log.info("point %s: identical to run %s started just before: recorded as duplicate", name, earlier[0].info.run_id)
            return {"status": "duplicate", "run_id": active.info.run_id, "duplicate_of": earlier[0].info.run_id,
                    "config_hash": chash}
    run_id = active.info.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
    _install_preemption_handler()
    try:
        tracking.retry(mlflow.log_artifact, str(run_dir / "config.yaml"))
        ckpt = training.train(cfg, run_dir, log_metrics=lambda m, step: tracking.retry(mlflow.log_metrics, m, step=step),
                              logged_through=logged_through)
        mlflow.set_tag("rlvr.checkpoint", str(ckpt))
        model, tok = load_checkpoint(ckpt)
        metrics, files = evaluate_temperatures(model, tok, cfg.eval, run_dir / "eval",
                                               heldout_rows=load_prompts(cfg.data, "eval"),
                                               chat_template=bool(cfg.model.get("chat_template", True)))
        tracking.retry(mlflow.log_metrics, metrics)
        for rel, path in files.items():
            sub = str(Path(rel).parent)
            tracking.retry(mlflow.log_artifact, str(path), None if sub == "." else sub)
    except Preempted:
        # state saved: leave the run RUNNING for the requeued job, and let submitit requeue us
        log.warning("point %s preempted; state saved in %s", name, run_dir)
        previous = getattr(_install_preemption_handler, "previous", None)
        if callable(previous):
            previous(signal.SIGUSR2, None)
        raise
    except BaseException:
        (run_dir / "traceback.txt").write_text(traceback.format_exc())
        try:
            tracking.retry(mlflow.log_artifact, str(run_dir / "traceback.txt"))
        finally:
            mlflow.end_run(status="FAILED")
        raise
    mlflow.end_run()
    log.info("point %s finished: MLflow run %s", name, run_id)
    return {"status": "finished", "run_id": run_id, "config_hash": chash, "metrics": metrics}
