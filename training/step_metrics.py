"""The metrics a local training step logs (``train/<name>`` in MLflow), from what the step sampled and what its
update did."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from training.algorithms import masked_mean
from training.mismatch import mismatch_metrics


def peak_memory_gb(device) -> float:
    """Peak memory so far, GiB: CUDA memory allocated on ``device`` when it is a GPU, else the process's peak
    resident set size (Linux ``ru_maxrss``, KiB)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def mean_metrics(items: list[dict]) -> dict:
    """The mean of each key over the dicts that have it."""
    keys = {k for m in items for k in m}
    return {k: float(np.mean([m[k] for m in items if k in m])) for k in keys}


#: update metrics summed over a step's optimiser steps (the others are averaged)
SUMMED = ("update_forward_time_s", "update_backward_time_s", "micro_batches", "update_tokens", "update_padding",
          "nonfinite_skips", "nonfinite_advantage", "nonfinite_policy_loss", "nonfinite_kl", "nonfinite_entropy",
          "nonfinite_gradient")


@dataclass
class StepTimes:
    """A step's wall seconds: the whole step, its rollout (generation, rewards, scoring), its update (less the
    old-log-prob pass, counted as log-prob time) and the weight sync; ``phases``: the rollout's own split
    (``generate_s``, ``reward_s``, ``logprob_s``)."""

    step: float = 0.0
    rollout: float = 0.0
    update: float = 0.0
    sync: float | None = None
    phases: dict = field(default_factory=dict)


def response_metrics(seen) -> dict:
    """What the policy did: reward, accuracy, entropy, lengths, truncation, tool use, over the responses ``seen``
    (every sampled response; with dynamic sampling the dropped groups too)."""
    out = {
        "reward_mean": float(seen.rewards.mean()),
        "accuracy": float(seen.correct.float().mean()),
        "entropy": float(masked_mean(seen.entropy, seen.response_mask)),
        "response_length_mean": float(seen.response_lengths.float().mean()),
        "response_length_max": float(seen.response_lengths.max()),
        "truncated_share": float((~seen.finished).float().mean()),
    }
    # no answer in the asked form; an answer refused as an echo of the prompt
    for key, value in (("format_miss", seen.format_miss), ("echo_share", seen.echo)):
        if value is not None:
            out[key] = float(value.float().mean())
    if seen.tools is not None:
        tool = int(seen.tools.tokens.sum())
        out.update(tool_calls_mean=float(seen.tools.calls.float().mean()),
                   no_answer_share=float((~seen.tools.answered.bool()).float().mean()),
                   tool_token_share=float(tool / max(1, tool + int(seen.response_mask.sum()))))
    if seen.rollout_logprobs is not None and seen.batch_size:  # the trainer's old log-probs against the sampler's
        out.update(mismatch_metrics(seen.old_logprobs, seen.rollout_logprobs, seen.response_mask))
    return out


def step_metrics(ro, seen, update_metrics: list[dict], times: StepTimes, lr: float, device,
                 dynamic: bool = False) -> dict:
    """One step's metrics (values None when they do not apply; the engine drops them and non-finite ones).

    Args:
        ro: the step's :class:`training.batch.StepRollout`: ``batch`` (what the update trained on), ``advantages``
            (B,) or (B, L), the estimator's ``adv_metrics``, ``rounds`` of generation.
        seen: every sampled response (``ro.batch`` unless dynamic sampling dropped groups).
        update_metrics: one dict per optimiser step (:func:`training.update.minibatch_step`): averaged, except
            the totals of :data:`SUMMED`.
        lr: the learning rate of the step; device: the training device (peak memory).
        dynamic: DAPO's dynamic sampling is on (its rounds and sampled responses are logged).
    Returns:
        {name: value}: the responses' (:func:`response_metrics`), the advantages', the update's (loss terms, grad
        norm, clip fractions, ``padding_share`` = positions without a token / positions computed in the update's
        passes), phase times, throughput and memory.
    """
    batch, advantages, adv_metrics = ro.batch, ro.advantages, ro.adv_metrics
    dynamic_rounds = ro.rounds if dynamic else None
    n_tokens = int(seen.response_mask.sum()) + int(seen.prompt_mask.sum())
    update = mean_metrics(update_metrics)
    totals = {k: float(sum(m.get(k, 0.0) for m in update_metrics)) for k in SUMMED
              if any(k in m for m in update_metrics)}
    cuda = torch.device(device).type == "cuda"
    out = {
        **response_metrics(seen),
        "advantage_mean": float(advantages.mean()) if batch.batch_size else None,
        "advantage_abs_mean": float(advantages.abs().mean()) if batch.batch_size else None,
        "batch_responses": batch.batch_size,
        **({"dynamic_sampling_rounds": dynamic_rounds, "dynamic_sampling_sampled": seen.batch_size}
           if dynamic_rounds is not None else {}),
        "lr": float(lr),
        "step_time_s": times.step,
        "rollout_time_s": times.rollout,
        "update_time_s": times.update,
        **({"weight_sync_time_s": times.sync} if times.sync is not None else {}),
        **{f"{k[:-2]}_time_s": v for k, v in times.phases.items()},  # generate, reward, logprob (rollout's split)
        "tokens_per_s": n_tokens / max(times.step, 1e-9),
        "samples_per_s": seen.batch_size / max(times.step, 1e-9),
        "peak_memory_gb": peak_memory_gb(device),
        "gpus": 1.0 if cuda else 0.0,
        **({"peak_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30} if cuda else {}),
        **{k: float(v) for k, v in adv_metrics.items()},
        **update,
        **totals,
    }
    if totals.get("update_tokens"):
        out["padding_share"] = totals["update_padding"] / totals["update_tokens"]
    return out
