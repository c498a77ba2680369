"""The local engine's update phase: one step's update on its rollout (:func:`update_step`: ``train.ppo_epochs`` epochs
of minibatch optimiser steps, :func:`training.update.update_policy`), the scheduler's step and the rollout engine's
weight sync; and the step's metrics (:func:`metrics_of`)."""
from __future__ import annotations

import logging
import time
import warnings

import torch

from core.lifecycle import STOP_REQUESTED, Preempted
from training.batch import StepRollout, concat_batches
from training.engines.local.local_state import InFlight, save
from training.step_metrics import StepTimes, step_metrics
from training.update import UpdateControl, UpdateStopped, update_policy

log = logging.getLogger("rlvr")


def update_step(run, ro: StepRollout, step: int, inflight: InFlight | None, flush, t_step: float) -> tuple[list, StepTimes]:
    """Step ``step``'s update on ``ro``: ``train.ppo_epochs`` epochs of minibatch optimiser steps
    (:func:`training.update.update_policy`; continued from ``inflight`` when a stop interrupted it), the scheduler's
    step, the rollout engine's weight sync. Returns (one metrics dict per optimiser step, the step's times).

    Raises:
        Preempted: a stop request, honoured after the running optimiser step: the state is saved with the step's
            rollout and the update so far (:class:`~training.engines.local.local_state.InFlight`), which the resumed
            run finishes.
    """
    t_update = time.perf_counter()
    if run.ahead is None or not run.ahead.start(run, step):  # overlap: step + k generated during the update
        run.rollout.sleep()  # on a GPU the vLLM engine's memory goes back to the trainer during the update
    done, done_metrics = (inflight.done, inflight.metrics) if inflight is not None else (0, None)
    try:
        update_metrics = update_policy(
            run.model, run.optimizer, ro.batch, ro.advantages, run.loss, run.update, run.scorer,
            UpdateControl(torch.Generator().manual_seed(run.seed * 7919 + step), STOP_REQUESTED.is_set, done,
                          done_metrics)) if ro.batch.batch_size else []
    except UpdateStopped as e:
        if run.ahead is not None:  # the rollout generating ahead is saved with the queue
            run.ahead.join(run)
        path = save(run, step - 1, InFlight(step, ro, e.done, e.metrics))
        flush()
        raise Preempted(f"stopped during step {step + 1}/{run.settings.steps}'s update (MLflow step {step}) on request, "
                        f"after {e.done} of its {e.total} optimiser steps; the state, with the step's samples and the "
                        f"update so far, saved to {path} (the resumed run finishes the step)") from None
    if ro.batch.batch_size:
        run.scheduler.step()
    else:  # nothing to learn from: said here (not by PyTorch's scheduler warning); the schedule still advances
        log.warning("step %d: dynamic sampling kept no group with mixed rewards in %d generation round(s) "
                    "(algo.dynamic_sampling.max_num_gen_batches=%s): no update this step (train/updated = 0)",
                    step, ro.rounds, run.settings.dynamic.max_num_gen_batches)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            run.scheduler.step()
    waited = 0.0
    if run.ahead is not None:  # the engine keeps the generating weights until the generation is done
        run.ahead.join(run)
        waited = run.ahead.waited
    sync_s = run.rollout.sync(run.model)  # the sampler takes the new weights (vLLM: in place, from memory)
    t_old = sum(m.pop("update_old_logprob_time_s", 0.0) for m in update_metrics)
    ro.phases["logprob_s"] = ro.phases.get("logprob_s", 0.0) + t_old  # the old-log-prob pass is log-prob time
    times = StepTimes(step=time.perf_counter() - t_step, rollout=ro.seconds,
                      update=time.perf_counter() - t_update - t_old - sync_s - waited,
                      sync=sync_s if run.rollout.name != "hf" else None, phases=ro.phases)
    return update_metrics, times


def metrics_of(run, ro: StepRollout, step: int, update_metrics: list, times: StepTimes, guard) -> dict:
    """Step ``step``'s metrics (:func:`training.step_metrics.step_metrics`): what the policy did over every sampled
    response (with dynamic sampling, also the dropped groups; with deferred old log-probs the entropies were filled in
    the batch the update saw, every sample), ``updated``; the step's estimated FLOPs; the staleness and the overlap's
    wait; the weight-sync guard's error logged (:class:`training.mismatch.SyncGuard`); the sampled tokens counted
    (:class:`training.token_probs.TokenProbs`)."""
    s = run.settings
    deferred = run.update.deferred
    seen = ro.batch if deferred else concat_batches(ro.sampled, run.tokenizer.pad_token_id)
    metrics = step_metrics(ro, seen, update_metrics, times, run.scheduler.get_last_lr()[0], run.device,
                           s.dynamic.enabled)
    metrics["updated"] = float(bool(ro.batch.batch_size))  # 0: dynamic sampling kept nothing to learn from
    proximal = s.rollout.old_policy == "recompute" and ro.version < step and s.needs.estimator_reads_old
    metrics["flops"] = run.compute.step_flops(  # the step's estimated compute (training/compute.py)
        ro.sampled, ro.batch, int(not deferred) + int(run.ref_model is not None) + int(proximal))
    metrics.update(ro.generated)  # off-policy: the mismatch measured on the generating weights, the p-vs-b gap
    if run.ahead is not None:  # the update's wait for the generation running beside it (0: fully hidden)
        metrics["overlap_wait_s"] = run.ahead.waited
    if s.rollout.staleness > 0:  # steps between the generating policy and the one updated (every sample)
        versions = ro.batch.policy_version if ro.batch.batch_size else torch.tensor([ro.version])
        age = (step - versions).float()
        metrics.update(staleness_mean=float(age.mean()), staleness_max=float(age.max()))
        if s.rollout.old_policy == "recompute" and ro.version < step and ro.batch.batch_size:
            from training.algorithms import masked_mean

            b = ro.batch  # its old log-probs are p now (the update's passes or consume's)
            metrics["staleness_logprob_gap"] = float(masked_mean(
                (b.old_logprobs.float() - b.behaviour_logprobs.float()).abs(), b.response_mask.float()))
    error = guard.check(step, metrics.get("mismatch_logprob_abs_diff"))
    if error:  # the engine samples other weights than the policy's after a sync (a stale adapter, say)
        log.error(error)
    if seen.batch_size:
        run.token_probs.update(seen.response_ids, seen.old_logprobs, seen.response_mask)
    return metrics
