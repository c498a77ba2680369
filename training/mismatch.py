"""The training-inference mismatch: how far the sampler's token probabilities are from the trainer's (its
corrections: the registry :mod:`training.corrections`).

When rollouts come from an inference engine (vLLM) and the loss from the trainer's own forward pass, the two
log-probabilities of the same sampled token differ (other kernels, another precision, stale weights), so the samples
are slightly off-policy for the policy the loss's ratios take as "old". Per token, with ``r_t = pi_old(y_t) /
pi_rollout(y_t)`` (the trainer's old log-prob minus the sampler's, exponentiated), over the response mask:

- ``mismatch_logprob_abs_diff``: mean |log pi_old - log pi_rollout|;
- ``mismatch_kl``: mean of ``r - 1 - log r``, the k3 estimate of KL(pi_rollout || pi_old) from the sampled tokens
  (Schulman's k3; verl logs the same quantity as ``rollout_corr/k3_kl``);
- ``mismatch_ratio_out_share``: the share of tokens whose ratio leaves [0.5, 2].

Correction (``train.rollout.correction``): the registry of rollout corrections, :mod:`training.corrections`
(truncated IS per token or per response after Yao et al. 2025, masked IS, IcePop, geometric rejection; each checked
against verl's ``rollout_corr_helper``; a plug-in may register its own). :func:`tis_weights` and :func:`tis_metrics`
below are the two TIS modes' weights and metrics through that registry, kept for their callers.
"""
from __future__ import annotations

import torch

from training.algorithms import masked_mean
from training.corrections import correct

CORRECTIONS = ("none", "token_tis", "sequence_tis")  # the modes tis_weights computes; all: training.corrections
RATIO_BAND = (0.5, 2.0)


def mismatch_metrics(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """The mismatch metrics of the module docstring.

    Args:
        old_logprobs: (B, L) the trainer's log-probs of the sampled tokens (the rollout policy by its own pass).
        rollout_logprobs: (B, L) the sampler's log-probs of the same tokens at the same temperature.
        mask: (B, L) 1 on the policy's tokens.
    Returns:
        ``{"mismatch_logprob_abs_diff", "mismatch_kl", "mismatch_ratio_out_share"}`` as floats (0 on an empty mask).
    """
    m = mask.to(torch.float32)
    log_r = (old_logprobs.detach().float() - rollout_logprobs.float()) * m
    r = log_r.exp()
    out = ((r < RATIO_BAND[0]) | (r > RATIO_BAND[1])).float()
    return {"mismatch_logprob_abs_diff": float(masked_mean(log_r.abs(), m)),
            "mismatch_kl": float(masked_mean(r - 1.0 - log_r, m)),
            "mismatch_ratio_out_share": float(masked_mean(out, m))}


#: mean |log pi_old - log pi_rollout| above which a float32 engine is not sampling the trainer's weights: float
#: rounding between the two kernels stays far below it (about 1e-7 on the tiny model: tests/e2e/test_vllm.py)
FLOAT32_LEVEL = 1e-3
#: in lower precision, a step whose mismatch is this many times the first step's (before any sync) is a jump
JUMP_FACTOR = 10.0


class SyncGuard:
    """The guard against a rollout engine that samples other weights than the policy's after a weight sync (a stale
    or base model: the silent LoRA bug of verl #3821/#7495 and TRL #5312, found there by this very gap).

    Args:
        float32: the engine and the trainer compute in float32 (then the mismatch must stay at float level,
            :data:`FLOAT32_LEVEL`; otherwise a jump over :data:`JUMP_FACTOR` x the first step's value counts).
    """

    def __init__(self, float32: bool):
        self.float32 = bool(float32)
        self.first: float | None = None

    def check(self, step: int, value: float | None) -> str | None:
        """The error message for ``step``'s mean log-prob gap ``value`` (None: no engine log-probs), or None."""
        if value is None or value != value:
            return None
        if self.first is None:
            self.first = float(value)
        limit = FLOAT32_LEVEL if self.float32 else max(JUMP_FACTOR * self.first, FLOAT32_LEVEL)
        if step == 0 or value <= limit:
            return None
        return (f"step {step}: the rollout engine's log-probs of the sampled tokens differ from the trainer's by "
                f"{value:.3g} on average (limit {limit:.3g}; step 0: {self.first:.3g}) after the weight sync of step "
                f"{step - 1}: the engine is sampling other weights than the policy's (a stale policy or the base "
                "model); the samples are off-policy")


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, mode: str,
                cap: float = 2.0) -> torch.Tensor | None:
    """Truncated importance-sampling weights (:func:`training.corrections.token_tis`, ``sequence_tis``), detached.

    Args:
        old_logprobs, rollout_logprobs, mask: (B, L) as :func:`mismatch_metrics`.
        mode: one of :data:`CORRECTIONS`; cap: C >= 1, the truncation.
    Returns:
        (B, L) weights (1 outside the mask), or None for ``none``.
    Raises:
        ValueError: an unknown mode or a cap below 1.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"train.rollout.correction={mode!r}: expected one of {list(CORRECTIONS)}")
    if not cap >= 1.0:
        raise ValueError(f"train.rollout.correction_cap={cap!r}: expected a number >= 1")
    if mode == "none":
        return None
    return correct(mode, old_logprobs, rollout_logprobs, mask, cap=cap).weights


def tis_metrics(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict:
    """``tis_weight_mean`` and ``tis_capped_share`` (tokens whose weight hit the cap) over the mask."""
    m = mask.to(torch.float32)
    return {"tis_weight_mean": float(masked_mean(weights, m)),
            "tis_capped_share": float(masked_mean((weights >= float(cap) - 1e-6).float(), m))}
