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
    from core.lifecycle import STOP_REQUESTED

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
            out = _record_duplicate(exp_id, name, tags, params, prior.info.run_id, chash,
                                    f"identical effective config to finished run {prior.info.run_id}; not trained again")
            if bool(cfg.eval.get("base", True)) and not prior.data.tags.get("rlvr.base_run_id"):
                _backfill_flips(cfg, exp_id, sweep_id, job_num, run_dir, prior)
            return out
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
    from core.lifecycle import Preempted
    from evaluation.evaluate import benchmark_rows
    from core.tasks import load_prompts

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
        heldout = load_prompts(cfg.data, "eval")
        benchmark_rows(cfg.eval, heldout)  # unreadable benchmark files fail here, before any training
        base = None
        if bool(cfg.eval.get("base", True)):
            from .base import BaseEvaluation

            base = BaseEvaluation(cfg, exp_id, sweep_id, job_num, Path(sweep_id) if sweep_id else run_dir, heldout)
            base.ensure(wait=False)  # evaluated here now, unless another job already is
        ckpt = training.train(cfg, run_dir, log_metrics=lambda m, step: tracking.retry(mlflow.log_metrics, m, step=step),
                              logged_through=logged_through)
        mlflow.set_tag("rlvr.checkpoint", str(ckpt))
        _free_memory()
        metrics = evaluate_run(cfg, run_dir, ckpt, heldout, base)
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


