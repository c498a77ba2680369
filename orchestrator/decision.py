"""What to do with a sweep point before it trains: the point (:class:`Point`), the decision (:class:`Decision`,
:func:`decide`), and the runs an identical point started first (:func:`earlier_runs`, :func:`yield_to`).

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
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from . import integrity, lease, mlflow_views, tracking
from .run_evaluation import backfill_flips
from .signals import StopSignals

log = logging.getLogger("rlvr")
POLL_S = 3.0  # how often a point waits on another process that trains it


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
    outage_s: float = tracking.DEFAULT_OUTAGE_S  # a store call waits out an outage this long (tracking.outage_s)


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


def _record_duplicate(exp_id, name, tags, params, of_run_id, chash, why, cfg=None, *, outage_s: float) -> dict:
    with mlflow.start_run(experiment_id=exp_id, run_name=name, tags={
        **tags, tracking.TAG_KIND: "duplicate", tracking.TAG_DUP_OF: of_run_id, "mlflow.note.content": why,
    }) as r:
        tracking.retry(mlflow.log_params, params, outage_s=outage_s)
        if cfg is not None:
            _log_datasets(cfg, r.info.run_id, outage_s)
    log.info("point %s: %s (recorded as duplicate %s)", name, why, r.info.run_id)
    return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": of_run_id, "config_hash": chash}


def _log_datasets(cfg, run_id: str, outage_s: float) -> None:
    """The run's training prompts and evaluation benchmarks as MLflow datasets (:func:`orchestrator.mlflow_views.log_datasets`)."""
    try:
        from core.tasks import load_prompts
        from evaluation.evaluate import benchmark_rows

        heldout = load_prompts(cfg.data, "eval")
        mlflow_views.log_datasets(run_id, cfg.data, load_prompts(cfg.data, "train"), benchmark_rows(cfg.eval, heldout),
                                  cfg.eval, outage_s)
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


def _invalidate(client, run, why: str, outage_s: float) -> None:
    tracking.retry(client.set_tag, run.info.run_id, "rlvr.invalid", why[:4900], outage_s=outage_s)
    tracking.retry(client.set_terminated, run.info.run_id, "KILLED", outage_s=outage_s)


