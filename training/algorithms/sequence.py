"""Sequence-level importance ratios (GSPO)."""
from __future__ import annotations

import torch

from training.batch import RolloutBatch

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss, check_number
from .registry import register_policy_loss, register_validator


def sequence_log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Length-normalised sequence log-ratio log s_i = (1/|y_i|) sum_t (log pi_theta - log pi_old).

    GSPO (Zheng et al. 2025, eq. 7). Args: (B, L) tensors; returns (B,), differentiable.
    """
    return masked_mean(logprobs - old_logprobs, mask, dim=-1)


def token_form_sequence_ratio(logprobs: torch.Tensor, seq_log_ratio: torch.Tensor) -> torch.Tensor:
    """Token form of the sequence ratio: s_{i,t} = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)].

    Its value equals s_i on every token and its gradient w.r.t. log pi_theta(y_t) is s_i, so that
    seq-mean-token-mean aggregation reproduces the gradient of the sequence-level objective
    (GSPO-token, Zheng et al. 2025, eq. 13; verl ``compute_policy_loss_gspo``).

    Args: logprobs (B, L); seq_log_ratio (B,). Returns (B, L).
    """
    log_s = seq_log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach()
    return torch.exp(log_s.clamp(max=20.0))


@register_policy_loss("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
):
    """GSPO's clipped sequence-level surrogate.

    Per sequence: max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)), s_i the
    length-normalised sequence ratio (Zheng et al. 2025, "Group Sequence Policy Optimization",
    eq. 5-7; defaults eps_low = 3e-4, eps_high = 4e-4 from the paper, sec. 5.1).

    Args:
        logprobs: (B, L) with gradient; batch: ``old_logprobs``, ``response_mask`` (B, L);
        advantages: (B,) sequence advantages.
    Returns:
        (scalar loss, metrics): ``clip_fraction`` is the share of *sequences* whose s_i left the range.
    """
    mask = batch.response_mask
    adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
    log_s = sequence_log_ratio(logprobs, batch.old_logprobs, mask).clamp(-20.0, 20.0)
    s_tok = token_form_sequence_ratio(logprobs, log_s)
    loss1 = -adv * s_tok
    loss2 = -adv * s_tok.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = agg_loss(torch.maximum(loss1, loss2), mask, loss_agg_mode, norm_constant)
    with torch.no_grad():
        s = torch.exp(log_s)
        outside = ((s < 1.0 - clip_ratio_low) | (s > 1.0 + clip_ratio_high)).float()
        metrics = {
            "clip_fraction": float(outside.mean()),
            "seq_ratio_mean": float(s.mean()),
            "seq_ratio_min": float(s.min()),
            "seq_ratio_max": float(s.max()),
            "ppo_kl": float(masked_mean(batch.old_logprobs - logprobs, mask)),
        }
    return loss, metrics


register_validator("policy_loss", "gspo")(check_clip_loss)


@register_policy_loss("gmpo")
def gmpo_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
):
    """GMPO: geometric mean of token ratios, clipped in log space.

    d_t = log pi_theta - log pi_old; on the side that matters for the sign of A it is clipped to
    [-eps_low, eps_high]: d'_t = sgn(A) min(sgn(A) d_t, sgn(A) clip(d_t)). Then
    ratio_i = exp(mean_t d'_t) (the geometric mean of the clipped token ratios) and
    loss_i = -A_i ratio_i, averaged over sequences (Zhao et al. 2025, "Geometric-Mean Policy
    Optimization", eq. 4; eps = 0.4; verl ``compute_policy_loss_geo_mean``).

    Args:
        logprobs: (B, L) with gradient; advantages: (B,) sequence advantages.
        loss_agg_mode: accepted for a uniform interface; GMPO's sequence mean is fixed by the
            geometric mean, so only ``seq-mean-token-mean`` is allowed.
    Returns:
        (scalar loss, metrics) with ``clip_fraction`` (tokens whose log-ratio was clipped).
    """
    if loss_agg_mode != "seq-mean-token-mean":
        raise ValueError(f"loss_agg_mode={loss_agg_mode!r}: GMPO is defined with seq-mean-token-mean only")
    mask = batch.response_mask
    adv = advantages.reshape(-1) if advantages.dim() == 1 else masked_mean(advantages, mask, dim=-1)
    d = logprobs - batch.old_logprobs
    sgn = torch.sign(adv).unsqueeze(-1)
    d_clip = d.clamp(-clip_ratio_low, clip_ratio_high)
    d_min = sgn * torch.minimum(sgn * d, sgn * d_clip)
    ratio = torch.exp(masked_mean(d_min, mask, dim=-1).clamp(max=20.0))
    # each sequence's loss on its tokens, averaged per sequence then over sequences: (-A_i ratio_i) averaged over
    # the responses, through the one aggregation every loss shares (where per-token weights enter: token_weights)
    loss = agg_loss((-adv * ratio).unsqueeze(-1).expand_as(d), mask, "seq-mean-token-mean")
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(masked_mean((d_min != d).float(), mask)),
            "seq_ratio_mean": float(ratio.mean()), "seq_ratio_min": float(ratio.min()), "seq_ratio_max": float(ratio.max()),
            "ppo_kl": float(masked_mean(-d, mask)),
        }
    return loss, metrics


@register_validator("policy_loss", "gmpo")
def _check_gmpo(clip_ratio_low=0.4, clip_ratio_high=0.4, loss_agg_mode="seq-mean-token-mean", **_):
    check_number("clip_ratio_low", clip_ratio_low, 0)
    check_number("clip_ratio_high", clip_ratio_high, 0)
    if loss_agg_mode != "seq-mean-token-mean":
        raise ValueError(f"loss_agg_mode={loss_agg_mode!r}: GMPO is defined with seq-mean-token-mean only")
    return []