def _free_memory() -> None:
    """Return the training engine's memory (GPU memory above all) before an evaluation engine starts."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def flip_rule(k) -> str:
    from evaluation.metrics.difficulty import flip_rule as rule

    return rule(None if k is None else int(k))


def checkpoints_to_evaluate(cfg, run_dir: Path, final: Path) -> list[tuple[int, Path, Path, bool]]:
    """``[(step, checkpoint, evaluation folder, is_final), ...]``: with ``eval.checkpoints=all`` every kept
    checkpoint (``train.save_every``) in ``run_dir/eval/step_<N>``, then the final one in ``run_dir/eval``;
    ``step`` is the number of training steps behind the checkpoint (the final: ``train.steps``)."""
    from core.lifecycle import saved_checkpoints

    out = []
    if str(cfg.eval.get("checkpoints", "final")) == "all":
        out = [(s, p, run_dir / "eval" / f"step_{s}", False) for s, p in saved_checkpoints(run_dir) if s < int(cfg.train.steps)]
    return out + [(int(cfg.train.steps), Path(final), run_dir / "eval", True)]


def _log_files(files: dict, prefix: str | None) -> None:
    for rel, f in files.items():
        sub = str(Path(rel).parent)
        dest = "/".join(x for x in (prefix, None if sub == "." else sub) if x)
        tracking.retry(mlflow.log_artifact, str(f), dest or None)


def evaluate_run(cfg, run_dir: Path, final: Path, heldout, base=None) -> dict:
    """Evaluate a trained run's checkpoints (:func:`checkpoints_to_evaluate`) and log each to the active MLflow
    run at its training step, so MLflow draws every evaluation metric against steps; then, with ``base`` (an
    :class:`orchestrator.base.BaseEvaluation`), wait for the base model's samples and log every evaluation's
    flip rates (``eval/<bench>/flip/<bucket>/<measure>``, ``flip_rates.csv``). Files of a non-final checkpoint
    go under ``eval/step_<N>/`` in the run's artifacts. An evaluation already logged (a marker file in its
    folder, e.g. before a requeue) is not logged twice.

    Returns:
        The final checkpoint's metrics (flip rates included).
    """
    import pandas as pd

    from evaluation.evaluate import evaluate_checkpoint
    from evaluation.tables import flip_metrics

    chat = bool(cfg.model.get("chat_template", True))
    final_metrics, evaluated = {}, []
    for step, path, out_dir, is_final in checkpoints_to_evaluate(cfg, run_dir, final):
        metrics, files, info = evaluate_checkpoint(path, cfg.eval, out_dir, heldout, chat, temperatures=is_final)
        if is_final:
            final_metrics = dict(metrics)
            tracking.retry(mlflow.set_tags, {"rlvr.sampler": info["sampler"], "rlvr.entropy_method": str(info["entropy_method"])})
        if not (out_dir / ".logged").exists():
            tracking.retry(mlflow.log_metrics, metrics | {"time/eval_s": info["eval_time_s"]}, step=step)
            _log_files(files, None if is_final else f"eval/step_{step}")
            (out_dir / ".logged").write_text(str(step))
        evaluated.append((step, out_dir, is_final))
    base_samples = base.ensure(wait=True) if base is not None else None
    if base_samples is None:
        return final_metrics
    flip_k = cfg.eval.get("flip_k")
    tracking.retry(mlflow.set_tags, {"rlvr.base_run_id": base.run_id, "rlvr.flip_rule": flip_rule(flip_k)})
    for step, out_dir, is_final in evaluated:
        table, flips = flip_metrics(base_samples, pd.read_parquet(out_dir / "samples.parquet"),
                                    None if flip_k is None else int(flip_k))
        if is_final:
            final_metrics.update(flips)
        if (out_dir / ".flips_logged").exists():
            continue
        table.to_csv(out_dir / "flip_rates.csv")
        tracking.retry(mlflow.log_metrics, flips, step=step)
        _log_files({"flip_rates.csv": out_dir / "flip_rates.csv"}, None if is_final else f"eval/step_{step}")
        (out_dir / ".flips_logged").write_text(str(step))
    return final_metrics


def _backfill_flips(cfg, exp_id: str, sweep_id: str, job_num, run_dir: Path, prior) -> None:
    """A finished run without flip rates (its sweep's base evaluation failed or was interrupted): evaluate the
    base model now (or wait for the job that does) and log the flip rates of each of the run's evaluations to it,
    at their steps, read back from its ``samples.parquet`` artifacts. Never raises: the run stays as it was."""
    import tempfile

    import pandas as pd

    from evaluation.tables import flip_metrics
    from core.tasks import load_prompts

    from .base import BaseEvaluation, log_metrics

    try:
        base = BaseEvaluation(cfg, exp_id, sweep_id, job_num, Path(sweep_id) if sweep_id else run_dir,
                              load_prompts(cfg.data, "eval"))
        base_samples = base.ensure(wait=True)
        if base_samples is None:
            return
        client = MlflowClient()
        rid = prior.info.run_id
        evaluations = [("", int(cfg.train.steps))] + [
            (a.path + "/", int(a.path.rsplit("_", 1)[1])) for a in tracking.retry(client.list_artifacts, rid, "eval")
            if a.is_dir and a.path.rsplit("/", 1)[-1].startswith("step_")]
        flip_k = cfg.eval.get("flip_k")
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-flips-"))
        for prefix, step in evaluations:
            local = tmp / f"step_{step}"
            samples = pd.read_parquet(client.download_artifacts(rid, prefix + "samples.parquet", str(local)))
            table, flips = flip_metrics(base_samples, samples, None if flip_k is None else int(flip_k))
            log_metrics(client, rid, flips, step)
            table.to_csv(local / "flip_rates.csv")
            tracking.retry(client.log_artifact, rid, str(local / "flip_rates.csv"), prefix.rstrip("/") or None)
        tracking.retry(client.set_tag, rid, "rlvr.base_run_id", base.run_id)
        tracking.retry(client.set_tag, rid, "rlvr.flip_rule", flip_rule(flip_k))
        log.info("run %s: flip rates against base run %s added", rid, base.run_id)
    except Exception as e:
        log.warning("run %s: could not add flip rates against the base model: %s: %s", prior.info.run_id,
                    type(e).__name__, e)
