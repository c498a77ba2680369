"""What to do with a sweep point before it trains: the point (:class:`Point`), the decision (:class:`Decision`,
:class:`Action`, :func:`decide`), and the runs an identical point started first (:func:`earlier_runs`; the run that
gives way to one: :func:`orchestrator.point.act.yield_to`).

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

Deciding and acting are apart: the rules here read the store and return a typed :class:`Decision` (an
:class:`Action`), writing nothing; :mod:`orchestrator.point.act` acts on it (records a duplicate, ends or claims a
run, waits) and decides again until the point is settled.
"""
from __future__ import annotations

import enum
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from core import tags as tag_names
from orchestrator.point import integrity
from orchestrator.point.signals import StopSignals
from orchestrator.store import lease, tracking

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
    store: tracking.Store  # every store call of the point goes through it (built once, from the config)


class Action(str, enum.Enum):
    """What a :class:`Decision` asks for. Three settle the point; the others change the store or wait, after which the
    point is decided again (:func:`orchestrator.point.act.settle`)."""

    NEW = "new"  # train (or take a checkpoint) in a new run
    RESUME = "resume"  # claim ``run``, an unfinished run of this point, and continue it from its saved state
    DUPLICATE = "duplicate"  # record the point as a duplicate of ``run``
    INVALIDATE = "invalidate"  # ``run``, a finished run whose files are not intact, is marked invalid (KILLED)
    DISCARD = "discard"  # claim ``run``, an unfinished run that cannot be resumed, and mark it invalid (KILLED)
    WAIT = "wait"  # ``run`` is trained by a live process elsewhere: wait :data:`POLL_S` for it
    AGAIN = "again"  # the store changed under a rule: decide again at once


@dataclass(frozen=True)
class Decision:
    """What to do with a point (:func:`decide`).

    action: an :class:`Action`.
    owner: this process's lease owner token for the run it trains, resumes or claims (``new``, ``resume``, ``discard``).
    run: the run the action is about (MLflow's ``Run``): ``resume``/``discard``: the unfinished run to claim;
        ``duplicate``: the run the point duplicates; ``invalidate``: the finished run not to trust; ``wait``: the live
        run; ``new``: when set, a finished run whose checkpoint the new run takes instead of training (``reuse`` =
        ``evaluation`` when only the evaluation settings differ, ``recovered`` when that run's results were corrupt
        but its checkpoint is good).
    reason: ``duplicate``: the record's note; ``invalidate``/``discard``: why the run is not trusted or resumed.
    end: ``resume``/``discard``: older RUNNING runs of the point, ended KILLED once the claim is won.
    recover: ``invalidate``: the run's checkpoint is good (the new run re-evaluates it).
    backfill: ``duplicate``: the run has no flip rates against the base model yet; they are added.
    summary: the point's summary, once a ``duplicate`` decision is acted on (:func:`orchestrator.point.act.settle`).
    """

    action: Action
    owner: str | None = None
    run: object = None
    reuse: str | None = None
    reason: str | None = None
    end: tuple = ()
    recover: bool = False
    backfill: bool = False
    summary: dict | None = None


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
@dataclass
class Deciding:
    """What one point's decisions carry from pass to pass (:func:`orchestrator.point.act.settle` keeps it): this
    process's lease token, a finished run whose good checkpoint a new run re-evaluates, the run waited for (logged
    once), and what the look at the point's unfinished runs found in the current pass (:func:`_look`)."""

    owner: str
    recover: object = None
    waited: str | None = None
    looked: bool = False  # the unfinished runs below are this pass's (reset by :func:`decide`)
    finished: bool = False  # a run of this point finished between two queries
    candidates: list = field(default_factory=list)  # RUNNING, KILLED or SCHEDULED runs of this point, oldest first
    live: list = field(default_factory=list)  # those held by a live lease elsewhere


