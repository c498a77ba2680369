"""QUATRO: query-adaptive trust-region policy optimisation.

Per prompt q, QUATRO solves  max_pi E_pi[R]  s.t.  KL(pi || pi_old) <= delta  on the G sampled
responses. The optimum is pi*(y) ∝ pi_old(y) exp(R(y)/lambda*), with lambda* the minimiser of the
convex dual

    f(lambda) = lambda delta + lambda log( (1/G) sum_j exp(R_j / lambda) ),
    f'(lambda) = delta - KL(softmax(R / lambda) || uniform),

and the advantage A_i = R_i/lambda* - log mean_j exp(R_j/lambda*) = log(G softmax(R/lambda*)_i),
so that mean_i exp(A_i) = 1 exactly (A is not zero-mean). See docs/algorithms.md, "QUATRO".

Simplified or reconstructed here, and why:
- The paper's dual solver is not published; this module finds the root of f'(lambda) = 0 by
  vectorised bisection on log(lambda) in float64 (any correct solver gives the same lambda*).
- The policy loss is RECONSTRUCTED from the paper's description ("a GSPO-style objective that
  keeps the log-ratio term and drops clipping"): J = mean_i s_i (A_i - sg[log s_i]) with the
  length-normalised sequence ratio s_i. Alternatives exposed as options: ``log_ratio_penalty=False``
  (the paper's ablation: J = mean_i s_i A_i) and ``ratio_level="token"`` (token ratios r_t in
  place of s_i).
"""
from __future__ import annotations

import math
import time

import torch

from training.batch import RolloutBatch, from_groups, to_groups

from .aggregation import agg_loss, masked_mean
from .common import check_clip_loss, check_number
from .registry import register_advantage, register_policy_loss, register_validator
from .sequence import sequence_log_ratio, token_form_sequence_ratio

_BISECTION_STEPS = 200


