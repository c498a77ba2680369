"""One sweep point's life: validate -> identity -> decide (skip, resume or train: :mod:`orchestrator.point.decision`,
acted on by :mod:`orchestrator.point.act`) -> MLflow run -> train -> evaluate (:mod:`orchestrator.point.run_evaluation`)
-> log. While the run is open, its heartbeat, metric buffer, system-metrics monitor and the stop signal handlers are
held in one ``contextlib.ExitStack`` (:func:`_run_point`), released on every way out.

A point that raises marks its run FAILED with ``traceback.txt``; re-running the sweep trains it again.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from core import tags as tag_names
from orchestrator.checks.validate import check_point
from orchestrator.point import provenance
from orchestrator.point.act import settle, yield_to
from orchestrator.point.decision import Action, Point, Yield, earlier_runs
from orchestrator.point.identity import config_hash, git_commit, point_name, training_hash
from orchestrator.point.run_evaluation import evaluate_run, free_memory, record_integrity
from orchestrator.point.signals import StopSignals
from orchestrator.store import lease, mlflow_views, tracking

log = logging.getLogger("rlvr")
MAX_RUN_NAME = 240
UNSENT = "unsent_metrics.jsonl"  # in the run folder: metrics a lost store did not take (tracking.MetricBuffer)


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


def estimate_check(key: str, what: str, estimate, measured, unit: str, source: str,
                   outcome: str = "it took") -> tuple[dict, str | None] | None:
    """An ``auto`` choice's estimate beside what happened: the tags ``rlvr.estimate.<key>`` (``estimate``,
    ``measured``, their ratio) and, when they are more than 3x apart, a warning naming both figures (logged once per
    process). None when either figure is missing.

    Returns:
        (tags, warning or None).
    """
    from core.console import once

    if not isinstance(estimate, (int, float)) or not isinstance(measured, (int, float)) or estimate <= 0 or measured <= 0:
        return None
    ratio = float(measured) / float(estimate)
    name = key.split("=", 1)[0]
    tags = {f"{tag_names.ESTIMATE_PREFIX}{name}": f"estimate {estimate:.3g} {unit}, measured {measured:.3g} ({ratio:.2f}x)"}
    warning = None
    if not 1 / 3 <= ratio <= 3:
        warning = (f"{key} {what} {estimate:.3g} {unit}; {outcome} {measured:.3g} ({ratio:.1f}x the estimate; "
                   f"{source})")
        if once(f"estimate-check {name}"):  # once per process: each point of a sweep would say the same
            log.warning(warning)
    return tags, warning


def _tag_rollout(ro, store: tracking.Store) -> None:
    """Tag the active run with the rollout sampler its engine chose and why, ``auto``'s estimate against the measured
    sampling time (a 3x miss warned once), and keep the measured time as this machine's speed unless it was busy."""
    store.set_tags({tag_names.ROLLOUT_SAMPLER: str(ro.sampler), tag_names.ROLLOUT_SAMPLER_REASON: str(ro.reason)[:5000]})
    factor = float(ro.calibration or 1.0)
    checked = estimate_check("train.rollout.sampler=auto", f"chose {ro.sampler}, estimating",
                             None if ro.estimate_s is None else ro.estimate_s * factor, ro.measured_s,
                             "s of sampling", "its speeds: core/sampling/rollout.py's ROLLOUT_SPEED"
                             + (f" calibrated x{factor:.2g} by this machine's earlier runs" if factor != 1.0
                                else "; the next auto choice here is calibrated by this run")
                             + "; set train.rollout.sampler=hf or vllm to choose yourself")
    if checked:
        store.set_tags(checked[0])
        import os

        from core.sampling.rollout import BUSY_LOAD, record_sampling_time

        load = os.getloadavg()[0] / max(os.cpu_count() or 1, 1) if hasattr(os, "getloadavg") else None
        kept = record_sampling_time(str(ro.sampler), bool(ro.gpu), float(ro.estimate_s), float(ro.measured_s), load)
        if not kept and not ro.gpu and load is not None and load > BUSY_LOAD:
            log.info("the sampling time was not kept as this machine's speed: its load was %.1f per core (busy with "
                     "other work)", load)


