"""What to do with a sweep point before it trains: the point (:class:`Point`), the decision (:class:`Decision`,
:func:`decide`), and the runs an identical point started first (:func:`earlier_runs`, :func:`yield_to`).

Identity and idempotence, by the hash of the effective config (``rlvr.config_hash``):
- a FINISHED trained run with the same hash exists: this point is recorded as a duplicate of it;
- an unfinished one (RUNNING or KILLED: preempted, requeued, interrupted) from this job or from an
  earlier sweep: it is resumed, same MLflow run, from its saved state;
- an identical point of the *same* sweep is running concurrently (SLURM): the one created first trains,
  the other is recorded as its duplicate;
- a FINISHED run with the same *training* hash (:func:`orchestrator.point.identity.training_hash`: only the ``eval``
  settings differ, e.g. ``eval.seed=0,1,2``) and an intact checkpoint: a new run evaluates that checkpoint (tag
  ``rlvr.trained_in``, training metrics copied); while such a run is still training, the point waits for it;
- ``+force=true`` trains a new run regardless.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
from omegaconf import DictConfig

from core import tags as T

from orchestrator.point import integrity
from orchestrator.store import lease
from orchestrator.store import mlflow_views
from orchestrator.store import tracking
from orchestrator.point.run_evaluation import backfill_flips
from orchestrator.point.signals import StopSignals

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
    store: tracking.Store = field(default_factory=tracking.Store)  # every store call of the point goes through it


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


def _record_duplicate(pt: Point, of_run_id: str, why: str) -> dict:
    """Record point ``pt`` as a duplicate of run ``of_run_id`` (a new run of kind ``duplicate``, with ``why`` as its
    note, the point's parameters and datasets); the point's summary."""
    with mlflow.start_run(experiment_id=pt.exp_id, run_name=pt.name, tags={
        **pt.tags, T.KIND: "duplicate", T.DUPLICATE_OF: of_run_id, "mlflow.note.content": why,
    }) as r:
        pt.store.log_params(pt.params)
        _log_datasets(pt, r.info.run_id)
    log.info("point %s: %s (recorded as duplicate %s)", pt.name, why, r.info.run_id)
    return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": of_run_id, "config_hash": pt.chash}


def _log_datasets(pt: Point, run_id: str) -> None:
    """The run's training prompts and evaluation benchmarks as MLflow datasets (:func:`orchestrator.store.mlflow_views.log_datasets`)."""
    cfg = pt.cfg
    try:
        from core.tasks import load_prompts
        from evaluation.pipeline import benchmark_rows

        heldout = load_prompts(cfg.data, "eval")
        mlflow_views.log_datasets(run_id, cfg.data, load_prompts(cfg.data, "train"), benchmark_rows(cfg.eval, heldout),
                                  cfg.eval, pt.store)
    except Exception as e:  # bad data fails the point later, with its own message
        log.warning("run %s: datasets not logged: %s: %s", run_id, type(e).__name__, e)


def has_saved_state(cfg, run_dir: Path) -> bool:
    """Whether the engine left a full training state in ``run_dir`` to resume from (engine's ``has_state``)."""
    from training.engines import engine

    return bool(engine(str(cfg.engine.name)).has_state(run_dir))


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


# ---------------------------------------------------------------------------------------------------- the rules
_AGAIN = "again"  # a rule saw the store change under it (or waits): the point is decided again from the first rule


@dataclass
class _Deciding:
    """What one decision carries from rule to rule: this process's lease token, a finished run whose good checkpoint
    a new run re-evaluates, the run waited for (logged once), and what the look at the point's unfinished runs found
    in this pass."""

    owner: str
    recover: object = None
    waited: str | None = None
    candidates: list = field(default_factory=list)  # RUNNING, KILLED or SCHEDULED runs of this point, oldest first
    live: list = field(default_factory=list)  # those held by a live lease elsewhere


def decide(pt: Point) -> Decision:
    """Decide what to do with point ``pt`` (see the module docstring) by its rules, in order, each pass from the
    first: trust a finished run (:func:`_trust_finished_run`), reuse a checkpoint trained for another evaluation
    (:func:`_reuse_trained_checkpoint`), record an identical point of this sweep as a duplicate
    (:func:`_duplicate_within_sweep`), wait for a live run (:func:`_wait_for_live_run`), take over an unfinished
    run (:func:`_take_over_unfinished`); when none applies, a new run. A rule returns a :class:`Decision`, ``_AGAIN``
    (the store changed under it, or it waited: decide again) or None (it does not apply).

    Raises:
        core.lifecycle.Interrupted: a stop was requested while waiting.
    """
    from core.lifecycle import STOP_REQUESTED, Interrupted

    st = _Deciding(lease.new_owner())
    while not pt.force:
        if STOP_REQUESTED.is_set():
            raise Interrupted(pt.signals.signum)
        for rule in _RULES:
            out = rule(pt, st)
            if out is not None:
                break
        if isinstance(out, Decision):
            return out
        if out is None:
            break
    return Decision("new", st.owner, st.recover, "recovered" if st.recover is not None else None)


def _trust_finished_run(pt: Point, st: _Deciding):
    """A FINISHED trained run of this point whose files are intact: the point is its duplicate (the flip rates
    against the base model filled in when it has none). One that is not intact is marked invalid; its checkpoint,
    when good, is re-evaluated by the new run (``st.recover``)."""
    prior = pt.store.finished_run(pt.exp_id, pt.chash)
    if prior is None:
        return None
    problems, ckpt_ok = integrity.verify_run(pt.store.client, prior)
    if not problems:
        out = _record_duplicate(pt, prior.info.run_id,
                                f"identical effective config to finished run {prior.info.run_id}; not trained again")
        if bool(pt.cfg.eval.get("base", True)) and not prior.data.tags.get(T.BASE_RUN_ID):
            backfill_flips(pt.cfg, pt.exp_id, pt.sweep_id, pt.job_num, pt.run_dir, prior, pt.store)
        return Decision("duplicate", summary=out)
    for p in problems:
        log.warning("point %s: finished run %s is not trusted: %s", pt.name, prior.info.run_id, p)
    log.warning("point %s: %s", pt.name, "re-evaluating its checkpoint in a new run" if ckpt_ok else
                "its checkpoint is bad: training again in a new run")
    pt.store.terminate(prior.info.run_id, "KILLED", "; ".join(problems))
    st.recover = prior if ckpt_ok else None
    return _AGAIN


def _reuse_trained_checkpoint(pt: Point, st: _Deciding):
    """A FINISHED run with the same training (only ``eval`` settings differ) and an intact checkpoint: a new run
    evaluates that checkpoint (:func:`_trained_checkpoint`)."""
    thash = pt.tags.get(T.TRAIN_HASH)
    if st.recover is not None or not thash:
        return None
    source = _trained_checkpoint(pt, thash)
    if source is None:
        return None
    if source.data.tags.get(T.CONFIG_HASH) == pt.chash:
        return _AGAIN  # this very point finished since the first rule looked: recorded as its duplicate next pass
    return Decision("new", st.owner, source, "evaluation")


def _duplicate_within_sweep(pt: Point, st: _Deciding):
    """Looks at this point's unfinished runs (kept in ``st`` for the rules after it). A run of it held live by
    another job of this sweep (SLURM: an identical point): this point is recorded as that run's duplicate."""
    same = pt.store.runs_with_hash(pt.exp_id, pt.chash)
    if any(r.info.status == "FINISHED" and not r.data.tags.get(T.INVALID) for r in same):
        return _AGAIN  # a run of this point finished between the two queries (it was live a moment ago): look again
    st.candidates = [r for r in same
                     if r.info.status in ("RUNNING", "KILLED", "SCHEDULED") and not r.data.tags.get(T.INVALID)]
    # this job's own earlier incarnation (a requeued SLURM job: same sweep, same job number) is never waited for
    st.live = [r for r in st.candidates if lease.is_live(r, pt.stale_s) and not (
        r.data.tags.get(T.SWEEP_ID) == pt.sweep_id and r.data.tags.get(T.JOB_NUM) == str(pt.job_num))]
    for r in st.live:
        if r.data.tags.get(T.SWEEP_ID) == pt.sweep_id and r.data.tags.get(T.JOB_NUM) != str(pt.job_num):
            return Decision("duplicate", summary=_record_duplicate(
                pt, r.info.run_id, f"identical to point {r.data.tags.get(T.JOB_NUM)} of this sweep, run {r.info.run_id}"))
    return None


def _wait_for_live_run(pt: Point, st: _Deciding):
    """A run of this point held live elsewhere, or (none) a live run training the same checkpoint for another
    evaluation: wait :data:`POLL_S` and decide again (its lease goes stale when its owner stops beating)."""
    thash = pt.tags.get(T.TRAIN_HASH)
    live = st.live
    if not live and thash:
        live = [r for r in pt.store.runs_with_hash(pt.exp_id, thash, tag=T.TRAIN_HASH)
                if r.info.status == "RUNNING" and _trains(r) and r.data.tags.get(T.CONFIG_HASH) != pt.chash
                and lease.is_live(r, pt.stale_s)]
    if not live:
        return None
    r = live[0]
    if st.waited != r.info.run_id:
        log.info("point %s: run %s is being trained by %s (pid %s); waiting for it (its lease goes stale "
                 "after %.0f s without a heartbeat)", pt.name, r.info.run_id, r.data.tags.get(T.HOST),
                 r.data.tags.get(T.PID), pt.stale_s)
        st.waited = r.info.run_id
    time.sleep(POLL_S)
    return _AGAIN


def _take_over_unfinished(pt: Point, st: _Deciding):
    """The newest unfinished run of this point, its lease stale: claimed (older RUNNING ones are ended) and resumed
    from its saved state; without one it is marked invalid and the point starts again in a new run."""
    if not st.candidates:
        return None
    store, r = pt.store, st.candidates[-1]
    if lease.claim(store, r.info.run_id, st.owner) is None:
        return _AGAIN  # another process claimed it at the same moment: it is live now
    for other in st.candidates[:-1]:
        if other.info.status == "RUNNING":
            store.terminate(other.info.run_id, "KILLED")
    old_dir = safe_run_dir(r.data.tags.get(T.RUN_DIR), pt.sweep_id)
    hist = store.metric_history(r.info.run_id, "train/reward_mean")
    if old_dir is not None and (has_saved_state(pt.cfg, old_dir) or not hist):
        return Decision("resume", st.owner, r)
    why = ("its run folder lies outside this sweep's folders" if old_dir is None and r.data.tags.get(T.RUN_DIR)
           else "it logged training steps but left no saved state (set train.checkpoint_every=N to keep one)")
    log.warning("point %s: not resuming run %s: %s; it is marked KILLED and the point starts again in a new run",
                pt.name, r.info.run_id, why)
    store.terminate(r.info.run_id, "KILLED", f"not resumed: {why}")
    return _AGAIN


_RULES = (_trust_finished_run, _reuse_trained_checkpoint, _duplicate_within_sweep, _wait_for_live_run,
          _take_over_unfinished)


class Yield(Exception):
    """Raised inside a point's run when an identical point's run turned out to have started first."""

    def __init__(self, run):
        super().__init__(run.info.run_id)
        self.run = run


def earlier_runs(pt: Point, active, with_training: bool) -> list:
    """Live RUNNING runs of point ``pt`` (same config hash) started before ``active`` (MLflow's active run), and with
    ``with_training`` those training the same checkpoint for another evaluation (same training hash), earliest
    first."""
    mine = (active.info.start_time, active.info.run_id)
    same = list(pt.store.runs_with_hash(pt.exp_id, pt.chash))
    if with_training and pt.tags.get(T.TRAIN_HASH):
        same += [r for r in pt.store.runs_with_hash(pt.exp_id, pt.tags[T.TRAIN_HASH], tag=T.TRAIN_HASH)
                 if r.data.tags.get(T.CONFIG_HASH) != pt.chash and _trains(r)]
    return sorted((r for r in same if r.info.run_id != active.info.run_id and r.info.status == "RUNNING"
                   and lease.is_live(r, pt.stale_s) and (r.info.start_time, r.info.run_id) < mine),
                  key=lambda r: (r.info.start_time, r.info.run_id))


def yield_to(earlier, pt: Point, run_id: str) -> dict | None:
    """This point's run ``run_id`` gives way to ``earlier``: recorded as its duplicate when it is the same point of
    the same sweep (returns the point's summary), else deleted (returns None: the point is decided again, and then
    waits for ``earlier``)."""
    if earlier.data.tags.get(T.SWEEP_ID) == pt.sweep_id and earlier.data.tags.get(T.CONFIG_HASH) == pt.chash:
        pt.store.set_tags({T.KIND: "duplicate", T.DUPLICATE_OF: earlier.info.run_id}, run_id)
        mlflow.end_run()
        log.info("point %s: identical to run %s started just before: recorded as duplicate", pt.name,
                 earlier.info.run_id)
        return {"status": "duplicate", "run_id": run_id, "duplicate_of": earlier.info.run_id, "config_hash": pt.chash}
    mlflow.end_run()
    pt.store.delete_run(run_id)  # another sweep (or another evaluation) owns the training: wait for it
    return None


def _trains(run) -> bool:
    """Whether a trained-kind run trains its checkpoint (not one that evaluates another run's, or recovers one)."""
    return not (run.data.tags.get(T.TRAINED_IN) or run.data.tags.get(T.RECOVERED_FROM))


def _trained_checkpoint(pt: Point, thash: str):
    """The earliest FINISHED run with training hash ``thash`` (:func:`orchestrator.point.identity.training_hash`) whose
    checkpoint is intact (:func:`integrity.verify_run`) and lies in a folder this sweep may read
    (:func:`safe_run_dir`), or None: a point that differs from it only in its ``eval`` settings evaluates that
    checkpoint instead of training again."""
    for r in pt.store.runs_with_hash(pt.exp_id, thash, tag=T.TRAIN_HASH):
        if r.info.status != "FINISHED" or r.data.tags.get(T.INVALID):
            continue
        folder = safe_run_dir(r.data.tags.get(T.RUN_DIR), pt.sweep_id)
        if folder is None or not (folder / "checkpoint").is_dir():
            log.info("point %s: run %s trained the same checkpoint but its folder is not readable here (%s)", pt.name,
                     r.info.run_id, r.data.tags.get(T.RUN_DIR))
            continue
        problems, ckpt_ok = integrity.verify_run(pt.store.client, r)
        if ckpt_ok:
            log.info("point %s: same training as run %s (only the evaluation differs): evaluating its checkpoint in "
                     "a new run", pt.name, r.info.run_id)
            return r
    return None