def decide(pt: Point) -> Decision:
    """Decide what to do with point ``pt`` (see the module docstring): waits while an identical point's run is live
    elsewhere, and returns a :class:`Decision`.

    Raises:
        core.lifecycle.Interrupted: a stop was requested while waiting.
    """
    cfg, exp_id, chash, sweep_id, job_num, name, tags, params, stale_s, force, run_dir = (
        pt.cfg, pt.exp_id, pt.chash, pt.sweep_id, pt.job_num, pt.name, pt.tags, pt.params, pt.stale_s, pt.force, pt.run_dir)
    outage_s = pt.outage_s
    client = MlflowClient()
    owner, recover, waited = lease.new_owner(), None, None
    from core.lifecycle import STOP_REQUESTED

    while not force:
        if STOP_REQUESTED.is_set():
            from core.lifecycle import Interrupted

            raise Interrupted(pt.signals.signum)
        prior = tracking.retry(tracking.find_finished_run, exp_id, chash, outage_s=outage_s)
        if prior is not None:
            problems, ckpt_ok = integrity.verify_run(client, prior)
            if not problems:
                out = _record_duplicate(exp_id, name, tags, params, prior.info.run_id, chash,
                                        f"identical effective config to finished run {prior.info.run_id}; not trained again",
                                        cfg, outage_s=outage_s)
                if bool(cfg.eval.get("base", True)) and not prior.data.tags.get("rlvr.base_run_id"):
                    backfill_flips(cfg, exp_id, sweep_id, job_num, run_dir, prior, outage_s)
                return Decision("duplicate", summary=out)
            for p in problems:
                log.warning("point %s: finished run %s is not trusted: %s", name, prior.info.run_id, p)
            log.warning("point %s: %s", name, "re-evaluating its checkpoint in a new run" if ckpt_ok else
                        "its checkpoint is bad: training again in a new run")
            _invalidate(client, prior, "; ".join(problems), outage_s)
            recover = prior if ckpt_ok else None
            continue
        thash = tags.get(tracking.TAG_TRAIN_HASH)
        if recover is None and thash:
            source = _trained_checkpoint(client, exp_id, thash, sweep_id, name, outage_s)
            if source is not None and source.data.tags.get(tracking.TAG_HASH) == chash:
                continue  # this very point finished since the look above: recorded as its duplicate next time round
            if source is not None:
                return Decision("new", owner, source, "evaluation")
        same = tracking.retry(tracking.runs_with_hash, exp_id, chash, outage_s=outage_s)
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
                    f"identical to point {r.data.tags.get('rlvr.job_num')} of this sweep, run {r.info.run_id}", cfg,
                    outage_s=outage_s))
        if not live and thash:  # the same checkpoint is being trained for another evaluation: wait, then evaluate it
            live = [r for r in tracking.retry(tracking.runs_with_hash, exp_id, thash, tag=tracking.TAG_TRAIN_HASH,
                                              outage_s=outage_s)
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
            token = lease.claim(client, r.info.run_id, owner, outage_s)
            if token is None:
                continue  # another process claimed it at the same moment: it is live now
            for other in candidates[:-1]:
                if other.info.status == "RUNNING":
                    tracking.retry(client.set_terminated, other.info.run_id, "KILLED", outage_s=outage_s)
            old_dir = safe_run_dir(r.data.tags.get("rlvr.run_dir"), sweep_id)
            hist = tracking.retry(client.get_metric_history, r.info.run_id, "train/reward_mean", outage_s=outage_s)
            if old_dir is not None and (has_saved_state(cfg, old_dir) or not hist):
                return Decision("resume", owner, r)
            why = ("its run folder lies outside this sweep's folders" if old_dir is None and r.data.tags.get("rlvr.run_dir")
                   else "it logged training steps but left no saved state (set train.checkpoint_every=N to keep one)")
            log.warning("point %s: not resuming run %s: %s; it is marked KILLED and the point starts again in a new run",
                        name, r.info.run_id, why)
            tracking.retry(client.set_tag, r.info.run_id, "rlvr.invalid", f"not resumed: {why}", outage_s=outage_s)
            tracking.retry(client.set_terminated, r.info.run_id, "KILLED", outage_s=outage_s)
            continue
        break
    return Decision("new", owner, recover, "recovered" if recover is not None else None)


class Yield(Exception):
    """Raised inside a point's run when an identical point's run turned out to have started first."""

    def __init__(self, run):
        super().__init__(run.info.run_id)
        self.run = run


def earlier_runs(exp_id: str, chash: str, tags: dict, active, stale_s: float, with_training: bool,
                 outage_s: float) -> list:
    """Live RUNNING runs of this point (same config hash) started before ``active``, and with ``with_training`` those
    training the same checkpoint for another evaluation (same training hash), earliest first."""
    mine = (active.info.start_time, active.info.run_id)
    same = list(tracking.retry(tracking.runs_with_hash, exp_id, chash, outage_s=outage_s))
    if with_training and tags.get(tracking.TAG_TRAIN_HASH):
        same += [r for r in tracking.retry(tracking.runs_with_hash, exp_id, tags[tracking.TAG_TRAIN_HASH],
                                           tag=tracking.TAG_TRAIN_HASH, outage_s=outage_s)
                 if r.data.tags.get(tracking.TAG_HASH) != chash and _trains(r)]
    return sorted((r for r in same if r.info.run_id != active.info.run_id and r.info.status == "RUNNING"
                   and lease.is_live(r, stale_s) and (r.info.start_time, r.info.run_id) < mine),
                  key=lambda r: (r.info.start_time, r.info.run_id))


def yield_to(earlier, pt: Point, run_id: str) -> dict | None:
    """This point's run ``run_id`` gives way to ``earlier``: recorded as its duplicate when it is the same point of
    the same sweep (returns the point's summary), else deleted (returns None: the point is decided again, and then
    waits for ``earlier``)."""
    client = MlflowClient()
    name, chash = pt.name, pt.chash
    if earlier.data.tags.get("rlvr.sweep_id") == pt.sweep_id and earlier.data.tags.get(tracking.TAG_HASH) == chash:
        tracking.retry(client.set_tag, run_id, tracking.TAG_KIND, "duplicate", outage_s=pt.outage_s)
        tracking.retry(client.set_tag, run_id, tracking.TAG_DUP_OF, earlier.info.run_id, outage_s=pt.outage_s)
        mlflow.end_run()
        log.info("point %s: identical to run %s started just before: recorded as duplicate", name, earlier.info.run_id)
        return {"status": "duplicate", "run_id": run_id, "duplicate_of": earlier.info.run_id, "config_hash": chash}
    mlflow.end_run()
    tracking.retry(client.delete_run, run_id,
                   outage_s=pt.outage_s)  # another sweep (or another evaluation) owns the training: wait for it
    return None


def _trains(run) -> bool:
    """Whether a trained-kind run trains its checkpoint (not one that evaluates another run's, or recovers one)."""
    return not (run.data.tags.get(tracking.TAG_TRAINED_IN) or run.data.tags.get("rlvr.recovered_from"))


def _trained_checkpoint(client, exp_id: str, thash: str, sweep_id: str, name: str, outage_s: float):
    """The earliest FINISHED run with training hash ``thash`` (:func:`orchestrator.identity.training_hash`) whose
    checkpoint is intact (:func:`integrity.verify_run`) and lies in a folder this sweep may read
    (:func:`safe_run_dir`), or None: a point that differs from it only in its ``eval`` settings evaluates that
    checkpoint instead of training again."""
    for r in tracking.retry(tracking.runs_with_hash, exp_id, thash, tag=tracking.TAG_TRAIN_HASH, outage_s=outage_s):
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