def decide(pt: Point, st: Deciding) -> Decision:
    """One pass of the rules (:data:`RULES`), in order: trust a finished run (:func:`_trust_finished_run`), reuse a
    checkpoint trained for another evaluation (:func:`_reuse_trained_checkpoint`), record an identical point of this
    sweep as a duplicate (:func:`_duplicate_within_sweep`), wait for a live run (:func:`_wait_for_live_run`), take
    over an unfinished run (:func:`_take_over_unfinished`); the first that applies decides, and when none applies (or
    with ``+force=true``) the point trains in a new run. Reads the store, writes nothing: a rule returns a
    :class:`Decision` or None (it does not apply)."""
    if not pt.force:
        st.looked = False
        for rule in RULES:
            out = rule(pt, st)
            if out is not None:
                return out
    return Decision(Action.NEW, st.owner, st.recover, "recovered" if st.recover is not None else None)


def _trust_finished_run(pt: Point, st: Deciding) -> Decision | None:
    """A FINISHED trained run of this point whose files are intact: the point is its duplicate (``backfill``: its flip
    rates against the base model are missing). One that is not intact: ``invalidate`` it (``recover`` when its
    checkpoint is good: the new run re-evaluates it)."""
    prior = pt.store.finished_run(pt.exp_id, pt.chash)
    if prior is None:
        return None
    problems, ckpt_ok = integrity.verify_run(pt.store, prior)
    if not problems:
        return Decision(Action.DUPLICATE, run=prior,
                        reason=f"identical effective config to finished run {prior.info.run_id}; not trained again",
                        backfill=bool(pt.cfg.eval.get("base", True)) and not prior.data.tags.get(tag_names.BASE_RUN_ID))
    for p in problems:
        log.warning("point %s: finished run %s is not trusted: %s", pt.name, prior.info.run_id, p)
    return Decision(Action.INVALIDATE, run=prior, reason="; ".join(problems), recover=ckpt_ok)


def _reuse_trained_checkpoint(pt: Point, st: Deciding) -> Decision | None:
    """A FINISHED run with the same training (only ``eval`` settings differ) and an intact checkpoint: a new run
    evaluates that checkpoint (:func:`_trained_checkpoint`)."""
    thash = pt.tags.get(tag_names.TRAIN_HASH)
    if st.recover is not None or not thash:
        return None
    source = _trained_checkpoint(pt, thash)
    if source is None:
        return None
    if source.data.tags.get(tag_names.CONFIG_HASH) == pt.chash:
        return Decision(Action.AGAIN)  # this very point finished since the first rule looked: its duplicate next pass
    return Decision(Action.NEW, st.owner, source, "evaluation")


def _look(pt: Point, st: Deciding) -> None:
    """This pass's look at the point's runs (once per pass, kept in ``st``): whether one finished between the queries,
    the unfinished ones (oldest first) and those of them held live by another job (this job's own earlier
    incarnation, a requeued SLURM job of the same sweep and job number, is never live to it)."""
    if st.looked:
        return
    same = pt.store.runs_with_hash(pt.exp_id, pt.chash)
    st.finished = any(r.info.status == "FINISHED" and not r.data.tags.get(tag_names.INVALID) for r in same)
    st.candidates = [r for r in same
                     if r.info.status in ("RUNNING", "KILLED", "SCHEDULED") and not r.data.tags.get(tag_names.INVALID)]
    st.live = [r for r in st.candidates if lease.is_live(r, pt.stale_s) and not (
        r.data.tags.get(tag_names.SWEEP_ID) == pt.sweep_id and r.data.tags.get(tag_names.JOB_NUM) == str(pt.job_num))]
    st.looked = True


def _duplicate_within_sweep(pt: Point, st: Deciding) -> Decision | None:
    """Looks at this point's unfinished runs (:func:`_look`). A run of it held live by another job of this sweep
    (SLURM: an identical point): this point is recorded as that run's duplicate."""
    _look(pt, st)
    if st.finished:
        return Decision(Action.AGAIN)  # a run of this point finished between the two queries (live a moment ago)
    for r in st.live:
        if r.data.tags.get(tag_names.SWEEP_ID) == pt.sweep_id and r.data.tags.get(tag_names.JOB_NUM) != str(pt.job_num):
            return Decision(Action.DUPLICATE, run=r, reason=f"identical to point {r.data.tags.get(tag_names.JOB_NUM)} of this "
                                                            f"sweep, run {r.info.run_id}")
    return None