def _tag_choices(choices, run_dir: Path, store: tracking.Store, run_id: str) -> None:
    """Tag the run ``run_id`` (the active run) with what its engine chose and why
    (:class:`training.engines.EngineChoices`, handed in to the engine and filled as it decided): the rollout sampler
    (``rlvr.rollout_sampler``, ``rlvr.rollout_sampler_reason``, ``auto``'s estimate against the measured time), the
    precision (``rlvr.precision``, ``rlvr.precision_reason``, ``rlvr.rollout_dtype``) and the scoring layout and
    micro-batch budget (``rlvr.packing``, ``rlvr.packing_reason``, ``rlvr.micro_batch_tokens``); the memory plan's
    parts are logged as ``memory/plan_<part>_gb`` metrics at step 0, with the model's parameter counts
    (``model/*_params``, ``model/trainable_share``), the calibration and the measured peak (``memory/run_peak_gb``),
    once per run: a metric the run already holds at step 0 (logged by the process that ran it before a resume) is not
    logged again. The memory record is the artifact ``memory.json`` (written here, from the record)."""
    import json

    if choices.rollout is not None:
        _tag_rollout(choices.rollout, store)
    if choices.precision is not None:
        p = choices.precision
        store.set_tags({tag_names.PRECISION: str(p.precision), tag_names.PRECISION_REASON: str(p.reason)[:5000],
                        tag_names.ROLLOUT_DTYPE: str(p.rollout_dtype)})
    info = choices.memory
    if not info:
        return
    store.set_tags({tag_names.PACKING: str(info.get("layout")), tag_names.PACKING_REASON: str(info.get("layout_reason"))[:5000],
                    tag_names.MICRO_BATCH_TOKENS: str(info.get("micro_batch_tokens"))})
    planned = (info.get("plan") or {}).get("total_gb")
    checked = estimate_check("memory_plan", "of this run:", planned, info.get("run_peak_gb"), "GiB at the peak",
                             "the plan's terms: training/memory_plan.py", outcome="the process's peak was")
    if checked:
        store.set_tags(checked[0])
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
        store.set_tag(tag_names.LORA_RANK, str(params.get("lora_rank")))
    if isinstance(info.get("run_peak_gb"), (int, float)):  # beside the plan's total (memory/plan_total_gb)
        values["memory/run_peak_gb"] = float(info["run_peak_gb"])
    if values:  # once per run, however many processes ran it
        for key in store.held_at_step(run_id, values, 0):
            del values[key]
    if values:
        store.log_metrics(values, 0)
    memory = Path(run_dir) / "memory.json"
    memory.write_text(json.dumps(info, indent=1))
    store.log_artifact(memory)


def _recover_from(prior, run_dir: Path) -> None:
    """Copy (hard-link where possible) a run's good checkpoints into ``run_dir`` for (re-)evaluation, with its
    validation along training (the points' samples and markers, the policies kept for selection): a validation made
    inside the training loop belongs to the training, which this run takes."""
    old = Path(prior.data.tags.get(tag_names.RUN_DIR, ""))
    for sub in ("checkpoint", "checkpoints", "validation", "selectable"):
        if (old / sub).is_dir() and not (run_dir / sub).exists():
            def link(src, dst):
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
            shutil.copytree(old / sub, run_dir / sub, copy_function=link)


def _copy_train_metrics(store: tracking.Store, src_run_id: str, dst_run_id: str) -> int:
    """Copy every ``train/`` metric history of ``src`` into ``dst`` (each step once), and the validation along
    training's (``val/``: made inside the training loop, under the protocol the training identity holds); returns
    the last training step."""
    store.copy_metrics(src_run_id, dst_run_id, "val/")
    return store.copy_metrics(src_run_id, dst_run_id, "train/")



