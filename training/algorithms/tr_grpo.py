"""TR-GRPO: token-regulated GRPO, a probability-dependent weight on each token.

w_{i,t} = clip(alpha (sigmoid(tau sg[p_{i,t}]) - mu), L, U), p = pi_theta(y_t), with the paper's
alpha = 2, mu = 0.25, L = 1.0, U = 1.4, tau = 9, and the token's term w min(r A, clip(r) A) (Eq. 13: the
token gradient is GRPO's times w); the KL term is w pi_ref/pi_theta - log(w pi_ref/pi_theta) - 1 (Eq. 11).

RECONSTRUCTED (ALGORITHMS.md, "TR-GRPO"). Two choices, each with the literal print as an option:

- ``weight_reading``: ``inverse_temperature`` (default) reads sigmoid(tau p). Eq. 12 as printed divides,
  sigmoid(p / tau) (``literal``): with tau = 9 it lies in (0.5, 0.528), every weight clips to L = 1.0 and
  TR-GRPO *equals GRPO* (public third-party code does exactly this). The paper's appendix C.1 says the
  sigmoid term "lies in (0.5, 1)" and that alpha = 2, mu = 0.25 give "a centered range (0.5, 1.5)", true
  only for sigmoid(tau p); its Table 7 reports different accuracies for tau in {0.5, 2, 7, 9, 10, 20}.
  With the default, w = 1.0 for p <= 0.122 and 1.4 for p >= 0.327, continuous between.
- ``weight_placement``: ``outside_clip`` (default) multiplies the clipped surrogate, w min(r A, clip(r) A),
  as Eq. 13 states the gradient. The printed Eq. 10 (``inside_clip``) puts w r inside the clip: on fresh
  data (r = 1) every positive-advantage token with w > 1 + eps_high = 1.24 (p > 0.21) is clipped and gets
  zero gradient, the opposite of the paper's aim.

Config validation warns for either literal form. Ablations: ``weighting`` = equal (w = 1), random
(w ~ U[0.5, 1.5]), reverse (w -> 2 - w), all in the default reading and placement unless set otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from training.batch import RolloutBatch

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss, check_number
from .registry import register_policy_loss, register_validator

WEIGHTINGS = ("paper", "equal", "random", "reverse")
READINGS = ("inverse_temperature", "literal")
PLACEMENTS = ("outside_clip", "inside_clip")


@dataclass(frozen=True)
class TokenWeighting:
    """TR-GRPO's weight parameters (the loss's YAML keys; the paper's values by default).

    Attributes:
        alpha, mu, tau, low, high: w = clip(alpha (sigmoid(tau p) - mu), low, high), or sigmoid(p / tau) with
            ``weight_reading="literal"``.
        weighting: ``paper`` (the formula), ``equal`` (1), ``random`` (U[0.5, 1.5]), ``reverse`` (2 - w).
        weight_reading: ``inverse_temperature`` (default) or ``literal`` (see the module docstring).
    """

    alpha: float = 2.0
    mu: float = 0.25
    tau: float = 9.0
    low: float = 1.0
    high: float = 1.4
    weighting: str = "paper"
    weight_reading: str = "inverse_temperature"


def token_weights(probs: torch.Tensor, w: TokenWeighting = TokenWeighting(),
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """TR-GRPO token weights (paper Eq. 12; reading RECONSTRUCTED, see the module docstring).

    Args:
        probs: (...) token probabilities pi_theta(y_t) in [0, 1] (detached by this function).
        w: the weight's parameters (:class:`TokenWeighting`).
        generator: RNG for ``random``.
    Returns:
        Weights of the shape of ``probs``, no gradient.
    Raises:
        ValueError: unknown weighting or reading, tau <= 0, low > high.
    """
    alpha, mu, tau, low, high = w.alpha, w.mu, w.tau, w.low, w.high
    weighting, weight_reading = w.weighting, w.weight_reading
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r}: expected one of {list(WEIGHTINGS)}")
    if weight_reading not in READINGS:
        raise ValueError(f"weight_reading={weight_reading!r}: expected one of {list(READINGS)}")
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
    x = p * tau if weight_reading == "inverse_temperature" else p / tau
    out = (alpha * (torch.sigmoid(x) - mu)).clamp(low, high)
    return 2.0 - out if weighting == "reverse" else out


def weight_range(alpha=2.0, mu=0.25, tau=9.0, low=1.0, high=1.4, weighting="paper", points: int = 10001,
                 weight_reading: str = "inverse_temperature") -> tuple[float, float]:
    """(min, max) of the deterministic weight over p in [0, 1] (random weighting: (0.5, 1.5))."""
    if weighting == "random":
        return 0.5, 1.5
    w = token_weights(torch.linspace(0, 1, points, dtype=torch.float64),
                      TokenWeighting(alpha, mu, tau, low, high, weighting, weight_reading))
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
    weight_reading: str = "inverse_temperature",
    weight_placement: str = "outside_clip",
):
    """TR-GRPO loss: token-weighted clipped surrogate plus a weighted k3 KL term.

    Per token, with w = :func:`token_weights` of sg[pi_theta(y_t)] and r = pi_theta/pi_old:
        pg_t = w max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A)        (outside_clip, Eq. 13; default)
        pg_t = max(-w r A, -clip(w r, 1 - eps_low, 1 + eps_high) A)      (inside_clip, Eq. 10 as printed)
        kl_t = w pi_ref/pi_theta - log(w pi_ref/pi_theta) - 1            (Eq. 11; only when kl_beta > 0)
        loss = agg(pg) + kl_beta agg(kl)
    (TR-GRPO paper, Eq. 10-13; clip 0.2/0.24; readings RECONSTRUCTED, see the module docstring.)

    Args:
        logprobs: (B, L) with gradient.
        batch: ``old_logprobs``, ``response_mask``, and ``ref_logprobs`` when kl_beta > 0.
        advantages: (B,) or (B, L).
    Returns:
        (scalar loss, metrics: ``weight_mean``, ``weight_std``, ``clip_fraction``, ``kl_ref``, ratio stats).
    Raises:
        ValueError: kl_beta > 0 without reference log-probs.
    """
    mask = batch.response_mask
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1)
    if weight_placement not in PLACEMENTS:
        raise ValueError(f"weight_placement={weight_placement!r}: expected one of {list(PLACEMENTS)}")
    w = token_weights(logprobs.detach().exp(), TokenWeighting(alpha, mu, tau, low, high, weighting, weight_reading))
    log_ratio = (logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    if weight_placement == "outside_clip":
        wr = ratio                       # the clip sees the plain ratio; w scales the token's term
        pg = w * torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    else:
        wr = w * ratio
        pg = torch.maximum(-adv * wr, -adv * wr.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    loss = agg_loss(pg, mask, loss_agg_mode, norm_constant)
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
def _check_tr_grpo(alpha=2.0, mu=0.25, tau=9.0, low=1.0, high=1.4, weighting="paper", kl_beta=0.0,
                   weight_reading="inverse_temperature", weight_placement="outside_clip", **clip):
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
    if weight_reading not in READINGS:
        raise ValueError(f"weight_reading={weight_reading!r}: expected one of {list(READINGS)}")
    if weight_placement not in PLACEMENTS:
        raise ValueError(f"weight_placement={weight_placement!r}: expected one of {list(PLACEMENTS)}")
    warnings = []
    lo, hi = weight_range(alpha, mu, tau, low, high, weighting, weight_reading=weight_reading)
    if hi - lo < 1e-9 and weighting != "equal":   # the equal ablation is constant by design
        warnings.append(
            f"TR-GRPO token weight is constant ({lo:.3f}) for every p in [0, 1] with alpha={alpha}, mu={mu}, "
            f"tau={tau}, clip [{low}, {high}], weight_reading={weight_reading}: this run is plain GRPO with "
            f"clip-higher. Eq. 12 as printed (literal) does this with the paper's tau = 9 (sigmoid(p/9) is in "
            f"(0.5, 0.528)); weight_reading=inverse_temperature reads sigmoid(9 p).")
    elif weight_reading == "literal":
        warnings.append(f"TR-GRPO weight_reading=literal: sigmoid(p / tau) as Eq. 12 prints it (tau={tau}); the "
                        f"paper's stated range (0.5, 1.5) holds only for sigmoid(tau p) (inverse_temperature).")
    if weight_placement == "inside_clip" and weighting != "equal" and hi > 1.0 + float(clip.get("clip_ratio_high", 0.24)):
        warnings.append(
            f"TR-GRPO weight_placement=inside_clip (Eq. 10 as printed): on fresh data a positive-advantage token "
            f"with w > 1 + clip_ratio_high = {1.0 + float(clip.get('clip_ratio_high', 0.24)):g} is clipped and "
            f"gets no gradient (the largest weight here is {hi:.3f}); Eq. 13 (outside_clip) scales GRPO's gradient by w.")
    return warnings
