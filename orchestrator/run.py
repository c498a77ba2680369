"""One sweep point: validate -> identity -> (skip, resume or train) -> MLflow run -> train -> evaluate -> log.

Identity and idempotence, by the hash of the effective config (``rlvr.config_hash``):
- a FINISHED trained run with the same hash exists: this point is recorded as a duplicate of it;
- an unfinished one (RUNNING or KILLED: preempted, requeued, interrupted) from this job or from an
  earlier sweep: it is resumed, same MLflow run, from its saved state;
- an identical point of the *same* sweep is running concurrently (SLURM): the one created first trains,
  the other is recorded as its duplicate;
- a FINISHED run with the same *training* hash (:func:`orchestrator.identity.training_hash`: only the ``eval``
  settings differ, e.g. ``eval.seed=0,1,2``) and an intact checkpoint: a new run evaluates that checkpoint (tag
  ``rlvr.trained_in``, training metrics copied); while such a run is still training, the point waits for it;
- ``+force=true`` trains a new run regardless.
A point that raises marks its run FAILED with ``traceback.txt``; re-running the sweep trains it again.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from . import integrity, lease, tracking, mlflow_views
from .base_model import log_metrics
from . import provenance
from .identity import config_hash, git_commit, point_name, training_hash
from .validate import validate_config

log = logging.getLogger("rlvr")
MAX_RUN_NAME = 240
UNSENT = "unsent_metrics.jsonl"  # in the run folder: metrics a lost store did not take (tracking.MetricBuffer)
POLL_S = 3.0  # how often a point waits on another process that trains it


def _hydra_job() -> tuple[Path | None, str, str, int | None]:
    """(run dir, point name, sweep id, job number) from Hydra's runtime config when present."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        num = hc.job.get("num")
        sweep_id = str(hc.sweep.dir) if hc.mode.name == "MULTIRUN" else str(hc.run.dir)
        return Path(hc.runtime.output_dir), point_name(hc.job.override_dirname), sweep_id, num
    except Exception:
        return None, "", "", None


class StopSignals:
    """A point's signal handling, as one object that owns its state.

    Outside SLURM, SIGTERM and SIGINT (``kill``, a container stop, Ctrl-C): while training, the first one asks for
    the state to be saved after the running optimiser step (as SIGUSR2 does on SLURM), or, during a step's generation
    and scoring, ends the step at once and saves the last completed step's state (:func:`core.lifecycle.abortable`) and is remembered in
    :attr:`signum` (the exit status says which); a second one, or one outside training, stops at once
    (:class:`core.lifecycle.Interrupted`). Under SLURM, SIGUSR2 (``--signal``, sent before the time limit or on
    preemption) asks training to save its full state after the running optimiser step; submitit's own handler, kept in
    :attr:`previous_usr2`, then requeues the job (:meth:`hand_on_preemption`)."""

    def __init__(self):
        self.signum: int = signal.SIGTERM
        self.previous_usr2 = None
        self._previous: dict = {}

    def install(self) -> None:
        """The stop handlers (outside SLURM, on the main thread only); :meth:`restore` puts the previous ones back."""
        from core.lifecycle import ABORTABLE, STOP_REQUESTED, TRAINING, Interrupted, request_stop

        if "SLURM_JOB_ID" in os.environ or threading.current_thread() is not threading.main_thread():
            return

        owner = os.getpid()

        def handler(signum, frame):
            if os.getpid() != owner:  # a forked worker (the verifier's pool) that inherited this handler
                return
            if TRAINING.is_set() and not STOP_REQUESTED.is_set():
                self.signum = signum
                log.warning("%s received: %s, then stopping (send it again to stop at once)", signal.Signals(signum).name,
                            "ending this step's generation and saving the last completed step's state"
                            if ABORTABLE.value else "saving the training state after the running optimiser step")
                request_stop()  # inside a step's generation or scoring: raises there (core.lifecycle.StepAborted)
                return
            raise Interrupted(signum)

        self._previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in self._previous:
            signal.signal(s, handler)

    def install_preemption(self) -> None:
        """Under SLURM: SIGUSR2 sets the stop request; submitit's handler is kept for :meth:`hand_on_preemption`."""
        if "SLURM_JOB_ID" not in os.environ:
            return
        from core.lifecycle import request_stop

        def handler(signum, frame):
            request_stop()  # inside a step's generation or scoring: raises there (core.lifecycle.StepAborted)

        if self.previous_usr2 is None:  # installed once per point: a second run of it keeps submitit's handler
            self.previous_usr2 = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, handler)

    def hand_on_preemption(self) -> None:
        """Call the SIGUSR2 handler that was there before (submitit's: it requeues the job)."""
        if callable(self.previous_usr2):
            self.previous_usr2(signal.SIGUSR2, None)

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}


@dataclass(frozen=True)
class Point:
    """What every step of one sweep point's life needs, fixed when the point starts."""

    cfg: DictConfig
    exp_id: str
    chash: str  # rlvr.config_hash: the point's identity
    sweep_id: str
    job_num: int | None
    name: str  # the MLflow run name
    tags: dict
    params: dict
    stale_s: float  # a lease older than this without a heartbeat is stale
    force: bool  # +force=true: train regardless of identical runs
    run_dir: Path
    signals: StopSignals


