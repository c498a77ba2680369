"""TR-GRPO: token-regulated GRPO, a probability-dependent weight on each token's ratio.

w_{i,t} = clip(alpha (sigmoid(sg[p_{i,t}] / tau) - mu), L, U), p = pi_theta(y_t), with the paper's
alpha = 2, mu = 0.25, L = 1.0, U = 1.4, tau = 9. The weight multiplies the ratio in both branches of
the clipped surrogate and inside the KL term.

Warning (ALGORITHMS.md): with p in [0, 1] and tau = 9, sigmoid(p/9) lies in (0.5, 0.528), so every
weight clips to L = 1.0 and TR-GRPO *equals GRPO*; public third-party code does exactly this. This
module implements the formula as written (``tau`` divides) and the ``tr_grpo_invtemp`` preset sets
tau = 1/9 (sigmoid(9 p)), which gives a real monotone weight (1.0 for p <= 0.122, 1.4 for p >= 0.327).
Config validation warns when the weight is constant. Ablations: ``weighting`` = equal (w = 1),
random (w ~ U[0.5, 1.5]), reverse (w -> 2 - w).
"""
from __future__ import annotations

import torch

from training.batch import RolloutBatch

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss, check_number
from .registry import register_policy_loss, register_validator

WEIGHTINGS = ("paper", "equal", "random", "reverse")


def token_weights(probs: torch.Tensor, alpha: float = 2.0, mu: float = 0.25, tau: float = 9.0, low: float = 1.0,
                  high: float = 1.4, weighting: str = "paper", generator: torch.Generator | None = None) -> torch.Tensor:
    """TR-GRPO token weights.

    Args:
        probs: (...) token probabilities pi_theta(y_t) in [0, 1] (detached by this function).
        alpha, mu, tau, low, high: w = clip(alpha (sigmoid(p / tau) - mu), low, high).
        weighting: ``paper`` (the formula), ``equal`` (1), ``random`` (U[0.5, 1.5]), ``reverse`` (2 - w).
        generator: RNG for ``random``.
    Returns:
        Weights of the shape of ``probs``, no gradient.
    Raises:
        ValueError: unknown weighting, tau <= 0, low > high.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r}: expected one of {list(WEIGHTINGS)}")
    if not tau > 0:
        raise ValueError(f"tau={tau!r}: must be > 0")
    if low > high:
        raise ValueError(f"low={low!r} > high={high!r}")
    p = probs.detach()
    if weighting == "equal":
        return torch.ones_like(p)
    if weighting == "random":
        u = torch.rand(p.shape, generator=generator, dtype=p.dtype, device="cpu" if generator is not None else p.device)
        return (0.5 + u).to(p.device)
    w = (alpha * (torch.sigmoid(p / tau) - mu)).clamp(low, high)
    return 2.0 - w if weighting == "reverse" else w


def weight_range(alpha=2.0, mu=0.25, tau=9.0, low=1.0, high=1.4, weighting="paper", points: int = 10001) -> tuple[float, float]:
    """(min, max) of the deterministic weight over p in [0, 1] (random weighting: (0.5, 1.5))."""
    if weighting == "random":
        return 0.5, 1.5
    w = token_weights(torch.linspace(0, 1, points, dtype=torch.float64), alpha, mu, tau, low, high, weighting)
    return float(w.min()), float(w.max())


@register_policy_loss("tr_grpo", needs={"ref_logprobs": ("its token-weighted KL term", "kl_beta")})
def tr_grpo_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    alpha: float = 2.0,
    mu: float = 0.25,
    tau: float = 9.0,
    low: float = 1.0,
    high: float = 1.4,
    weighting: str = "paper",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.24,
    kl_beta: float = 0.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
):
    """TR-GRPO loss: clipped surrogate on weighted ratios plus a weighted k3 KL term.

    Per token, with w = :func:`token_weights` of sg[pi_theta(y_t)] and r = pi_theta/pi_old:
        pg_t = max(-w r A, -clip(w r, 1 - eps_low, 1 + eps_high) A)
        kl_t = w pi_ref/pi_theta - log(w pi_ref/pi_theta) - 1          (only when kl_beta > 0)
        loss = agg(pg) + kl_beta agg(kl)
    (TR-GRPO paper, eq. 6-8 as described in ALGORITHMS.md; clip 0.2/0.24).

    Args:
        logprobs: (B, L) with gradient; batch: ``old_logprobs``, ``response_mask``, and
        ``ref_logprobs`` when kl_beta > 0; advantages (B,) or (B, L).
    Returns:
        (scalar loss, metrics: ``weight_mean``, ``weight_std``, ``clip_fraction``, ``kl_ref``, ratio stats).
    Raises:
        ValueError: kl_beta > 0 without reference log-probs.
    """
    mask = batch.response_mask
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    w = token_weights(logprobs.detach().exp(), alpha, mu, tau, low, high, weighting)
    log_ratio = (logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
    wr = w * torch.exp(log_ratio)
    loss1 = -adv * wr
    loss2 = -adv * wr.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = agg_loss(torch.maximum(loss1, loss2), mask, loss_agg_mode, norm_constant)
    metrics = {}
    if kl_beta > 0:
        if batch.ref_logprobs is None:
            raise ValueError("tr_grpo: kl_beta > 0 needs reference log-probs (batch.ref_logprobs is None)")
        x = w * torch.exp((batch.ref_logprobs - logprobs).clamp(-20.0, 20.0))
        kl = agg_loss(x - torch.log(x) - 1.0, mask, loss_agg_mode, norm_constant)
        loss = loss + kl_beta * kl
        metrics["kl_ref"] = float(kl.detach())
    with torch.no_grad():
        sel = w[mask.bool()]
        outside = ((wr < 1.0 - clip_ratio_low) | (wr > 1.0 + clip_ratio_high)).float()
        metrics.update(
            weight_mean=float(sel.mean()) if sel.numel() else 1.0,
            weight_std=float(sel.std(unbiased=False)) if sel.numel() else 0.0,
            clip_fraction=float(masked_mean(outside, mask)),
            ppo_kl=float(masked_mean(-log_ratio, mask)),
        )
    return loss, metrics


@register_validator("policy_loss", "tr_grpo")
def _check_tr_grpo(alpha=2.0, mu=0.25, tau=9.0, low=1.0, high=1.4, weighting="paper", kl_beta=0.0, **clip):
    check_clip_loss(**clip)
    check_number("tau", tau, 0, low_open=True)
    check_number("alpha", alpha)
    check_number("mu", mu)
    check_number("low", low, 0)
    check_number("high", high, 0)
    check_number("kl_beta", kl_beta, 0)
    if low > high:
        raise ValueError(f"low={low!r} > high={high!r}: the weight's clip range is empty")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r}: expected one of {list(WEIGHTINGS)}")
    lo, hi = weight_range(alpha, mu, tau, low, high, weighting)
    if hi - lo < 1e-9:
        return [f"TR-GRPO token weight is constant ({lo:.3f}) for every p in [0, 1] with alpha={alpha}, mu={mu}, "
                f"tau={tau}, clip [{low}, {high}]: this run is plain GRPO with clip-higher. The paper's own "
                f"defaults do this (sigmoid(p/9) is in (0.5, 0.528)); algo=tr_grpo_invtemp uses sigmoid(9 p)."]
    return []
