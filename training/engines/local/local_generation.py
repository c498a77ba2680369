"""The local engine's generation phase: one step's rollout (G responses per prompt from the generating policy),
rewards (the verifier, DAPO's overlong shaping, dynamic sampling's refills) and advantages (the registered estimator),
as a :class:`training.batch.StepRollout` (:func:`generate`). It changes no weight, so a stop request may end it at
once, and it may run in a thread beside an update (the staleness queue's overlap, :mod:`local_queue`): everything it
draws comes from generators of its own, seeded per step, never from torch's global one."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from training.batch import StepRollout, concat_batches
from training.collect import RolloutRequest, collect_rollouts
from training.rewards import informative_rows, overlong_penalty


@dataclass(frozen=True)
class GenerationSide:
    """What a generation samples and scores with: the policy (its trainer pass gives the old, or behaviour,
    log-probs), the rollout sampler and the reference policy. The run's own (:func:`generate`'s default), or a copy of
    the weights for a generation that runs during an update (:class:`~training.engines.local.local_queue.Ahead`)."""

    model: object
    rollout: object
    ref_model: object


def sampling_seed(seed: int, step: int, rounds: int) -> int:
    """The sampling seed of step ``step``'s generation round ``rounds`` (0-based) in a run seeded ``seed``."""
    return seed * 1_000_003 + step * 1_009 + rounds


def advantages_of(run, batch, step: int):
    """The registered estimator's (advantages (B,) or (B, L) on the run's device, metrics) for step ``step``'s
    ``batch``; an estimator that declares a random ``generator`` gets one seeded by the run's seed and the step (the
    same draws however often it is called for that step, in whichever thread)."""
    s = run.settings
    kwargs = dict(s.algo.advantage_params)
    if s.needs.estimator_random:
        kwargs["generator"] = torch.Generator().manual_seed(sampling_seed(s.seed, step, 0) ^ 0x5EEDAD)
    advantages, metrics = run.adv_fn(batch, **kwargs)
    return advantages.to(run.device), metrics


def generate(run, step: int, version: int | None = None, side: GenerationSide | None = None) -> StepRollout:
    """One step's generation, scoring and advantages: G responses per prompt from the current (old) policy, with
    old log-probs (unless the update fills them: the DEFERRED path); rewards from the verifier (+ DAPO's overlong
    shaping); with dynamic sampling, groups that are all correct or all wrong are dropped and new prompts sampled, for
    at most max_num_gen_batches rounds. Changes no weight, so a stop request may end it at once
    (core.lifecycle.abortable).

    ``version``: the policy version generating (default ``step``: on-policy), tagged on every sample
    (``batch.policy_version``). Off-policy (:attr:`training.settings.AlgoNeeds.off_policy`): the behaviour log-probs
    ``b`` (the sampler's own, else the trainer's pass on the generating weights, which for the transformers sampler is
    the sampler itself) go to ``batch.behaviour_logprobs``, the engine-vs-trainer mismatch is measured now (same
    weights on both sides: ``ro.generated``), and with ``train.rollout.old_policy=behaviour`` the old log-probs are
    ``b`` before the estimator reads them. ``side``: the policy, sampler and reference it generates with (default:
    the run's)."""
    from training.settings import OldLogprobs

    s = run.settings
    side = side or GenerationSide(run.model, run.rollout, run.ref_model)
    dyn, overlong, G, n_prompts, max_new = s.dynamic, s.overlong, s.group_size, s.prompts_per_step, s.max_new_tokens
    request = RolloutRequest(G, s.temperature, s.top_p, max_new, 0, chat_template=s.chat_template, bf16=s.bf16,
                             old_logprobs=s.needs.old_logprobs is not OldLogprobs.DEFERRED, tools=run.tools,
                             tools_cfg=s.tools)
    t0 = time.perf_counter()
    kept, sampled, n_kept, rounds, phases = [], [], 0, 0, {}
    while True:
        batch, _texts = collect_rollouts(
            side.model, run.tokenizer, run.prompts.next_rows(n_prompts),
            replace(request, seed=sampling_seed(s.seed, step, rounds)), ref_model=side.ref_model,
            timings=phases, rollout=side.rollout, scorer=run.scorer)
        rounds += 1
        if overlong.enabled:
            batch.rewards = batch.rewards + overlong_penalty(
                batch.response_lengths, max_new, overlong.buffer_length(max_new), float(overlong.penalty_factor))
        sampled.append(batch)
        if not dyn.enabled:
            kept = [batch]
            break
        keep_rows = informative_rows(batch.correct, batch.group_index)   # 0 < #correct < G (DAPO eq. 11)
        if keep_rows.any():
            kept.append(batch.select(torch.nonzero(keep_rows).squeeze(-1)))
            n_kept += len(torch.unique(batch.group_index[keep_rows]))
        if n_kept >= n_prompts or rounds >= dyn.rounds:
            break
    if not kept:  # dynamic sampling found no informative group: nothing to learn from this step
        kept = [batch.select(torch.arange(0))]
    batch = concat_batches(kept, run.tokenizer.pad_token_id)
    if dyn.enabled and batch.batch_size > n_prompts * G:
        batch = batch.select(torch.arange(n_prompts * G))
    batch = batch.to(run.device)
    batch.policy_version = torch.full((batch.batch_size,), step if version is None else version, dtype=torch.long,
                                      device=run.device)
    generated = behaviour(s, batch) if s.needs.off_policy else {}
    if batch.batch_size == 0:
        advantages, adv_metrics = torch.zeros(0, device=run.device), {}
    else:  # the registered estimator; rewards come from the verifier in collect_rollouts
        advantages, adv_metrics = advantages_of(run, batch, step)
    return StepRollout(batch, sampled, advantages, adv_metrics, rounds if dyn.enabled else 0, phases,
                       time.perf_counter() - t0, step if version is None else version, generated)


def behaviour(s, batch) -> dict:
    """Off-policy bookkeeping of a freshly generated ``batch`` (in place; :func:`generate`): the behaviour log-probs
    into ``batch.behaviour_logprobs`` (the sampler's own, which leave ``rollout_logprobs``, or the trainer's pass on
    the generating weights), the old log-probs set to them under ``old_policy=behaviour``. Returns the
    engine-vs-trainer mismatch on the generating weights (:func:`training.mismatch.mismatch_metrics`; {} without the
    sampler's own log-probs), which the step logs instead of a gap that would include the intended staleness."""
    from training.mismatch import mismatch_metrics

    own, batch.rollout_logprobs = batch.rollout_logprobs, None
    out = {}
    if own is not None and batch.batch_size:
        out = mismatch_metrics(batch.old_logprobs, own, batch.response_mask)
    b = own if own is not None else batch.old_logprobs.clone()
    batch.behaviour_logprobs = b
    if s.rollout.old_policy == "behaviour":
        batch.old_logprobs = b.to(batch.old_logprobs.dtype).clone()
    return out