@dataclass(frozen=True)
class Decision:
    """What to do with a point (:func:`decide`).

    action: ``duplicate`` (recorded as a duplicate: ``summary`` is the point's result), ``resume`` (continue ``run``,
    an unfinished run of this point, from its saved state) or ``new`` (a new run; ``run``, when set, is a finished
    run whose checkpoint the new run takes instead of training: ``reuse`` = ``evaluation`` when only the evaluation
    settings differ, ``recovered`` when that run's results were corrupt but its checkpoint is good).
    owner: the lease owner token of this process for the run it trains or resumes.
    """

    action: str
    owner: str | None = None
    run: object = None
    reuse: str | None = None
    summary: dict | None = None


def _record_duplicate(exp_id, name, tags, params, of_run_id, chash, why, cfg=None) -> dict:
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags={
        **tags, tracking.TAG_KIND: "duplicate", tracking.TAG_DUP_OF: of_run_id, "mlflow.note.content": why,
    }) as r:
        tracking.retry(mlflow.log_params, params)
        if cfg is not None:
            _log_datasets(cfg, r.info.run_id)
    log.info("point %s: %s (recorded as duplicate %s)", name, why, r.info.run_id)
    return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": of_run_id, "config_hash": chash}


def _log_datasets(cfg, run_id: str) -> None:
    """The run's training prompts and evaluation benchmarks as MLflow datasets (:func:`orchestrator.mlflow_views.log_datasets`)."""
    try:
        from core.tasks import load_prompts
        from evaluation.evaluate import benchmark_rows

        heldout = load_prompts(cfg.data, "eval")
        mlflow_views.log_datasets(run_id, cfg.data, load_prompts(cfg.data, "train"), benchmark_rows(cfg.eval, heldout), cfg.eval)
    except Exception as e:  # bad data fails the point later, with its own message
        log.warning("run %s: datasets not logged: %s: %s", run_id, type(e).__name__, e)


def has_saved_state(cfg, run_dir: Path) -> bool:
    """Whether the engine left a full training state in ``run_dir`` to resume from (engine's ``has_state``)."""
    from training.engines import get_engine

    fn = getattr(get_engine(str(cfg.engine.name)), "has_state", None)
    return bool(fn(run_dir)) if callable(fn) else False


def safe_run_dir(tagged: str | None, sweep_id: str) -> Path | None:
    """The run folder named by a run's ``rlvr.run_dir`` tag, when it is safe to load a training state from: it
    lies under the folder that holds this sweep's folder (``multirun/<experiment>`` by default), or is a
    ``rlvr-run-*`` folder of this user in the system's temporary folder (runs outside Hydra), after resolving links. Otherwise None: a tag anyone with
    write access to the store can set must not point training at a file of their choosing."""
    if not tagged:
        return None
    path = Path(tagged).resolve()
    if path.parent == Path(tempfile.gettempdir()).resolve() and path.name.startswith("rlvr-run-"):
        try:
            return path if path.stat().st_uid == os.getuid() else None  # a run outside Hydra, by this user
        except OSError:
            return None
    root = Path(sweep_id).resolve().parent if sweep_id else None
    return path if root is not None and root in path.parents else None


def _invalidate(client, run, why: str) -> None:
    tracking.retry(client.set_tag, run.info.run_id, "rlvr.invalid", why[:4900])
    tracking.retry(client.set_terminated, run.info.run_id, "KILLED")


