"""Policy gradient without ratios or clipping (GPG)."""
from __future__ import annotations

import torch

from training.batch import RolloutBatch

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss
from .registry import register_policy_loss, register_validator


@register_policy_loss("gpg")
def gpg_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    norm_constant: float | None = None,
):
    """GPG's loss: loss_t = -A log pi_theta(y_t), no importance ratio, no clipping, token-mean
    (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline", eq. 5).

    Args:
        logprobs: (B, L) with gradient; advantages: (B,) or (B, L) (see the ``gpg`` estimator).
    Returns:
        (scalar loss, metrics with ``ppo_kl`` to the rollout policy).
    """
    mask = batch.response_mask
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    loss = agg_loss(-adv * logprobs, mask, loss_agg_mode, norm_constant)
    with torch.no_grad():
        metrics = {"ppo_kl": float(masked_mean(batch.old_logprobs - logprobs, mask))}
    return loss, metrics


register_validator("policy_loss", "gpg")(check_clip_loss)