def run(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """Run one sweep point end to end and return a summary dict (status, run id, metrics). ``run_dir``: the run's
    folder outside Hydra (``orchestrator.reproduce``'s); under Hydra the job's folder, else a new temporary folder.

    Raises:
        orchestrator.errors.ConfigError: the config is invalid (nothing has been started).
        core.lifecycle.Interrupted: SIGTERM/SIGINT outside SLURM; the run is marked KILLED (its state saved
            first when it was training).
        Exception: whatever training or evaluation raised; the MLflow run is then marked FAILED
            with the traceback saved as ``traceback.txt``.
    """
    from core.console import once, quiet_libraries

    quiet_libraries()  # the libraries' output to the point's log file, not the screen (a no-op under --verbose)
    checked = check_point(cfg)
    warnings = checked.warnings
    for w in warnings:
        if once(w):  # once per process: pre-flight said it already, or an earlier point of this sweep
            log.warning(w)
    chash, thash = config_hash(cfg), training_hash(cfg)
    hydra_dir, point, sweep_id, job_num = _hydra_job()
    run_dir = hydra_dir or (Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="rlvr-run-")))
    store = tracking.Store.of(cfg)
    exp_id = store.open(cfg.tracking.uri, cfg.experiment_name, cfg.tracking.artifact_root)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    resolved.pop("hydra", None)
    params = {k: str(v)[:6000] for k, v in tracking.flatten(resolved).items()}
    name = point or str(cfg.algo.name)
    if len(name) > MAX_RUN_NAME:  # MLflow refuses longer run names: shortened, the whole one kept as a tag
        import hashlib

        full, name = name, f"{name[:MAX_RUN_NAME - 20]}...{hashlib.sha256(name.encode()).hexdigest()[:12]}"
        log.warning("point name shortened to %r (%d characters; the full name is in the tag rlvr.point)", name, len(full))
    tags = {tag_names.CONFIG_HASH: chash, tag_names.TRAIN_HASH: thash, tag_names.ALGO: str(cfg.algo.name), tag_names.HOST: socket.gethostname(),
            tag_names.GIT_COMMIT: git_commit(), tag_names.SWEEP_ID: sweep_id, tag_names.JOB_NUM: str(job_num),
            tag_names.SLURM_JOB_ID: os.environ.get("SLURM_JOB_ID", ""),
            tag_names.REQUEUE_COUNT: os.environ.get("SLURM_RESTART_COUNT", "0"), tag_names.POINT: (point or name)[:4900],
            **provenance.provenance_tags(checked.eval_identity)}
    if warnings:
        tags[tag_names.WARNINGS] = " | ".join(warnings)[:5000]
    tags |= mlflow_views.parent_tags(exp_id, sweep_id, store)  # nested under the sweep's run (a resumed run moves to this sweep)
    pt = Point(cfg, exp_id, chash, sweep_id, job_num, name, tags, params,
               stale_s=float(cfg.tracking.get("lease_stale_s", 300)), force=bool(cfg.get("force", False)),
               run_dir=run_dir, signals=StopSignals(), store=store)
    while True:  # a point whose run gave way to an identical one started first is decided again
        out = _run_point(pt)
        if out is not None:
            return out


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
    """One run of point ``pt``: decide (:func:`orchestrator.point.act.settle`), open its run (resume or new), train (or
    take a checkpoint), evaluate and log. Returns the point's summary, or None when its new run gave way to an
    identical point's earlier run and was deleted (decide again).

    One ``ExitStack`` holds what lives while the point is decided and its run is open: the stop signal handlers
    (:class:`orchestrator.point.signals.StopSignals`), then the run's heartbeat (its lease), its metric buffer and its
    system-metrics monitor; they are released, in reverse order, on every way out (the metrics still queued sent or
    kept in ``unsent_metrics.jsonl``), before the run is ended."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(pt.signals.installed())
        decision = settle(pt)
        if decision.action is Action.DUPLICATE:
            return decision.summary
        try:
            st = _start_run(pt, decision)
        except Yield as y:  # an identical point started at the same moment, and first (this run is still active)
            return yield_to(y.run, pt, pt.store.active_run_id())
        st.run_dir.mkdir(parents=True, exist_ok=True)
        (st.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(
            {k: v for k, v in OmegaConf.to_container(pt.cfg, resolve=True).items() if k != "hydra"}))
        pt.signals.install_preemption()
        beat = stack.enter_context(lease.Heartbeat(pt.store, st.run_id))
        # what is still queued when the stack unwinds is sent, or kept in UNSENT for the resumed run
        metrics_out = stack.enter_context(pt.store.metric_buffer(st.run_id, st.run_dir / UNSENT))
        stack.enter_context(mlflow_views.system_metrics(pt.cfg, st.run_id, resume=decision.action is Action.RESUME))
        t0 = time.time()

        def log_step(m, step):
            # by run id, not the active run: MLflow's active run is per thread, and the verl engine logs from its own
            beat.nudge()
            if step > st.logged_through:  # a step replayed from an older saved state is not logged twice
                metrics_out.put(m, step)  # sent in order by its own thread: training never waits on the store

        def active_s() -> str:
            return f"{st.active_before + time.time() - t0:.1f}"
        first = None
        try:
            metrics = _train_and_evaluate(pt, decision, st, log_step, metrics_out)
        except Yield as y:
            first = y.run
        except BaseException as e:
            _end_interrupted_run(pt, st, e, metrics_out, active_s, beat)
            raise
    if first is not None:
        log.info("point %s: run %s of the same point started first: yielding to it", pt.name, first.info.run_id)
        return yield_to(first, pt, st.run_id)
    pt.store.set_tags({tag_names.ACTIVE_S: active_s(), mlflow_views.NOTE_TAG: mlflow_views.describe(
        pt.cfg, pt.tags.get(tag_names.POINT, pt.name), metrics, sweep_id=pt.tags.get(tag_names.SWEEP_ID))})
    from orchestrator.point.disk import drop_state, human

    freed = drop_state(pt.cfg, st.run_dir)  # only a resume reads it (train.keep_state=true keeps it)
    log.info("point %s finished: MLflow run %s%s", pt.name, st.run_id,
             f" (its training state, {human(freed)}, removed)" if freed else "")
    _log_console(pt)
    pt.store.end_run()
    return {"status": "finished", "run_id": st.run_id, "config_hash": pt.chash, "metrics": metrics}


def _log_console(pt: Point) -> None:
    """Keep the point's log file (everything said in its process so far, the libraries' output included:
    core/console.py) with its active MLflow run as ``sweep.log``; never raises."""
    from core.console import log_file

    path = log_file()
    if path and Path(path).is_file():
        try:
            pt.store.log_artifact(path)
        except Exception as e:
            log.warning("point %s: its log %s was not kept with its run: %s: %s", pt.name, path, type(e).__name__, e)


def _start_run(pt: Point, decision) -> _Started:
    """The point's MLflow run, started (the active run): the run ``decision`` resumes, with the metrics the store
    missed sent and its tags brought up to date (requeue count, owner, what changed in its provenance); or a new run
    with the point's tags and parameters, marked as taking a recovered run's checkpoint when ``decision`` says so.

    Raises:
        Yield: a new run found an identical point's run that started first (this run is still active).
    """
    owner = decision.owner
    if decision.action is Action.RESUME:
        resume = decision.run
        run_dir = Path(resume.data.tags.get(tag_names.RUN_DIR) or pt.run_dir)
        if n := pt.store.send_unsent(resume.info.run_id, run_dir / UNSENT):
            log.info("point %s: sent %d metrics the store missed before the run stopped", pt.name, n)
        hist = pt.store.metric_history(resume.info.run_id, "train/reward_mean")
        logged_through = max((m.step for m in hist), default=-1)
        active = pt.store.start_run(run_id=resume.info.run_id)
        requeues = int(resume.data.tags.get(tag_names.REQUEUE_COUNT, "0") or 0) + 1
        tags = pt.tags
        pt.store.set_tags({k: v for k, v in tags.items() if k != tag_names.REQUEUE_COUNT}
                          | {tag_names.REQUEUE_COUNT: str(max(requeues, int(tags[tag_names.REQUEUE_COUNT])))}
                          | lease.owner_tags(owner) | provenance.changes(resume.data.tags, tags))
        log.info("point %s: resuming MLflow run %s from %s (metrics logged through step %d)",
                 pt.name, resume.info.run_id, run_dir, logged_through)
        return _Started(active.info.run_id, run_dir, logged_through,
                        float(resume.data.tags.get(tag_names.ACTIVE_S, "0") or 0), active=active)
    recover, reuse = decision.run, decision.reuse
    active = pt.store.start_run(experiment_id=pt.exp_id, run_name=pt.name,
                                tags={**pt.tags, tag_names.KIND: "trained", tag_names.RUN_DIR: str(pt.run_dir), **lease.owner_tags(owner)})
    pt.store.log_params(pt.params)
    # an identical point may have started at the same moment, here or in another sweep: the earliest run trains
    # (or one with the same training and another evaluation: it trains, this point then evaluates its checkpoint)
    earlier = [] if pt.force else earlier_runs(pt, active, recover is None)
    if earlier:
        raise Yield(earlier[0])
    if recover is not None:
        pt.store.set_tag(tag_names.TRAINED_IN if reuse == "evaluation" else tag_names.RECOVERED_FROM, recover.info.run_id)
    return _Started(active.info.run_id, pt.run_dir, -1, 0.0, recover, reuse, active)


def evaluation_config(pt: Point):
    """The point's config with its ``eval`` group pinned to the sweep's evaluation protocol
    (:func:`orchestrator.point.sweep_protocol.resolve_for_sweep`: the sweep's first evaluation's sampler and dtype), and the
    protocol tagged on the active run (:func:`evaluation.protocol.tags`, its id as ``rlvr.env.eval_identity``).

    Raises:
        orchestrator.point.sweep_protocol.ProtocolMismatch: this machine cannot evaluate under the sweep's protocol.
    """
    from evaluation import protocol
    from orchestrator.point.sweep_protocol import pinned_config

    cfg, proto = pinned_config(pt.cfg, pt.exp_id, pt.sweep_id, pt.store)
    pt.store.set_tags(protocol.tags(proto) | {provenance.TAG_PREFIX + "eval_identity": protocol.protocol_id(proto)})
    return cfg


def _train_and_evaluate(pt: Point, decision, st: _Started, log_step, metrics_out) -> dict:
    """The point's work inside its open run: the config and (with uncommitted code) the diff logged, the datasets,
    the base model's evaluation started, training (or the recovered run's checkpoint and metrics taken), then the
    checkpoint's evaluation and the integrity record. Returns the evaluation's metrics.

    Raises:
        Yield: an identical point's run, visible only now, started first.
    """
    import training
    from core.lifecycle import TRAINING, final_checkpoint_dir
    from core.tasks import load_prompts
    from evaluation.pipeline import benchmark_rows
    from training.engines import EngineChoices
    from training.token_probs import ARTIFACT as TOKEN_PROBS

    cfg, run_dir, store = pt.cfg, st.run_dir, pt.store
    store.log_artifact(run_dir / "config.yaml")
    if pt.tags.get(provenance.TAG_PREFIX + "git_dirty") == "true":  # the code the run ran, not only its commit
        (run_dir / "git_diff.patch").write_text(provenance.git_diff() or "")
        store.log_artifact(run_dir / "git_diff.patch")
    heldout = load_prompts(cfg.data, "eval")
    bench = benchmark_rows(cfg.eval, heldout)  # unreadable benchmark files fail here, before any training
    mlflow_views.log_datasets(st.run_id, cfg.data, load_prompts(cfg.data, "train"), bench, cfg.eval, store)
    ecfg = evaluation_config(pt)  # the sweep's evaluation protocol, pinned: every evaluation of the sweep alike
    base = None
    if bool(cfg.eval.get("base", True)):
        from orchestrator.point.base_model import BaseEvaluation

        base = BaseEvaluation(ecfg, pt.exp_id, pt.sweep_id, pt.job_num, Path(pt.sweep_id) if pt.sweep_id else run_dir,
                              heldout, store)
        base.ensure(wait=False)  # evaluated here now, unless another job already is
    if st.recover is not None:
        _recover_from(st.recover, run_dir)
        last = _copy_train_metrics(store, st.recover.info.run_id, st.run_id)
        log.info("point %s: training metrics (steps 0-%d) and checkpoint taken from run %s%s", pt.name, last,
                 st.recover.info.run_id, " (trained there; this run evaluates it)" if st.reuse == "evaluation" else "")
        ckpt = final_checkpoint_dir(run_dir)
    else:
        # an identical point created at the same moment may only now be visible (its row committed after this
        # one's, though started first): the earliest still trains, the other yields before training
        earlier = [] if pt.force or decision.action is not Action.NEW else earlier_runs(pt, st.active, True)
        if earlier:
            raise Yield(earlier[0])
        TRAINING.set()
        choices = EngineChoices()  # the engine fills it as it decides; tagged whether training returns or raises
        validator = None
        if int(cfg.train.get("validate_every") or 0):  # inside the loop, logged at once, in order with the steps
            from orchestrator.point.validation import LoopValidator

            validator = LoopValidator(ecfg, run_dir, store, metrics_out.put)
        try:
            ckpt = training.train(cfg, run_dir, log_metrics=log_step, logged_through=st.logged_through,
                                  choices=choices, validator=validator)
        finally:
            TRAINING.clear()
            _tag_choices(choices, run_dir, store, st.run_id)
        metrics_out.flush()  # every training step's metrics are in the store before evaluation starts
        if (run_dir / TOKEN_PROBS).is_file():  # the sampled tokens' mean probabilities (TR-GRPO's Fig. 1)
            store.log_artifact(run_dir / TOKEN_PROBS)
    store.set_tag(tag_names.CHECKPOINT, str(ckpt))
    free_memory()
    metrics = evaluate_run(ecfg, run_dir, ckpt, heldout, base, store)
    store.log_artifact(record_integrity(run_dir, ckpt))
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
        pt.store.set_tag(tag_names.ACTIVE_S, active_s())
        if "SLURM_JOB_ID" in os.environ:
            # state saved: leave the run RUNNING for the requeued job, and let submitit requeue us
            log.warning("point %s preempted; state saved in %s", pt.name, st.run_dir)
            pt.signals.hand_on_preemption()
            return
        beat.stop.set()
        STOP_REQUESTED.clear()
        pt.store.end_run("KILLED")
        raise Interrupted(pt.signals.signum, state_saved=True, where=f"run {st.run_id}") from None
    beat.stop.set()
    metrics_out.close()
    killed = isinstance(e, KeyboardInterrupt)
    try:
        (st.run_dir / "traceback.txt").write_text(traceback.format_exc())
        pt.store.log_artifact(st.run_dir / "traceback.txt")
        _log_console(pt)
    except Exception as e2:  # a full disk or a lost store: the original error is what matters
        log.error("could not save the traceback of run %s: %s", st.run_id, e2)
    finally:
        try:
            pt.store.set_tag(tag_names.ACTIVE_S, active_s())
        except Exception:
            pass
        try:
            pt.store.end_run("KILLED" if killed else "FAILED")
        except Exception as e3:
            log.error("could not mark run %s %s: %s", st.run_id, "KILLED" if killed else "FAILED", e3)
    if isinstance(e, KeyboardInterrupt) and not isinstance(e, Interrupted):
        raise Interrupted(signal.SIGINT, where=f"run {st.run_id}") from None
    if isinstance(e, Interrupted):
        e.where = f"run {st.run_id}"

