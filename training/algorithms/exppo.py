"""ExPPO: exploration-preserving multiplicative advantage shaping.

RECONSTRUCTED from the paper's Table 1 and its coefficient audit (the exact rule could not be read):

- surprisal s_i = -(1/|y_i|) sum_t log pi_old(y_{i,t}); u_i = s_i - mean over the group (u_i > 0: rare);
- pass rate rho = share of correct responses in the group;
- gate g_i = 1 - rho if u_i > 0, rho if u_i < 0, 0 if u_i = 0;
- m_i = 1 + lambda g_i tanh(u_i / scale) sign(A_i), so m_i in [1 - lambda, 1 + lambda] and the
  verifier's sign is kept: rare-correct reinforced more, common-correct less, rare-wrong penalised
  less, common-wrong more;
- shared normalisation: A_hat_i = m_i A_i sum_j |A_j| / sum_j |m_j A_j| (the group's total absolute
  advantage is preserved).

Ablation switches (ExPPO's Table 9, each part switched off; the paper's exact ablated forms are unknown, so these
readings are RECONSTRUCTED): ``rarity=False`` replaces the rarity term tanh(u_i / scale) by 1 (the gate still
reads the sign of u_i); ``pass_rate_gate=False`` sets g_i = 1 wherever u_i != 0; ``shared_norm=False`` keeps
A_hat_i = m_i A_i (no renormalisation of the group's |A| mass); ``shuffle_surprisal=True`` (the control) permutes
the surprisals within each group before anything else, so rarity no longer belongs to the response it shapes.

Alternatives a reader may prefer, not implemented: an additive bonus instead of the multiplicative
factor; surprisal without length normalisation; a gate that ignores the pass rate. ``scale`` (the
tanh temperature, in nats per token) is this suite's choice; the paper's value is unknown.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from training.batch import RolloutBatch, from_groups, to_groups

from .advantages import group_normalized_advantages, zero_variance_share
from .common import check_number
from .registry import register_advantage, register_validator
from .shaping import sequence_mean_logprob


@dataclass(frozen=True)
class ExppoParts:
    """ExPPO's parts, each switchable for its Table 9 ablation (module docstring): the rarity term (``tanh`` of the
    prompt-relative surprisal), the pass-rate gate, the shared normalisation of the group's |A| mass, and the control
    that shuffles the surprisals within each group. The defaults are ExPPO itself."""

    rarity: bool = True
    pass_rate_gate: bool = True
    shared_norm: bool = True
    shuffle_surprisal: bool = False


def exppo_advantages(rewards: torch.Tensor, surprisal: torch.Tensor, lam: float = 0.2, scale: float = 1.0,
                     correct: torch.Tensor | None = None, base_advantages: torch.Tensor | None = None,
                     parts: ExppoParts = ExppoParts(), generator: torch.Generator | None = None):
    """ExPPO-shaped advantages for whole groups (see the module docstring for the rule).

    Args:
        rewards: (num_groups, G) rewards.
        surprisal: (num_groups, G) length-normalised surprisal s_i (nats per token).
        lam: shaping strength lambda in [0, 1] (paper: 0.2; its Table 9 ablates 0.10 to 1.00). At lambda = 1
            every multiplier stays positive: g < 1 whenever advantages are non-zero (0 < rho < 1) and |tanh| < 1.
        scale: tanh temperature for the prompt-relative surprisal (> 0).
        correct: (num_groups, G) bool; default ``rewards > 0``.
        base_advantages: (num_groups, G) advantages to shape; default GRPO's (unbiased std). Any registered
            estimator's advantages can be shaped this way (``base_estimator``: ExPPO on top of DAPO's).
        parts: the ablation switches (:class:`ExppoParts`; the default is ExPPO itself).
        generator: the random source of ``parts.shuffle_surprisal`` (default: torch's global one).
    Returns:
        (A_hat (num_groups, G), audit) where audit holds the four sums of A_hat - A over
        correct/wrong x rare/common (``audit_correct_rare`` ...) and ``multiplier_mean``.
    Raises:
        ValueError: lam outside [0, 1], scale <= 0, or shapes that differ.
    """
    check_number("lam", lam, 0, 1)
    check_number("scale", scale, 0, low_open=True)
    if rewards.shape != surprisal.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and surprisal {tuple(surprisal.shape)} differ in shape")
    rewards, surprisal = rewards.double(), surprisal.double()
    correct = rewards > 0 if correct is None else correct.bool()
    adv = group_normalized_advantages(rewards) if base_advantages is None else base_advantages.double()
    if parts.shuffle_surprisal and surprisal.numel():
        perm = torch.stack([torch.randperm(surprisal.shape[-1], generator=generator) for _ in range(surprisal.shape[0])])
        surprisal = torch.gather(surprisal, -1, perm.to(surprisal.device))
    u = surprisal - surprisal.mean(-1, keepdim=True)
    rho = correct.double().mean(-1, keepdim=True)
    if parts.pass_rate_gate:
        gate = torch.where(u > 0, 1.0 - rho, torch.where(u < 0, rho, torch.zeros_like(u)))
    else:
        gate = (u != 0).double()
    term = torch.tanh(u / scale) if parts.rarity else torch.ones_like(u)
    m = 1.0 + lam * gate * term * torch.sign(adv)
    shaped = m * adv
    mass, shaped_mass = adv.abs().sum(-1, keepdim=True), shaped.abs().sum(-1, keepdim=True)
    if parts.shared_norm:
        a_hat = torch.where(shaped_mass > 0, shaped * mass / shaped_mass.clamp(min=1e-300), torch.zeros_like(shaped))
    else:
        a_hat = shaped
    diff = a_hat - adv
    rare = u > 0
    audit = {
        "audit_correct_rare": float(diff[correct & rare].sum()),
        "audit_correct_common": float(diff[correct & ~rare].sum()),
        "audit_wrong_rare": float(diff[~correct & rare].sum()),
        "audit_wrong_common": float(diff[~correct & ~rare].sum()),
        "multiplier_mean": float(m.mean()) if m.numel() else 1.0,
    }
    return a_hat, audit


@register_advantage("exppo", needs={"old_logprobs": "its surprisal classes",
                                    "generator": ("the shuffled-surprisal control's permutations", "shuffle_surprisal")})
def exppo_advantage(batch: RolloutBatch, lam: float = 0.2, scale: float = 1.0, rarity: bool = True,
                    pass_rate_gate: bool = True, shared_norm: bool = True, shuffle_surprisal: bool = False,
                    base_estimator: str | None = None, generator: torch.Generator | None = None, **base):
    """Registered ExPPO estimator: surprisal from the batch's old log-probs, then :func:`exppo_advantages`.

    Args:
        rarity, pass_rate_gate, shared_norm, shuffle_surprisal: Table 9's ablation switches (module docstring).
        generator: the random source of ``shuffle_surprisal``'s permutations (declared: the engine hands one seeded
            per step; None: torch's global generator).
        base_estimator: shape the advantages of this registered estimator instead of GRPO's (``algo=dapo`` with
            ``advantage.name=exppo``, ``advantage.base_estimator=grpo``: ExPPO + DAPO, the paper's Fig. 7 / Table 15);
            ``base``: its parameters (the keys this signature does not name, :func:`registry.base_params`).
            Sequence-level advantages only.
    Returns:
        (advantages (B,), metrics: the four-class audit, ``multiplier_mean``, ``zero_variance_share``, and the
        base estimator's metrics under ``base/``).
    Raises:
        ValueError: ``base_estimator`` names an estimator that returns per-token advantages.
    """
    rewards, order = to_groups(batch.rewards.double(), batch.group_index)
    surprisal, _ = to_groups(-sequence_mean_logprob(batch).double(), batch.group_index)
    correct = None if batch.correct is None else to_groups(batch.correct.double(), batch.group_index)[0] > 0
    base_adv, base_metrics = None, {}
    if base_estimator:
        from .registry import get_advantage_fn

        adv, base_metrics = get_advantage_fn(base_estimator)(batch, **base)
        if adv.dim() != 1:
            raise ValueError(f"algo.advantage.base_estimator={base_estimator!r}: per-token advantages cannot be shaped per response")
        base_adv = to_groups(adv.double(), batch.group_index)[0]
    a_hat, audit = exppo_advantages(rewards, surprisal, lam, scale, correct, base_adv,
                                    ExppoParts(rarity, pass_rate_gate, shared_norm, shuffle_surprisal), generator)
    return from_groups(a_hat, order).float(), {**audit, "zero_variance_share": zero_variance_share(rewards),
                                               **{f"base/{k}": v for k, v in base_metrics.items()}}


@register_validator("advantage", "exppo")
def _check_exppo(lam=0.2, scale=1.0, base_estimator=None, rarity=True, pass_rate_gate=True, shared_norm=True,
                 shuffle_surprisal=False, **base):
    check_number("lam", lam, 0, 1)
    check_number("scale", scale, 0, low_open=True)
    if base_estimator is None:
        if base:
            raise ValueError(f"algo.advantage: unknown parameter(s) {sorted(base)} for exppo (without "
                             "algo.advantage.base_estimator, which names the estimator they would belong to)")
        return []
    from .registry import get_advantage_fn, validate_params

    if base_estimator == "exppo":
        raise ValueError("algo.advantage.base_estimator='exppo': ExPPO cannot shape itself")
    try:
        get_advantage_fn(base_estimator)
    except KeyError as e:
        raise ValueError(f"algo.advantage.base_estimator={base_estimator!r}: {e.args[0]}") from None
    return validate_params("advantage", base_estimator, base)