def _wait_for_live_run(pt: Point, st: Deciding) -> Decision | None:
    """A run of this point held live elsewhere, or (none) a live run training the same checkpoint for another
    evaluation: wait for it (its lease goes stale when its owner stops beating)."""
    _look(pt, st)
    thash = pt.tags.get(tag_names.TRAIN_HASH)
    live = st.live
    if not live and thash:
        live = [r for r in pt.store.runs_with_hash(pt.exp_id, thash, tag=tag_names.TRAIN_HASH)
                if r.info.status == "RUNNING" and _trains(r) and r.data.tags.get(tag_names.CONFIG_HASH) != pt.chash
                and lease.is_live(r, pt.stale_s)]
    return Decision(Action.WAIT, run=live[0]) if live else None


def _take_over_unfinished(pt: Point, st: Deciding) -> Decision | None:
    """The newest unfinished run of this point, its lease stale: to be claimed (older RUNNING ones ended) and resumed
    from its saved state; without one (or with its folder outside this sweep's folders) it is discarded, and the
    point starts again in a new run."""
    _look(pt, st)
    if not st.candidates:
        return None
    r = st.candidates[-1]
    end = tuple(o for o in st.candidates[:-1] if o.info.status == "RUNNING")
    old_dir = safe_run_dir(r.data.tags.get(tag_names.RUN_DIR), pt.sweep_id)
    hist = pt.store.metric_history(r.info.run_id, "train/reward_mean")
    if old_dir is not None and (has_saved_state(pt.cfg, old_dir) or not hist):
        return Decision(Action.RESUME, st.owner, r, end=end)
    why = ("its run folder lies outside this sweep's folders" if old_dir is None and r.data.tags.get(tag_names.RUN_DIR)
           else "it logged training steps but left no saved state (set train.checkpoint_every=N to keep one)")
    return Decision(Action.DISCARD, st.owner, r, reason=why, end=end)


RULES = (_trust_finished_run, _reuse_trained_checkpoint, _duplicate_within_sweep, _wait_for_live_run,
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
    if with_training and pt.tags.get(tag_names.TRAIN_HASH):
        same += [r for r in pt.store.runs_with_hash(pt.exp_id, pt.tags[tag_names.TRAIN_HASH], tag=tag_names.TRAIN_HASH)
                 if r.data.tags.get(tag_names.CONFIG_HASH) != pt.chash and _trains(r)]
    return sorted((r for r in same if r.info.run_id != active.info.run_id and r.info.status == "RUNNING"
                   and lease.is_live(r, pt.stale_s) and (r.info.start_time, r.info.run_id) < mine),
                  key=lambda r: (r.info.start_time, r.info.run_id))


def _trains(run) -> bool:
    """Whether a trained-kind run trains its checkpoint (not one that evaluates another run's, or recovers one)."""
    return not (run.data.tags.get(tag_names.TRAINED_IN) or run.data.tags.get(tag_names.RECOVERED_FROM))


def _trained_checkpoint(pt: Point, thash: str):
    """The earliest FINISHED run with training hash ``thash`` (:func:`orchestrator.point.identity.training_hash`) whose
    checkpoint is intact (:func:`integrity.verify_run`) and lies in a folder this sweep may read
    (:func:`safe_run_dir`), or None: a point that differs from it only in its ``eval`` settings evaluates that
    checkpoint instead of training again."""
    for r in pt.store.runs_with_hash(pt.exp_id, thash, tag=tag_names.TRAIN_HASH):
        if r.info.status != "FINISHED" or r.data.tags.get(tag_names.INVALID):
            continue
        folder = safe_run_dir(r.data.tags.get(tag_names.RUN_DIR), pt.sweep_id)
        if folder is None or not (folder / "checkpoint").is_dir():
            log.info("point %s: run %s trained the same checkpoint but its folder is not readable here (%s)", pt.name,
                     r.info.run_id, r.data.tags.get(tag_names.RUN_DIR))
            continue
        problems, ckpt_ok = integrity.verify_run(pt.store, r)
        if ckpt_ok:
            log.info("point %s: same training as run %s (only the evaluation differs): evaluating its checkpoint in "
                     "a new run", pt.name, r.info.run_id)
            return r
    return None
