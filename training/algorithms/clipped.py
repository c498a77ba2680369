"""Token-level clipped surrogate (PPO, GRPO, DAPO's clip-higher)."""
from __future__ import annotations

import torch

from training.batch import RolloutBatch

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss, check_number
from .registry import register_policy_loss, register_validator


def ratio_stats(log_ratio: torch.Tensor, mask: torch.Tensor, prefix: str = "ratio") -> dict:
    """Mean/min/max of exp(log_ratio) over masked entries, as floats (for logging)."""
    with torch.no_grad():
        sel = torch.exp(log_ratio[mask.bool()])
        if sel.numel() == 0:
            return {}
        return {f"{prefix}_mean": float(sel.mean()), f"{prefix}_min": float(sel.min()), f"{prefix}_max": float(sel.max())}


@register_policy_loss("grpo")
def clipped_surrogate_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
    dual_clip: float | None = None,
):
    """PPO's clipped surrogate on token ratios, as used by GRPO.

    Per token: loss_t = max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high)), r_t = pi_theta/pi_old
    (Schulman et al. 2017, eq. 7; GRPO, Shao et al. 2024, eq. 3; clip-higher: DAPO, Yu et al. 2025, eq. 10);
    with ``dual_clip`` = c, a token with A < 0 has its loss capped at -c A (dual-clip PPO, Ye et al. 2020,
    eq. 5; verl's built-in ``vanilla`` loss does this with ``clip_ratio_c`` = 3).

    Args:
        logprobs: (B, L) log pi_theta of the sampled tokens, with gradient.
        batch: supplies ``old_logprobs`` (B, L) and ``response_mask`` (B, L).
        advantages: (B,) or (B, L).
        clip_ratio_low, clip_ratio_high: eps_low, eps_high (>= 0).
        loss_agg_mode: see ``aggregation.agg_loss``.
        dual_clip: c > 1, or None (no dual clip).
    Returns:
        (scalar loss, metrics): ``clip_fraction`` = share of tokens whose ratio left
        [1 - eps_low, 1 + eps_high]; ``clip_fraction_active`` = share where the clipped branch is
        the one taken (gradient zero); ratio mean/min/max; ``ppo_kl`` = mean(old - new) log-prob.
    """
    mask = batch.response_mask
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    log_ratio = (logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(loss1, loss2)
    if dual_clip is not None:
        capped = torch.minimum(loss_mat, -adv * dual_clip)
        dual = (adv < 0) & (capped < loss_mat)
        loss_mat = torch.where(adv < 0, capped, loss_mat)
    loss = agg_loss(loss_mat, mask, loss_agg_mode, norm_constant)
    with torch.no_grad():
        outside = ((ratio < 1.0 - clip_ratio_low) | (ratio > 1.0 + clip_ratio_high)).float()
        metrics = {
            "clip_fraction": float(masked_mean(outside, mask)),
            "clip_fraction_active": float(masked_mean((loss2 > loss1).float(), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
            **ratio_stats(log_ratio, mask),
        }
        if dual_clip is not None:
            metrics["dual_clip_fraction"] = float(masked_mean(dual.expand_as(mask).float(), mask))
    return loss, metrics


@register_validator("policy_loss", "grpo")
def _check_grpo(dual_clip=None, **params):
    check_number("dual_clip", dual_clip, 1, low_open=True, allow_none=True)
    return check_clip_loss(**params)


@register_policy_loss("cispo")
def cispo_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    norm_constant: float | None = None,
):
    """CISPO: clipped importance-sampling weights, REINFORCE-style, no token loses its gradient.

    Per token: loss_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] A log pi_theta(y_t)
    (MiniMax-M1, 2025, eq. 4-5). The clipped weight is detached, so the gradient w.r.t. the token's
    log-prob is -clip(r_t) A: never zero, unlike PPO's clipped branch.

    Args:
        logprobs: (B, L) with gradient; batch: ``old_logprobs``, ``response_mask``; advantages (B,) or (B, L).
        clip_ratio_low: eps_low, or None for no lower bound (the paper's choice: effectively none).
        clip_ratio_high: eps_high (0.2 here; the paper suggests larger values, e.g. 5.0 in TRL's docs).
    Returns:
        (scalar loss, metrics) with ``clip_fraction`` (tokens whose weight was clipped) and ratio stats.
    """
    mask = batch.response_mask
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    log_ratio = (logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio.detach())
    low = 0.0 if clip_ratio_low is None else 1.0 - clip_ratio_low
    weight = ratio.clamp(min=low, max=1.0 + clip_ratio_high)
    loss = agg_loss(-weight * adv * logprobs, mask, loss_agg_mode, norm_constant)
    with torch.no_grad():
        clipped = (weight != ratio).float()
        metrics = {"clip_fraction": float(masked_mean(clipped, mask)), "ppo_kl": float(masked_mean(-log_ratio, mask)),
                   **ratio_stats(log_ratio, mask)}
    return loss, metrics


register_validator("policy_loss", "cispo")(check_clip_loss)
