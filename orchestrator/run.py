"""One sweep point: validate -> identity -> (skip if done) -> MLflow run -> train -> evaluate -> log."""
from __future__ import annotations

import logging
import socket
import subprocess
import tempfile
import traceback
from pathlib import Path

import mlflow
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .identity import config_hash
from .validate import validate_config

log = logging.getLogger("rlvr")


def _run_dir() -> Path:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:
        return Path(tempfile.mkdtemp(prefix="rlvr-run-"))


def _point_name(cfg: DictConfig) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig

        name = HydraConfig.get().job.override_dirname
        if name:
            return name
    except Exception:
        pass
    return str(cfg.algo.name)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


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
    run_dir = _run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    exp_id = tracking.setup_experiment(cfg.tracking.uri, cfg.experiment_name, cfg.tracking.artifact_root)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    params = {k: str(v)[:6000] for k, v in tracking.flatten(resolved).items()}
    name = _point_name(cfg)
    tags = {tracking.TAG_HASH: chash, "rlvr.algo": str(cfg.algo.name), "rlvr.host": socket.gethostname(),
            "rlvr.git_commit": _git_commit(), "rlvr.run_dir": str(run_dir)}
    if warnings:
        tags["rlvr.warnings"] = " | ".join(warnings)[:5000]

    prior = None if cfg.get("force", False) else tracking.find_finished_run(exp_id, chash)
    if prior is not None:
        with mlflow.start_run(experiment_id=exp_id, run_name=name, tags={
            **tags, tracking.TAG_KIND: "duplicate", tracking.TAG_DUP_OF: prior.info.run_id,
            "mlflow.note.content": f"Identical effective config to run {prior.info.run_id}; not trained again.",
        }) as r:
            mlflow.log_params(params)
        log.info("point %s is identical to finished run %s (hash %s): recorded as duplicate %s",
                 name, prior.info.run_id, chash, r.info.run_id)
        return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": prior.info.run_id, "config_hash": chash}

    import training
    from evaluation.evaluate import evaluate
    from training.data import load_prompts
    from training.models import load_checkpoint

    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags={**tags, tracking.TAG_KIND: "trained"}) as r:
        run_id = r.info.run_id
        mlflow.log_params(params)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
        mlflow.log_artifact(str(run_dir / "config.yaml"))
        try:
            ckpt = training.train(cfg, run_dir, log_metrics=lambda m, step: mlflow.log_metrics(m, step=step))
            mlflow.set_tag("rlvr.checkpoint", str(ckpt))
            model, tok = load_checkpoint(ckpt)
            metrics, files = evaluate(model, tok, cfg.eval, run_dir / "eval", heldout_rows=load_prompts(cfg.data, "eval"),
                                      chat_template=bool(cfg.model.get("chat_template", True)))
            mlflow.log_metrics(metrics)
            for path in files.values():
                mlflow.log_artifact(str(path))
        except BaseException:
            (run_dir / "traceback.txt").write_text(traceback.format_exc())
            mlflow.log_artifact(str(run_dir / "traceback.txt"))
            mlflow.end_run(status="FAILED")
            raise
    log.info("point %s finished: MLflow run %s", name, run_id)
    return {"status": "finished", "run_id": run_id, "config_hash": chash, "metrics": metrics}