def _log_mean_exp(x: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(x, dim=-1) - math.log(x.shape[-1])


def _kl_to_uniform(rewards: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """KL(softmax(R/lambda) || uniform) per row; rewards (N, G), lam (N,) -> (N,)."""
    logp = torch.log_softmax(rewards / lam.unsqueeze(-1), dim=-1)
    return (logp.exp() * logp).sum(-1) + math.log(rewards.shape[-1])


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta={delta!r}: the QUATRO trust-region radius must be a finite number > 0")


def quatro_dual(rewards: torch.Tensor, delta: float, lambda_min: float = 1e-3, tol: float = 1e-8, return_info: bool = False):
    """Solve QUATRO's dual for every group at once.

    lambda* = argmin_{lambda >= lambda_min} f(lambda), f(lambda) = lambda delta + lambda log mean_j exp(R_j/lambda);
    mu* = lambda* (log mean_j exp(R_j/lambda*) - 1). At an interior optimum the sampled trust
    region is tight, KL(softmax(R/lambda*) || uniform) = delta; an interior optimum exists iff
    0 < delta < log(G/m), m the number of responses tied at the group's maximum reward. Otherwise
    lambda* is floored at ``lambda_min``.

    Solver: bisection on log(lambda) for f'(lambda) = 0 (KL is decreasing in lambda), float64,
    vectorised over groups, to |KL - delta| < ``tol``.

    Args:
        rewards: (num_groups, G) rewards, one row per prompt.
        delta: trust-region radius, > 0.
        lambda_min: floor on lambda (> 0).
        tol: tolerance on the KL at the root.
        return_info: also return a dict with ``floored`` (num_groups,) bool and ``valid`` (num_groups,) bool.
    Returns:
        (lam, mu), each (num_groups,) float64; NaN for groups whose rewards are all equal and for
        G = 1 (no trust region to solve: their advantage is 0). With ``return_info``, (lam, mu, info).
    Raises:
        ValueError: delta <= 0 or not finite, lambda_min <= 0, rewards not 2-D.
    Source: QUATRO paper, dual of the per-prompt trust-region problem (ALGORITHMS.md, check values).
    """
    _check_delta(delta)
    if not lambda_min > 0:
        raise ValueError(f"lambda_min={lambda_min!r} must be > 0")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape (num_groups, G), got {tuple(rewards.shape)}")
    r = rewards.detach().to(torch.float64)
    n, g = r.shape
    lam = torch.full((n,), float("nan"), dtype=torch.float64, device=r.device)
    mu = torch.full_like(lam, float("nan"))
    floored = torch.zeros(n, dtype=torch.bool, device=r.device)
    spread = (r.max(-1).values - r.min(-1).values) if g > 0 else lam
    valid = (spread > 0) if g > 1 else torch.zeros(n, dtype=torch.bool, device=r.device)
    if valid.any():
        rv, sv = r[valid], spread[valid]
        lo = torch.full_like(sv, math.log(lambda_min))
        # KL(lambda) <= spread^2 / (8 lambda^2) (Hoeffding), so at this lambda KL < delta / 4.
        hi = torch.maximum(torch.log(sv) - 0.5 * math.log(8.0 * delta) + math.log(2.0), lo + 1.0)
        floor_v = _kl_to_uniform(rv, torch.exp(lo)) <= delta  # root below the floor (or none)
        for _ in range(_BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            too_concentrated = _kl_to_uniform(rv, torch.exp(mid)) > delta
            lo = torch.where(too_concentrated, mid, lo)
            hi = torch.where(too_concentrated, hi, mid)
            if float((hi - lo).max()) < 1e-13:
                break
        lam_v = torch.exp(0.5 * (lo + hi))
        lam_v = torch.where(floor_v, torch.full_like(lam_v, lambda_min), lam_v)
        kl_gap = (_kl_to_uniform(rv, lam_v) - delta).abs()
        if bool((kl_gap[~floor_v] > tol).any()):
            raise RuntimeError(f"QUATRO dual solver did not converge: max |KL - delta| = {float(kl_gap[~floor_v].max()):.3e}")
        lam[valid] = lam_v
        mu[valid] = lam_v * (_log_mean_exp(rv / lam_v.unsqueeze(-1)) - 1.0)
        floored[valid] = floor_v
    if return_info:
        return lam, mu, {"floored": floored, "valid": valid}
    return lam, mu


def quatro_advantages(rewards: torch.Tensor, delta: float, lambda_min: float = 1e-3) -> torch.Tensor:
    """QUATRO advantages A_i = R_i/lambda* - log mean_j exp(R_j/lambda*) = (R_i - (lambda* + mu*)) / lambda*.

    mean_i exp(A_i) = 1 in every group; larger delta gives smaller lambda* and larger |A|.
    Groups with all-equal rewards, and G = 1, get A = 0.

    Args:
        rewards: (num_groups, G); delta > 0; lambda_min > 0 (see :func:`quatro_dual`).
    Returns:
        (num_groups, G) float64 advantages.
    Raises:
        ValueError: as :func:`quatro_dual`.
    """
    lam, _ = quatro_dual(rewards, delta, lambda_min)
    r = rewards.detach().to(torch.float64)
    adv = torch.zeros_like(r)
    ok = ~torch.isnan(lam)
    if ok.any():
        z = r[ok] / lam[ok].unsqueeze(-1)
        adv[ok] = z - _log_mean_exp(z).unsqueeze(-1)
    return adv


@register_advantage("quatro", panels=("train/lambda_mean", "train/lambda_floored_groups"))
def quatro_advantage(batch: RolloutBatch, delta: float, lambda_min: float = 1e-3):
    """Registered QUATRO advantage estimator (see :func:`quatro_advantages`).

    Args:
        batch: ``rewards`` (B,), ``group_index`` (B,) with equal group sizes.
    Returns:
        (advantages (B,) float32, metrics): lambda* mean/median/min/max over groups with an
        interior solution (NaN groups excluded), ``zero_variance_share``, ``lambda_floored_groups``
        (groups where delta >= log(G/m)), ``solver_ms``.
    """
    t0 = time.perf_counter()
    matrix, order = to_groups(batch.rewards.double(), batch.group_index)
    lam, _, info = quatro_dual(matrix, delta, lambda_min, return_info=True)
    adv = torch.zeros_like(matrix)
    ok = info["valid"]
    if ok.any():
        z = matrix[ok] / lam[ok].unsqueeze(-1)
        adv[ok] = z - _log_mean_exp(z).unsqueeze(-1)
    metrics = {
        "zero_variance_share": float((~ok).float().mean()) if ok.numel() else 0.0,
        "lambda_floored_groups": int(info["floored"].sum()),
        "solver_ms": 1000.0 * (time.perf_counter() - t0),
    }
    if ok.any():
        lv = lam[ok]
        metrics.update(
            lambda_mean=float(lv.mean()), lambda_median=float(lv.median()),
            lambda_min=float(lv.min()), lambda_max=float(lv.max()),
        )
    return from_groups(adv, order).float(), metrics


@register_policy_loss("quatro", panels=("train/reversed_share",))
def quatro_loss(
    logprobs: torch.Tensor,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    log_ratio_penalty: bool = True,
    ratio_level: str = "sequence",
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_constant: float | None = None,
    log_ratio_scale: str = "mean",
):
    """QUATRO policy loss (RECONSTRUCTED; see the module docstring).

    J(theta) = mean_i s_i(theta) (A_i - sg[log s_i(theta)]),  loss = -J, no clipping, with
    s_i = exp(mean_t log r_{i,t}) in the token form s_{i,t} = sg[s_i] pi_theta(y_t)/sg[pi_theta(y_t)]
    (as verl's GSPO) aggregated by ``loss_agg_mode``. Per sample the gradient weight w.r.t. log s_i
    is s_i (A_i - log s_i): the plain policy gradient A_i at s = 1, and it changes sign once
    log s_i exceeds A_i, so every sample keeps a restoring gradient.

    Args:
        logprobs: (B, L) with gradient; batch: ``old_logprobs``, ``response_mask`` (B, L);
        advantages: (B,) QUATRO advantages.
        log_ratio_penalty: keep the -sg[log s] term (False: the paper's ablation, J = mean s A).
        ratio_level: ``sequence`` (s_i) or ``token`` (r_{i,t} = pi_theta/pi_old per token).
        log_ratio_scale: the log-ratio in the penalty: ``mean`` (default: log s_i = mean_t log r_{i,t}, length-
            normalised as the ratio itself; per token with ``ratio_level=token``) or ``sum`` (the trajectory
            log-ratio log pi(tau|q)/pi_old(tau|q) = sum_t log r_{i,t}, as the paper's appendix A.3 writes it,
            |y_i| times larger). RECONSTRUCTED: the two readings of the paper; the ablation preset runs both.
    Returns:
        (scalar loss, metrics): sequence-ratio mean/min/max, ``reversed_share`` (samples whose
        log-ratio exceeds their advantage on the side of its sign), ``ppo_kl``.
    Raises:
        ValueError: unknown ``ratio_level`` or ``log_ratio_scale``.
    """
    if ratio_level not in ("sequence", "token"):
        raise ValueError(f"ratio_level={ratio_level!r}: expected 'sequence' or 'token'")
    if log_ratio_scale not in ("mean", "sum"):
        raise ValueError(f"log_ratio_scale={log_ratio_scale!r}: expected 'mean' or 'sum'")
    mask = batch.response_mask
    adv = advantages.reshape(-1, 1) if advantages.dim() == 1 else advantages
    log_s = sequence_log_ratio(logprobs, batch.old_logprobs, mask).clamp(-20.0, 20.0)
    if ratio_level == "sequence":
        ratio = token_form_sequence_ratio(logprobs, log_s)
        log_ratio = log_s.detach().unsqueeze(-1).expand_as(logprobs)
    else:
        log_ratio = (logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
        ratio = torch.exp(log_ratio)
        log_ratio = log_ratio.detach()
    penalty_seq = log_s.detach()                                         # (B,) what the penalty subtracts
    if log_ratio_scale == "sum":
        penalty_seq = (log_s.detach() * mask.sum(-1)).clamp(-1e4, 1e4)   # sum_t log r = |y| mean_t log r
        log_ratio = penalty_seq.unsqueeze(-1).expand_as(logprobs)
    weight = adv - log_ratio if log_ratio_penalty else adv.expand_as(ratio)
    loss = agg_loss(-ratio * weight, mask, loss_agg_mode, norm_constant)
    with torch.no_grad():
        s = torch.exp(log_s)
        a = adv.reshape(-1) if adv.shape[-1] == 1 else masked_mean(adv, mask, dim=-1)
        reversed_ = ((a - penalty_seq) * a < 0).float() if log_ratio_penalty else torch.zeros_like(s)
        metrics = {
            "seq_ratio_mean": float(s.mean()),
            "seq_ratio_min": float(s.min()),
            "seq_ratio_max": float(s.max()),
            "reversed_share": float(reversed_.mean()),
            "ppo_kl": float(masked_mean(batch.old_logprobs - logprobs, mask)),
        }
    return loss, metrics


@register_validator("advantage", "quatro")
def _check_quatro_advantage(delta=None, lambda_min=1e-3, context=None, **_):
    _check_delta(delta)
    check_number("lambda_min", lambda_min, 0, low_open=True)
    G = (context or {}).get("group_size")
    if isinstance(G, int) and G > 1 and delta >= math.log(G / (G - 1)):
        lam = torch.tensor([lambda_min], dtype=torch.float64)
        z = torch.tensor([[1.0] * (G - 1) + [0.0]], dtype=torch.float64) / lam
        a_wrong = float(z[0, -1] - _log_mean_exp(z)[0])
        return [f"QUATRO delta={delta} >= log(G/(G-1)) = {math.log(G / (G - 1)):.4f} (G={G}): a group with G-1 correct "
                f"answers has no interior solution, lambda floors at lambda_min={lambda_min} and the wrong answer's "
                f"advantage is {a_wrong:.0f} (train/lambda_floored_groups counts such groups each step)."]
    return []


@register_validator("policy_loss", "quatro")
def _check_quatro_loss(log_ratio_penalty=True, ratio_level="sequence", log_ratio_scale="mean", **agg):
    if ratio_level not in ("sequence", "token"):
        raise ValueError(f"ratio_level={ratio_level!r}: expected 'sequence' or 'token'")
    if log_ratio_scale not in ("mean", "sum"):
        raise ValueError(f"log_ratio_scale={log_ratio_scale!r}: expected 'mean' or 'sum'")
    if not isinstance(log_ratio_penalty, bool):
        raise ValueError(f"log_ratio_penalty={log_ratio_penalty!r}: expected true or false")
    return check_clip_loss(**agg)
