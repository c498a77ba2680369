"""Acting on a point's decisions: the one place their writes happen (:mod:`orchestrator.point.decision` decides,
reading the store only).

:func:`settle` decides and acts until the point is settled: a new run, a resumed run, or a duplicate record
(:func:`record_duplicate`, with the flip rates its finished run lacked added: :func:`backfill_flips`). On the way it
ends runs (an untrusted finished run, a run that cannot be resumed, older RUNNING runs of the point), claims the lease
of the run it resumes, waits for a run trained elsewhere, and ends the parent runs of sweeps whose process died
(:func:`end_dead_sweeps`). :func:`yield_to` gives a point's new run way to an identical point's run started first.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

from core import tags
from orchestrator.point import decision
from orchestrator.point.decision import Action, Decision, Point
from orchestrator.point.run_evaluation import backfill_flips
from orchestrator.store import lease, mlflow_views

log = logging.getLogger("rlvr")


def settle(pt: Point) -> Decision:
    """Decide what to do with point ``pt`` (:func:`orchestrator.point.decision.decide`) and act on each decision
    until one settles it; returns that decision:

    - ``duplicate``: the point is recorded as a duplicate of ``run`` (:func:`record_duplicate`), its flip rates against
      the base model added first when ``backfill`` asks (:func:`backfill_flips`); returned with the point's summary;
    - ``new``: returned (the caller starts the run);
    - ``resume``: the run's lease is claimed (:func:`orchestrator.store.lease.claim`) and the older RUNNING runs of the
      point ended KILLED; returned. A claim another process won means deciding again (the run is live now);
    - ``discard``: claimed as for ``resume``, then the run is marked invalid and KILLED; decided again;
    - ``invalidate``: the finished run is marked invalid and KILLED, its checkpoint re-evaluated by the new run when
      it is good (``recover``); decided again;
    - ``wait``: the live run is named once, then :data:`orchestrator.point.decision.POLL_S` seconds pass; decided again;
    - ``again``: decided again at once.

    The parent runs that sweeps whose process died left RUNNING above a run a decision takes up are ended first
    (:func:`end_dead_sweeps`).

    Raises:
        core.lifecycle.Interrupted: a stop was requested while deciding.
    """
    from core.lifecycle import STOP_REQUESTED, Interrupted

    st, store, seen = decision.Deciding(lease.new_owner()), pt.store, set()
    while True:
        if not pt.force and STOP_REQUESTED.is_set():
            raise Interrupted(pt.signals.signum)
        d = decision.decide(pt, st)
        if d.action not in (Action.WAIT, Action.AGAIN) and d.run is not None:
            end_dead_sweeps(pt, d.run, seen)
        if d.action is Action.NEW:
            return d
        if d.action is Action.DUPLICATE:
            summary = record_duplicate(pt, d.run.info.run_id, d.reason)
            if d.backfill:
                backfill_flips(pt.cfg, pt.exp_id, pt.sweep_id, pt.job_num, pt.run_dir, d.run, store)
            return replace(d, summary=summary)
        if d.action is Action.INVALIDATE:
            log.warning("point %s: %s", pt.name, "re-evaluating its checkpoint in a new run" if d.recover else
                        "its checkpoint is bad: training again in a new run")
            store.terminate(d.run.info.run_id, "KILLED", d.reason)
            st.recover = d.run if d.recover else None
        elif d.action in (Action.RESUME, Action.DISCARD):
            if lease.claim(store, d.run.info.run_id, d.owner) is None:
                continue  # another process claimed it at the same moment: it is live now
            for other in d.end:
                store.terminate(other.info.run_id, "KILLED")
            if d.action is Action.RESUME:
                return d
            log.warning("point %s: not resuming run %s: %s; it is marked KILLED and the point starts again in a new "
                        "run", pt.name, d.run.info.run_id, d.reason)
            store.terminate(d.run.info.run_id, "KILLED", f"not resumed: {d.reason}")
        elif d.action is Action.WAIT:
            r = d.run
            if st.waited != r.info.run_id:
                log.info("point %s: run %s is being trained by %s (pid %s); waiting for it (its lease goes stale "
                         "after %.0f s without a heartbeat)", pt.name, r.info.run_id, r.data.tags.get(tags.HOST),
                         r.data.tags.get(tags.PID), pt.stale_s)
                st.waited = r.info.run_id
            time.sleep(decision.POLL_S)


def record_duplicate(pt: Point, of_run_id: str, why: str) -> dict:
    """Record point ``pt`` as a duplicate of run ``of_run_id`` (a new run of kind ``duplicate``, with ``why`` as its
    note, the point's parameters and datasets); the point's summary."""
    store = pt.store
    with store.running(pt.exp_id, pt.name, {**pt.tags, tags.KIND: "duplicate", tags.DUPLICATE_OF: of_run_id,
                                            mlflow_views.NOTE_TAG: why}) as r:
        store.log_params(pt.params)
        _log_datasets(pt, r.info.run_id)
    log.info("point %s: %s (recorded as duplicate %s)", pt.name, why, r.info.run_id)
    return {"status": "duplicate", "run_id": r.info.run_id, "duplicate_of": of_run_id, "config_hash": pt.chash}


def _log_datasets(pt: Point, run_id: str) -> None:
    """The run's training prompts and evaluation benchmarks as MLflow datasets
    (:func:`orchestrator.store.mlflow_views.log_datasets`)."""
    cfg = pt.cfg
    try:
        from core.tasks import load_prompts
        from evaluation.pipeline import benchmark_rows

        heldout = load_prompts(cfg.data, "eval")
        mlflow_views.log_datasets(run_id, cfg.data, load_prompts(cfg.data, "train"), benchmark_rows(cfg.eval, heldout),
                                  cfg.eval, pt.store)
    except Exception as e:  # bad data fails the point later, with its own message
        log.warning("run %s: datasets not logged: %s: %s", run_id, type(e).__name__, e)


def yield_to(earlier, pt: Point, run_id: str) -> dict | None:
    """This point's run ``run_id`` (the active run) gives way to ``earlier``: recorded as its duplicate when it is the
    same point of the same sweep (returns the point's summary), else deleted (returns None: the point is decided
    again, and then waits for ``earlier``)."""
    store = pt.store
    if earlier.data.tags.get(tags.SWEEP_ID) == pt.sweep_id and earlier.data.tags.get(tags.CONFIG_HASH) == pt.chash:
        store.set_tags({tags.KIND: "duplicate", tags.DUPLICATE_OF: earlier.info.run_id}, run_id)
        store.end_run()
        log.info("point %s: identical to run %s started just before: recorded as duplicate", pt.name,
                 earlier.info.run_id)
        return {"status": "duplicate", "run_id": run_id, "duplicate_of": earlier.info.run_id, "config_hash": pt.chash}
    store.end_run()
    store.delete_run(run_id)  # another sweep (or another evaluation) owns the training: wait for it
    return None


def end_dead_sweeps(pt: Point, run, seen: set) -> None:
    """End the parent run of ``run``'s sweep when that sweep's process died and left it RUNNING
    (:func:`orchestrator.store.mlflow_views.dead_sweep`: its lease stale, none of its runs live; never this point's own
    sweep, never a live sweep here or on another node), saying so on it: "ended by a later run of the sweep: its
    process died". Each parent is looked at once per point (``seen``). Never raises: the point goes on either way."""
    parent_id = run.data.tags.get(mlflow_views.PARENT_TAG)
    if not parent_id or parent_id == pt.tags.get(mlflow_views.PARENT_TAG) or parent_id in seen:
        return
    seen.add(parent_id)
    try:
        parent = mlflow_views.dead_sweep(parent_id, pt.stale_s, pt.store)
        if parent is None:
            return
        why = (f"ended by a later run of the sweep: its process died (no sign of life for {pt.stale_s:.0f} s, or its "
               f"process gone on its host); its run {run.info.run_id} was taken up by point {pt.name} of sweep "
               f"{pt.sweep_id or '(none)'}")
        mlflow_views.end_dead_sweep(parent, why, pt.store)
        log.warning("point %s: the sweep run %s (%s) was left RUNNING by a process that died: ended KILLED", pt.name,
                    parent_id, parent.data.tags.get(tags.SWEEP_ID))
    except Exception as e:  # noqa: BLE001 -- a courtesy to the earlier sweep: never the point's failure
        log.warning("point %s: the sweep run %s above run %s was not looked at: %s: %s", pt.name, parent_id,
                    run.info.run_id, type(e).__name__, e)