def _token_budget(cfg) -> int | None:
    """``train.micro_batch_tokens`` when it is a number (the evaluation's entropy passes hold at most that many
    positions too), else None."""
    budget = OmegaConf.select(cfg, "train.micro_batch_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def _tag_rollout(run_dir: Path) -> None:
    """Tag the run with what its engine chose and why: the rollout sampler (``rollout.json``:
    ``rlvr.rollout_sampler``, ``rlvr.rollout_sampler_reason``), the precision (``precision.json``: ``rlvr.precision``,
    ``rlvr.precision_reason``, ``rlvr.rollout_dtype``) and the scoring layout and micro-batch budget
    (``memory.json``: ``rlvr.packing``, ``rlvr.packing_reason``, ``rlvr.micro_batch_tokens``), each written by the
    local engine; the memory plan's parts are logged as ``memory/plan_<part>_gb`` metrics and ``memory.json`` as an
    artifact."""
    import json

    try:
        info = json.loads((Path(run_dir) / "rollout.json").read_text())
        tracking.retry(mlflow.set_tags, {"rlvr.rollout_sampler": str(info.get("sampler")),
                                         "rlvr.rollout_sampler_reason": str(info.get("reason"))[:5000]})
    except (OSError, ValueError):
        pass
    try:
        info = json.loads((Path(run_dir) / "precision.json").read_text())
        tracking.retry(mlflow.set_tags, {"rlvr.precision": str(info.get("precision")),
                                         "rlvr.precision_reason": str(info.get("reason"))[:5000],
                                         "rlvr.rollout_dtype": str(info.get("rollout_dtype"))})
    except (OSError, ValueError):
        pass
    memory = Path(run_dir) / "memory.json"
    try:
        info = json.loads(memory.read_text())
    except (OSError, ValueError):
        return
    tracking.retry(mlflow.set_tags, {"rlvr.packing": str(info.get("layout")),
                                     "rlvr.packing_reason": str(info.get("layout_reason"))[:5000],
                                     "rlvr.micro_batch_tokens": str(info.get("micro_batch_tokens"))})
    plan = info.get("plan") or {}
    values = {f"memory/plan_{k}": float(v) for k, v in plan.items()
              if k.endswith("_gb") and isinstance(v, (int, float)) and v is not None}
    for k, v in (info.get("calibration") or {}).items():
        values[f"memory/{k}"] = float(v)
    params = info.get("parameters") or {}
    for k in ("trainable", "total"):  # what trains: every parameter, or the LoRA adapters
        if isinstance(params.get(k), (int, float)):
            values[f"model/{k}_params"] = float(params[k])
    if params.get("trainable") and params.get("total"):
        values["model/trainable_share"] = float(params["trainable"]) / float(params["total"])
    if params.get("adapter_mb") is not None:
        values["model/adapter_mb"] = float(params["adapter_mb"])
        tracking.retry(mlflow.set_tag, "rlvr.lora_rank", str(params.get("lora_rank")))
    if values:
        tracking.retry(mlflow.log_metrics, values, step=0)
    tracking.retry(mlflow.log_artifact, str(memory))


def _recover_from(prior, run_dir: Path) -> None:
    """Copy (hard-link where possible) a corrupt run's good checkpoints into ``run_dir`` for re-evaluation."""
    old = Path(prior.data.tags.get("rlvr.run_dir", ""))
    for sub in ("checkpoint", "checkpoints"):
        if (old / sub).is_dir() and not (run_dir / sub).exists():
            def link(src, dst):
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
            shutil.copytree(old / sub, run_dir / sub, copy_function=link)


def _copy_train_metrics(client, src_run_id: str, dst_run_id: str) -> int:
    """Copy every ``train/`` metric history of ``src`` into ``dst`` (each step once); returns the last step."""
    from mlflow.entities import Metric

    last, items = -1, []
    for key in client.get_run(src_run_id).data.metrics:
        if key.startswith("train/"):
            for m in tracking.retry(client.get_metric_history, src_run_id, key):
                items.append(Metric(key, m.value, m.timestamp, m.step))
                last = max(last, m.step)
    for a in range(0, len(items), 500):
        tracking.retry(client.log_batch, dst_run_id, metrics=items[a:a + 500])
    return last


def decide(pt: Point) -> Decision:
    """Decide what to do with point ``pt`` (see the module docstring): waits while an identical point's run is live
    elsewhere, and returns a :class:`Decision`.

    Raises:
        core.lifecycle.Interrupted: a stop was requested while waiting.
    """
    cfg, exp_id, chash, sweep_id, job_num, name, tags, params, stale_s, force, run_dir = (
        pt.cfg, pt.exp_id, pt.chash, pt.sweep_id, pt.job_num, pt.name, pt.tags, pt.params, pt.stale_s, pt.force, pt.run_dir)
    client = MlflowClient()
    owner, recover, waited = lease.new_owner(), None, None
    from core.lifecycle import STOP_REQUESTED

    while not force:
        if STOP_REQUESTED.is_set():
            from core.lifecycle import Interrupted

            raise Interrupted(pt.signals.signum)
        prior = tracking.retry(tracking.find_finished_run, exp_id, chash)
        if prior is not None:
            problems, ckpt_ok = integrity.verify_run(client, prior)
            if not problems:
                out = _record_duplicate(exp_id, name, tags, params, prior.info.run_id, chash,
                                        f"identical effective config to finished run {prior.info.run_id}; not trained again",
                                        cfg)
                if bool(cfg.eval.get("base", True)) and not prior.data.tags.get("rlvr.base_run_id"):
                    _backfill_flips(cfg, exp_id, sweep_id, job_num, run_dir, prior)
                return Decision("duplicate", summary=out)
            for p in problems:
                log.warning("point %s: finished run %s is not trusted: %s", name, prior.info.run_id, p)
            log.warning("point %s: %s", name, "re-evaluating its checkpoint in a new run" if ckpt_ok else
                        "its checkpoint is bad: training again in a new run")
            _invalidate(client, prior, "; ".join(problems))
            recover = prior if ckpt_ok else None
            continue
        thash = tags.get(tracking.TAG_TRAIN_HASH)
        if recover is None and thash:
            source = _trained_checkpoint(client, exp_id, thash, sweep_id, name)
            if source is not None and source.data.tags.get(tracking.TAG_HASH) == chash:
                continue  # this very point finished since the look above: recorded as its duplicate next time round
            if source is not None:
                return Decision("new", owner, source, "evaluation")
        same = tracking.retry(tracking.runs_with_hash, exp_id, chash)
        if any(r.info.status == "FINISHED" and not r.data.tags.get("rlvr.invalid") for r in same):
            continue  # a run of this point finished between the two queries (it was live a moment ago): look again
        candidates = [r for r in same
                      if r.info.status in ("RUNNING", "KILLED", "SCHEDULED") and not r.data.tags.get("rlvr.invalid")]
        # this job's own earlier incarnation (a requeued SLURM job: same sweep, same job number) is never waited for
        live = [r for r in candidates if lease.is_live(r, stale_s) and not (
            r.data.tags.get("rlvr.sweep_id") == sweep_id and r.data.tags.get("rlvr.job_num") == str(job_num))]
        for r in live:
            same_sweep = r.data.tags.get("rlvr.sweep_id") == sweep_id
            if same_sweep and r.data.tags.get("rlvr.job_num") != str(job_num):
                return Decision("duplicate", summary=_record_duplicate(
                    exp_id, name, tags, params, r.info.run_id, chash,
                    f"identical to point {r.data.tags.get('rlvr.job_num')} of this sweep, run {r.info.run_id}", cfg))
        if not live and thash:  # the same checkpoint is being trained for another evaluation: wait, then evaluate it
            live = [r for r in tracking.retry(tracking.runs_with_hash, exp_id, thash, tag=tracking.TAG_TRAIN_HASH)
                    if r.info.status == "RUNNING" and _trains(r) and r.data.tags.get(tracking.TAG_HASH) != chash
                    and lease.is_live(r, stale_s)]
        if live:
            r = live[0]
            if waited != r.info.run_id:
                log.info("point %s: run %s is being trained by %s (pid %s); waiting for it (its lease goes stale "
                         "after %.0f s without a heartbeat)", name, r.info.run_id, r.data.tags.get("rlvr.host"),
                         r.data.tags.get("rlvr.pid"), stale_s)
                waited = r.info.run_id
            time.sleep(POLL_S)
            continue
        if candidates:
            r = candidates[-1]  # the newest unfinished run of this point: taken over
            token = lease.claim(client, r.info.run_id, owner)
            if token is None:
                continue  # another process claimed it at the same moment: it is live now
            for other in candidates[:-1]:
                if other.info.status == "RUNNING":
                    tracking.retry(client.set_terminated, other.info.run_id, "KILLED")
            old_dir = safe_run_dir(r.data.tags.get("rlvr.run_dir"), sweep_id)
            hist = tracking.retry(client.get_metric_history, r.info.run_id, "train/reward_mean")
            if old_dir is not None and (has_saved_state(cfg, old_dir) or not hist):
                return Decision("resume", owner, r)
            why = ("its run folder lies outside this sweep's folders" if old_dir is None and r.data.tags.get("rlvr.run_dir")
                   else "it logged training steps but left no saved state (set train.checkpoint_every=N to keep one)")
            log.warning("point %s: not resuming run %s: %s; it is marked KILLED and the point starts again in a new run",
                        name, r.info.run_id, why)
            tracking.retry(client.set_tag, r.info.run_id, "rlvr.invalid", f"not resumed: {why}")
            tracking.retry(client.set_terminated, r.info.run_id, "KILLED")
            continue
        break
    return Decision("new", owner, recover, "recovered" if recover is not None else None)


class _Yield(Exception):
    """Raised inside a point's run when an identical point's run turned out to have started first."""

    def __init__(self, run):
        super().__init__(run.info.run_id)
        self.run = run


def _earlier_runs(exp_id: str, chash: str, tags: dict, active, stale_s: float, with_training: bool) -> list:
    """Live RUNNING runs of this point (same config hash) started before ``active``, and with ``with_training`` those
    training the same checkpoint for another evaluation (same training hash), earliest first."""
    mine = (active.info.start_time, active.info.run_id)
    same = list(tracking.retry(tracking.runs_with_hash, exp_id, chash))
    if with_training and tags.get(tracking.TAG_TRAIN_HASH):
        same += [r for r in tracking.retry(tracking.runs_with_hash, exp_id, tags[tracking.TAG_TRAIN_HASH],
                                           tag=tracking.TAG_TRAIN_HASH)
                 if r.data.tags.get(tracking.TAG_HASH) != chash and _trains(r)]
    return sorted((r for r in same if r.info.run_id != active.info.run_id and r.info.status == "RUNNING"
                   and lease.is_live(r, stale_s) and (r.info.start_time, r.info.run_id) < mine),
                  key=lambda r: (r.info.start_time, r.info.run_id))


def _yield_to(earlier, pt: Point, run_id: str) -> dict | None:
    """This point's run ``run_id`` gives way to ``earlier``: recorded as its duplicate when it is the same point of
    the same sweep (returns the point's summary), else deleted (returns None: the point is decided again, and then
    waits for ``earlier``)."""
    client = MlflowClient()
    name, chash = pt.name, pt.chash
    if earlier.data.tags.get("rlvr.sweep_id") == pt.sweep_id and earlier.data.tags.get(tracking.TAG_HASH) == chash:
        tracking.retry(client.set_tag, run_id, tracking.TAG_KIND, "duplicate")
        tracking.retry(client.set_tag, run_id, tracking.TAG_DUP_OF, earlier.info.run_id)
        mlflow.end_run()
        log.info("point %s: identical to run %s started just before: recorded as duplicate", name, earlier.info.run_id)
        return {"status": "duplicate", "run_id": run_id, "duplicate_of": earlier.info.run_id, "config_hash": chash}
    mlflow.end_run()
    tracking.retry(client.delete_run, run_id)  # another sweep (or another evaluation) owns the training: wait for it
    return None


def _trains(run) -> bool:
    """Whether a trained-kind run trains its checkpoint (not one that evaluates another run's, or recovers one)."""
    return not (run.data.tags.get(tracking.TAG_TRAINED_IN) or run.data.tags.get("rlvr.recovered_from"))


def _trained_checkpoint(client, exp_id: str, thash: str, sweep_id: str, name: str):
    """The earliest FINISHED run with training hash ``thash`` (:func:`orchestrator.identity.training_hash`) whose
    checkpoint is intact (:func:`integrity.verify_run`) and lies in a folder this sweep may read
    (:func:`safe_run_dir`), or None: a point that differs from it only in its ``eval`` settings evaluates that
    checkpoint instead of training again."""
    for r in tracking.retry(tracking.runs_with_hash, exp_id, thash, tag=tracking.TAG_TRAIN_HASH):
        if r.info.status != "FINISHED" or r.data.tags.get("rlvr.invalid"):
            continue
        folder = safe_run_dir(r.data.tags.get("rlvr.run_dir"), sweep_id)
        if folder is None or not (folder / "checkpoint").is_dir():
            log.info("point %s: run %s trained the same checkpoint but its folder is not readable here (%s)", name,
                     r.info.run_id, r.data.tags.get("rlvr.run_dir"))
            continue
        problems, ckpt_ok = integrity.verify_run(client, r)
        if ckpt_ok:
            log.info("point %s: same training as run %s (only the evaluation differs): evaluating its checkpoint in "
                     "a new run", name, r.info.run_id)
            return r
    return None


def run(cfg: DictConfig) -> dict:
    """Run one sweep point end to end and return a summary dict (status, run id, metrics).

    Raises:
        orchestrator.errors.ConfigError: the config is invalid (nothing has been started).
        core.lifecycle.Interrupted: SIGTERM/SIGINT outside SLURM; the run is marked KILLED (its state saved
            first when it was training).
        Exception: whatever training or evaluation raised; the MLflow run is then marked FAILED
            with the traceback saved as ``traceback.txt``.
    """
    warnings = validate_config(cfg)
    for w in warnings:
        log.warning(w)
    chash, thash = config_hash(cfg), training_hash(cfg)
    hydra_dir, point, sweep_id, job_num = _hydra_job()
    run_dir = hydra_dir or Path(tempfile.mkdtemp(prefix="rlvr-run-"))
    tracking.set_outage_s(cfg.tracking.get("outage_s", tracking.OUTAGE_S))
    exp_id = tracking.retry(tracking.setup_experiment, cfg.tracking.uri, cfg.experiment_name, cfg.tracking.artifact_root)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    params = {k: str(v)[:6000] for k, v in tracking.flatten(resolved).items()}
    name = point or str(cfg.algo.name)
    if len(name) > MAX_RUN_NAME:  # MLflow refuses longer run names: shortened, the whole one kept as a tag
        import hashlib

        full, name = name, f"{name[:MAX_RUN_NAME - 20]}...{hashlib.sha256(name.encode()).hexdigest()[:12]}"
        log.warning("point name shortened to %r (%d characters; the full name is in the tag rlvr.point)", name, len(full))
    tags = {tracking.TAG_HASH: chash, tracking.TAG_TRAIN_HASH: thash, "rlvr.algo": str(cfg.algo.name), "rlvr.host": socket.gethostname(),
            "rlvr.git_commit": git_commit(), "rlvr.sweep_id": sweep_id, "rlvr.job_num": str(job_num),
            "rlvr.slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
            "rlvr.requeue_count": os.environ.get("SLURM_RESTART_COUNT", "0"), "rlvr.point": (point or name)[:4900],
            **provenance.tags(cfg.eval)}
    if warnings:
        tags["rlvr.warnings"] = " | ".join(warnings)[:5000]
    tags |= mlflow_views.parent_tags(exp_id, sweep_id)  # nested under the sweep's run (a resumed run moves to this sweep)
    signals = StopSignals()
    pt = Point(cfg, exp_id, chash, sweep_id, job_num, name, tags, params,
               stale_s=float(cfg.tracking.get("lease_stale_s", 300)), force=bool(cfg.get("force", False)),
               run_dir=run_dir, signals=signals)
    signals.install()
    try:
        while True:  # a point whose run gave way to an identical one started first is decided again
            out = _run_point(pt)
            if out is not None:
                return out
    finally:
        signals.restore()


@dataclass
class _Started:
    """A point's MLflow run, open: where it writes, what it already logged, what it takes over."""

    run_id: str
    run_dir: Path
    logged_through: int   # the last training step the store holds (resume), -1 for a new run
    active_before: float  # seconds the run was active before this job (resume)
    recover: object = None  # a finished run whose checkpoint this one takes (decision.run), or None
    reuse: str | None = None
    active: object = None  # MLflow's ActiveRun


def _run_point(pt: Point) -> dict | None:
    """One run of point ``pt``: decide, open its run (resume or new), train (or take a checkpoint), evaluate and
    log. Returns the point's summary, or None when its new run gave way to an identical point's earlier run and was
    deleted (decide again)."""
    decision = decide(pt)
    if decision.action == "duplicate":
        return decision.summary
    client = MlflowClient()
    try:
        st = _start_run(pt, decision, client)
    except _Yield as y:  # an identical point started at the same moment, and first (this run is still active)
        return _yield_to(y.run, pt, mlflow.active_run().info.run_id)
    st.run_dir.mkdir(parents=True, exist_ok=True)
    (st.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(
        {k: v for k, v in OmegaConf.to_container(pt.cfg, resolve=True).items() if k != "hydra"}))
    pt.signals.install_preemption()
    beat = lease.Heartbeat(client, st.run_id)
    beat.start()
    metrics_out = tracking.MetricBuffer(client, st.run_id, st.run_dir / UNSENT)
    monitor = mlflow_views.system_metrics(pt.cfg, st.run_id).__enter__()
    t0 = time.time()

    def log_step(m, step):
        # by run id, not the active run: MLflow's active run is per thread, and the verl engine logs from its own
        beat.nudge()
        if step > st.logged_through:  # a step replayed from an older saved state is not logged twice
            metrics_out.put(m, step)  # sent in order by its own thread: training never waits on the store

    def active_s() -> str:
        return f"{st.active_before + time.time() - t0:.1f}"
    yield_to = None
    try:
        metrics = _train_and_evaluate(pt, decision, st, client, log_step, metrics_out)
    except _Yield as y:
        beat.stop.set()
        yield_to = y.run
    except BaseException as e:
        _end_interrupted_run(pt, st, e, metrics_out, active_s, beat)
        raise
    finally:
        beat.stop.set()
        metrics_out.close()  # what is still queued is sent, or kept in UNSENT for the resumed run
        monitor.__exit__(None, None, None)
    if yield_to is not None:
        log.info("point %s: run %s of the same point started first: yielding to it", pt.name, yield_to.info.run_id)
        return _yield_to(yield_to, pt, st.run_id)
    tracking.retry(mlflow.set_tags, {"rlvr.active_s": active_s(), mlflow_views.NOTE_TAG: mlflow_views.describe(
        pt.cfg, pt.tags.get("rlvr.point", pt.name), metrics, sweep_id=pt.tags.get("rlvr.sweep_id"))})
    mlflow.end_run()
    log.info("point %s finished: MLflow run %s", pt.name, st.run_id)
    return {"status": "finished", "run_id": st.run_id, "config_hash": pt.chash, "metrics": metrics}


def _start_run(pt: Point, decision, client) -> _Started:
    """The point's MLflow run, started (the active run): the run ``decision`` resumes, with the metrics the store
    missed sent and its tags brought up to date (requeue count, owner, what changed in its provenance); or a new run
    with the point's tags and parameters, marked as taking a recovered run's checkpoint when ``decision`` says so.

    Raises:
        _Yield: a new run found an identical point's run that started first (this run is still active).
    """
    owner = decision.owner
    if decision.action == "resume":
        resume = decision.run
        run_dir = Path(resume.data.tags.get("rlvr.run_dir") or pt.run_dir)
        if n := tracking.send_unsent(client, resume.info.run_id, run_dir / UNSENT):
            log.info("point %s: sent %d metrics the store missed before the run stopped", pt.name, n)
        hist = tracking.retry(client.get_metric_history, resume.info.run_id, "train/reward_mean")
        logged_through = max((m.step for m in hist), default=-1)
        active = mlflow.start_run(run_id=resume.info.run_id)
        requeues = int(resume.data.tags.get("rlvr.requeue_count", "0") or 0) + 1
        tags = pt.tags
        tracking.retry(mlflow.set_tags, {k: v for k, v in tags.items() if k != "rlvr.requeue_count"}
                       | {"rlvr.requeue_count": str(max(requeues, int(tags["rlvr.requeue_count"])))}
                       | lease.owner_tags(owner) | provenance.changes(resume.data.tags, tags))
        log.info("point %s: resuming MLflow run %s from %s (metrics logged through step %d)",
                 pt.name, resume.info.run_id, run_dir, logged_through)
        return _Started(active.info.run_id, run_dir, logged_through,
                        float(resume.data.tags.get("rlvr.active_s", "0") or 0), active=active)
    recover, reuse = decision.run, decision.reuse
    active = mlflow.start_run(experiment_id=pt.exp_id, run_name=pt.name,
                              tags={**pt.tags, tracking.TAG_KIND: "trained", "rlvr.run_dir": str(pt.run_dir),
                                    **lease.owner_tags(owner)})
    tracking.retry(mlflow.log_params, pt.params)
    # an identical point may have started at the same moment, here or in another sweep: the earliest run trains
    # (or one with the same training and another evaluation: it trains, this point then evaluates its checkpoint)
    earlier = [] if pt.force else _earlier_runs(pt.exp_id, pt.chash, pt.tags, active, pt.stale_s, recover is None)
    if earlier:
        raise _Yield(earlier[0])
    if recover is not None:
        tracking.retry(mlflow.set_tag, tracking.TAG_TRAINED_IN if reuse == "evaluation" else "rlvr.recovered_from",
                       recover.info.run_id)
    return _Started(active.info.run_id, pt.run_dir, -1, 0.0, recover, reuse, active)


def _train_and_evaluate(pt: Point, decision, st: _Started, client, log_step, metrics_out) -> dict:
    """The point's work inside its open run: the config and (with uncommitted code) the diff logged, the datasets,
    the base model's evaluation started, training (or the recovered run's checkpoint and metrics taken), then the
    checkpoint's evaluation and the integrity record. Returns the evaluation's metrics.

    Raises:
        _Yield: an identical point's run, visible only now, started first.
    """
    import training
    from core.lifecycle import TRAINING, final_checkpoint_dir
    from core.tasks import load_prompts
    from evaluation.evaluate import benchmark_rows
    from training.token_probs import ARTIFACT as TOKEN_PROBS

    cfg, run_dir = pt.cfg, st.run_dir
    tracking.retry(mlflow.log_artifact, str(run_dir / "config.yaml"))
    if pt.tags.get(provenance.TAG_PREFIX + "git_dirty") == "true":  # the code the run ran, not only its commit
        (run_dir / "git_diff.patch").write_text(provenance.git_diff() or "")
        tracking.retry(mlflow.log_artifact, str(run_dir / "git_diff.patch"))
    heldout = load_prompts(cfg.data, "eval")
    bench = benchmark_rows(cfg.eval, heldout)  # unreadable benchmark files fail here, before any training
    mlflow_views.log_datasets(st.run_id, cfg.data, load_prompts(cfg.data, "train"), bench, cfg.eval)
    base = None
    if bool(cfg.eval.get("base", True)):
        from .base_model import BaseEvaluation

        base = BaseEvaluation(cfg, pt.exp_id, pt.sweep_id, pt.job_num, Path(pt.sweep_id) if pt.sweep_id else run_dir,
                              heldout)
        base.ensure(wait=False)  # evaluated here now, unless another job already is
    if st.recover is not None:
        _recover_from(st.recover, run_dir)
        last = _copy_train_metrics(client, st.recover.info.run_id, st.run_id)
        log.info("point %s: training metrics (steps 0-%d) and checkpoint taken from run %s%s", pt.name, last,
                 st.recover.info.run_id, " (trained there; this run evaluates it)" if st.reuse == "evaluation" else "")
        ckpt = final_checkpoint_dir(run_dir)
    else:
        # an identical point created at the same moment may only now be visible (its row committed after this
        # one's, though started first): the earliest still trains, the other yields before training
        earlier = [] if pt.force or decision.action != "new" else _earlier_runs(
            pt.exp_id, pt.chash, pt.tags, st.active, pt.stale_s, True)
        if earlier:
            raise _Yield(earlier[0])
        TRAINING.set()
        try:
            ckpt = training.train(cfg, run_dir, log_metrics=log_step, logged_through=st.logged_through)
        finally:
            TRAINING.clear()
            _tag_rollout(run_dir)
        metrics_out.flush()  # every training step's metrics are in the store before evaluation starts
        if (run_dir / TOKEN_PROBS).is_file():  # the sampled tokens' mean probabilities (TR-GRPO's Fig. 1)
            tracking.retry(mlflow.log_artifact, str(run_dir / TOKEN_PROBS))
    tracking.retry(mlflow.set_tag, "rlvr.checkpoint", str(ckpt))
    _free_memory()
    metrics = evaluate_run(cfg, run_dir, ckpt, heldout, base)
    tracking.retry(mlflow.log_artifact, str(record_integrity(run_dir, ckpt)))
    return metrics


def _end_interrupted_run(pt: Point, st: _Started, e: BaseException, metrics_out, active_s, beat) -> None:
    """How a point's run ends when its work raised ``e`` (the caller re-raises it, or what this raises).

    A preemption (:class:`core.lifecycle.Preempted`, the state saved): under SLURM the run stays RUNNING for the
    requeued job and submitit requeues it (re-raised); elsewhere the run is KILLED and :class:`Interrupted` raised.
    Any other error: the traceback logged, the run FAILED (KILLED for Ctrl-C, raised as :class:`Interrupted`)."""
    from core.lifecycle import STOP_REQUESTED, Interrupted, Preempted

    if isinstance(e, Preempted):
        log.warning("point %s: %s", pt.name, e)
        metrics_out.close()  # the completed steps' metrics reach the store (or UNSENT) before the run is marked
        tracking.retry(mlflow.set_tag, "rlvr.active_s", active_s())
        if "SLURM_JOB_ID" in os.environ:
            # state saved: leave the run RUNNING for the requeued job, and let submitit requeue us
            log.warning("point %s preempted; state saved in %s", pt.name, st.run_dir)
            pt.signals.hand_on_preemption()
            return
        beat.stop.set()
        STOP_REQUESTED.clear()
        mlflow.end_run(status="KILLED")
        raise Interrupted(pt.signals.signum, state_saved=True, where=f"run {st.run_id}") from None
    beat.stop.set()
    metrics_out.close()
    killed = isinstance(e, KeyboardInterrupt)
    try:
        (st.run_dir / "traceback.txt").write_text(traceback.format_exc())
        tracking.retry(mlflow.log_artifact, str(st.run_dir / "traceback.txt"))
    except Exception as e2:  # a full disk or a lost store: the original error is what matters
        log.error("could not save the traceback of run %s: %s", st.run_id, e2)
    finally:
        try:
            mlflow.set_tag("rlvr.active_s", active_s())
        except Exception:
            pass
        try:
            mlflow.end_run(status="KILLED" if killed else "FAILED")
        except Exception as e3:
            log.error("could not mark run %s %s: %s", st.run_id, "KILLED" if killed else "FAILED", e3)
    if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
        raise Interrupted(signal.SIGINT, where=f"run {st.run_id}") from None
    if isinstance(e, Interrupted):
        e.where = f"run {st.run_id}"


def record_integrity(run_dir: Path, ckpt: Path) -> Path:
    """Write ``run_dir/integrity.json`` (:mod:`orchestrator.integrity`) for the files this run logged and the
    checkpoints and samples later stages read; returns its path."""
    artifacts = {"config.yaml": run_dir / "config.yaml"}
    run_files = integrity.hash_tree(Path(ckpt), "checkpoint") if Path(ckpt) == run_dir / "checkpoint" else {}
    from core.lifecycle import saved_checkpoints

    for step, path in saved_checkpoints(run_dir):
        run_files |= integrity.hash_tree(path, f"checkpoints/step_{step}")
    for marker in sorted((run_dir / "eval").rglob(".logged")) if (run_dir / "eval").is_dir() else []:
        out_dir = marker.parent
        rel = out_dir.relative_to(run_dir / "eval").as_posix()
        prefix = "" if rel == "." else f"eval/{rel}/"
        for f in sorted(out_dir.iterdir()):
            if f.is_file() and not f.name.startswith(".") and f.suffix in (".parquet", ".csv"):
                artifacts[prefix + f.name] = f
        run_files[f"eval/{'' if rel == '.' else rel + '/'}samples.parquet"] = integrity.sha256(out_dir / "samples.parquet")
    return integrity.write_record(run_dir, artifacts, run_files)


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


def checkpoints_to_evaluate(cfg, run_dir: Path, final: Path, final_step: int | None = None
                            ) -> list[tuple[int, Path, Path, bool]]:
    """``[(step, checkpoint, evaluation folder, is_final), ...]``: with ``eval.checkpoints=all`` every kept
    checkpoint (``train.save_every``) in ``run_dir/eval/step_<N>``, then the final one in ``run_dir/eval``;
    ``step`` is the number of training steps behind the checkpoint (the final: ``final_step``, by default
    ``train.steps``; with ``eval.select_on=validation`` the chosen checkpoint's)."""
    from core.lifecycle import saved_checkpoints

    out = []
    if str(cfg.eval.get("checkpoints", "final")) == "all":
        out = [(s, p, run_dir / "eval" / f"step_{s}", False) for s, p in saved_checkpoints(run_dir) if s < int(cfg.train.steps)]
    step = int(cfg.train.steps) if final_step is None else int(final_step)
    return out + [(step, Path(final), run_dir / "eval", True)]


def select_on_validation(cfg, run_dir: Path, final: Path) -> tuple[int, Path]:
    """The checkpoint the benchmarks evaluate under ``eval.select_on=validation``: every kept checkpoint
    (``train.save_every``) and the final one are sampled ``eval.validation.n`` times on each prompt of the
    validation split (``data.validation_prompts`` training prompts held out of training, :func:`core.tasks.load_prompts`);
    the one with the highest unbiased pass@k (``k = eval.validation.k``) is chosen, the earliest on a tie. Each
    score is logged to the active run as ``val/pass_at_<k>`` at its step (once; its samples kept in
    ``run_dir/validation/step_<N>``), and the choice as the tags ``rlvr.selected_step`` and ``rlvr.selected_on``.
    With ``train.keep_top_k = K`` only the K best kept checkpoints stay on disk afterwards (the final one, which
    the run's record points to, always stays). The benchmarks never take part in the choice (understand-r1-zero#21).

    Returns:
        (step, checkpoint folder) of the chosen checkpoint.
    """
    from core.lifecycle import saved_checkpoints
    from core.tasks import load_prompts
    from evaluation.evaluate import evaluate_checkpoint

    steps, n, k = int(cfg.train.steps), int(cfg.eval.validation.n), int(cfg.eval.validation.k)
    task = str(cfg.data.name)
    rows = {task: load_prompts(cfg.data, "validation")}
    vcfg = OmegaConf.merge(cfg.eval, {"benchmarks": [task], "n": n, "ks": [k], "decoding": None,
                                      "extra_temperatures": [], "entropy": False, "max_prompts": None})
    chat = bool(cfg.model.get("chat_template", True))
    cands = [(s, p) for s, p in saved_checkpoints(run_dir) if s < steps] + [(steps, Path(final))]
    scores = {}
    for step, path in cands:
        out_dir = run_dir / "validation" / f"step_{step}"
        metrics, _, _ = evaluate_checkpoint(path, vcfg, out_dir, None, chat, temperatures=False,
                                            tools_cfg=cfg.get("tools"), rows=rows)
        scores[step] = float(metrics[f"eval/{task}/pass_at_{k}"])
        if not (out_dir / ".logged").exists():
            tracking.retry(mlflow.log_metrics, {f"val/pass_at_{k}": scores[step]}, step=step)
            (out_dir / ".logged").write_text(str(step))
        log.info("validation: step %d pass@%d %.4f (%d prompts x %d samples)", step, k, scores[step], len(rows[task]), n)
    ranked = sorted(cands, key=lambda c: (-scores[c[0]], c[0]))
    best_step, best = ranked[0]
    tracking.retry(mlflow.set_tags, {"rlvr.selected_step": str(best_step), "rlvr.selected_on":
                                     f"validation pass@{k}: {len(rows[task])} held-out {task} prompts x {n} samples"})
    keep = cfg.train.get("keep_top_k")
    if keep:
        for step, path in ranked[int(keep):]:
            if step != steps:
                shutil.rmtree(path, ignore_errors=True)
    log.info("validation: step %d chosen of %s", best_step, [s for s, _ in cands])
    return best_step, Path(best)


def _log_files(files: dict, prefix: str | None) -> None:
    for rel, f in files.items():
        sub = str(Path(rel).parent)
        dest = "/".join(x for x in (prefix, None if sub == "." else sub) if x)
        tracking.retry(mlflow.log_artifact, str(f), dest or None)


def evaluate_run(cfg, run_dir: Path, final: Path, heldout, base=None) -> dict:
    """Evaluate a trained run's checkpoints (:func:`checkpoints_to_evaluate`) and log each to the active MLflow
    run at its training step, so MLflow draws every evaluation metric against steps; then, with ``base`` (an
    :class:`orchestrator.base_model.BaseEvaluation`), wait for the base model's samples and log every evaluation's
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
    final_step = None
    if str(cfg.eval.get("select_on", "final")) == "validation":
        final_step, final = select_on_validation(cfg, run_dir, final)
    for step, path, out_dir, is_final in checkpoints_to_evaluate(cfg, run_dir, final, final_step):
        metrics, files, info = evaluate_checkpoint(path, cfg.eval, out_dir, heldout, chat, temperatures=is_final,
                                                   tools_cfg=cfg.get("tools"), score_budget=_token_budget(cfg))
        if is_final:
            final_metrics = dict(metrics)
            tracking.retry(mlflow.set_tags, {"rlvr.sampler": info["sampler"], "rlvr.entropy_method": str(info["entropy_method"])})
        if not (out_dir / ".logged").exists():
            tracking.retry(mlflow.log_metrics, metrics | {"time/eval_s": info["eval_time_s"]}
                           | {f"time/eval_{k}": v for k, v in info.get("phases", {}).items()}, step=step)
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

    from .base_model import BaseEvaluation

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
