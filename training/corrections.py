"""The registry of rollout corrections: how the policy loss treats tokens sampled by a policy other than the one its
ratio divides by (``train.rollout.correction``).

A correction is a registered function of the proximal log-probs ``p`` (the trainer's own pass: the policy the loss's
ratio divides by, ``old_logprobs``) and the behaviour log-probs ``b`` (the sampler's log-probs of the sampled tokens,
from the policy that generated them: ``batch.rollout_logprobs`` (the sampler's own), or with ``train.rollout.staleness`` the behaviour
log-probs ``batch.behaviour_logprobs``, docs/staleness.md), both (B, L), the response mask (B, L) and its
thresholds ``cap`` = C >= 1 (``train.rollout.correction_cap``) and ``lower`` in (0, 1]
(``train.rollout.correction_lower``; null: 1 / C). It returns a :class:`Correction`: per-token ``weights`` (the
importance weight each kept token's loss term is multiplied by; 0 on a rejected token, 1 outside the mask), ``keep``
(1 on the response tokens that stay in the loss, 0 on rejected and padding ones) and its ``metrics``. With the token
ratio ``r_t = exp(p_t - b_t)``:

- ``none``: weight 1, every token kept;
- ``token_tis``: weight min(r_t, C), every token kept;
- ``sequence_tis``: weight min(prod_t r_t, C) on each of the response's tokens, every token kept;
- ``token_mis``: weight r_t, kept where r_t <= C;
- ``sequence_mis``: weight prod_t r_t, kept: the responses with prod_t r_t <= C;
- ``icepop``: weight r_t, kept where lower <= r_t <= C;
- ``geo_rs``: weight 1, kept: the responses with lower <= exp(mean_t log r_t) <= C.

Each is checked against verl 0.9.1's ``verl/trainer/ppo/rollout_corr_helper.py``
(``tests/training/test_corrections.py``: the same tensors through verl's functions with the settings that define the
same quantity). As verl, every ratio is computed from a log-ratio clamped to [-20, 20] (verl's ``SAFETY_BOUND``; the
sequence weights from the clamped sum).

How the trainer applies it (:func:`training.update.minibatch_step`): the policy loss's per-token terms are multiplied
by ``weights * keep`` inside its aggregation (:func:`training.algorithms.aggregation.token_weights`, so every registered
algorithm gets it), and the trainer's own KL and entropy terms by ``keep``: a rejected token adds nothing to the loss
or its gradient (all tokens rejected: a zero gradient, not NaN). The denominators of the aggregation (token count,
response count, per-response token count) still count the rejected tokens: they are counted over the whole minibatch
before it is split into micro-batches (:class:`training.algorithms.aggregation.Normalisers`), and on the aligned path
the first minibatch's proximal log-probs (hence ``keep``) exist only after its own passes. This is verl's convention
for IcePop (``rollout_is`` with ``lower_upper``: weights 0, ``response_mask`` unchanged) and TRL's for its
``*_mask`` modes (weights 0); verl's rejection (``rollout_rs``) instead rewrites ``response_mask`` before the update,
so there the rejected tokens (and fully rejected responses in the ``seq-mean-*`` modes) leave the denominators too:
in ``token-mean`` the same direction with a gradient larger by the inverse of the kept share; in the ``seq-mean-*``
modes the partly kept responses also weigh more there.

A plug-in adds its own with :func:`register_correction` (a module named in ``plugins``); the config's
``train.rollout.correction`` choices are the registered names (:func:`orchestrator.checks.schema.collect_specs`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from core.plugins import Registry
from training.algorithms.aggregation import masked_mean

#: verl's bound on a log-ratio before it is exponentiated (rollout_corr_helper.SAFETY_BOUND)
SAFETY_BOUND = 20.0

#: name -> ``fn(p, b, mask, cap, lower) -> Correction``; the built-ins register below, plug-ins via ``plugins``
CORRECTIONS: Registry = Registry("rollout correction")


@dataclass(frozen=True)
class Correction:
    """What a correction returns, and what every loss term of an optimiser step is weighted by
    (:func:`training.update.policy_objective` always takes one: :meth:`none` where no correction applies).

    Attributes:
        weights: (B, L) float, detached: each response token's weight in the policy loss (0 on a rejected token),
            1 outside the mask; None: 1 everywhere.
        keep: (B, L) float: 1 on the response tokens that stay in the loss, 0 on rejected and padding tokens; None:
            every token kept.
        metrics: ``correction_*`` (and ``tis_*`` for the TIS modes) as floats.
    """

    weights: torch.Tensor | None
    keep: torch.Tensor | None
    metrics: dict = field(default_factory=dict)

    @classmethod
    def none(cls) -> "Correction":
        """No correction (weight 1, every token kept, no metrics): the loss terms exactly as without one."""
        return cls(None, None, {})

    @property
    def loss_weights(self) -> torch.Tensor | None:
        """The policy loss's per-token weights: ``weights * keep`` (None: 1 everywhere)."""
        if self.weights is None or self.keep is None:
            return self.weights if self.keep is None else self.keep
        return self.weights * self.keep


def register_correction(name: str, reads: tuple[str, ...] = ("cap", "lower")) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(p, b, mask, cap, lower) -> Correction`` as the correction ``name`` (``p``, ``b``,
    ``mask``: (B, L); ``cap`` = C >= 1 and ``lower`` in (0, 1], already resolved). ``reads``: the thresholds it uses
    (``cap``, ``lower``; both unless said), so that pre-flight can say when ``train.rollout.correction_cap`` or
    ``correction_lower`` is set for a correction that ignores it (:func:`reads`). A plug-in module named in
    ``plugins`` registers its own this way.

    Raises:
        ValueError: ``name`` is empty or already registered to another function, or ``reads`` names something else.
    """
    unknown = set(reads) - {"cap", "lower"}
    if unknown:
        raise ValueError(f"register_correction({name!r}): reads={sorted(unknown)}; a correction reads 'cap', 'lower'")

    def deco(fn: Callable) -> Callable:
        CORRECTIONS.register(name, fn)
        _READS[name] = tuple(reads)
        return fn

    return deco


_READS: dict[str, tuple[str, ...]] = {}


def reads(name: str) -> tuple[str, ...]:
    """The thresholds the registered correction ``name`` uses: a subset of ``("cap", "lower")``
    (:func:`register_correction`'s ``reads``).

    Raises:
        KeyError: ``name`` is not registered.
    """
    CORRECTIONS[name]  # noqa: B018 -- the registry's own error for an unknown name (and its plug-ins imported)
    return _READS.get(name, ("cap", "lower"))


def check_correction(name, cap: float = 2.0, lower: float | None = None) -> tuple[float, float]:
    """Check a correction's name and thresholds (``train.rollout.correction*``).

    Returns:
        (C, lower) with ``lower`` resolved (None: 1 / C).
    Raises:
        ValueError: one line naming the key: an unregistered name (listing the registered ones), a cap below 1, a
            lower bound outside (0, 1].
    """
    if name not in CORRECTIONS:
        raise ValueError(f"train.rollout.correction={name!r}: unknown; registered: {CORRECTIONS.keys()}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 1.0 <= cap < math.inf:
        raise ValueError(f"train.rollout.correction_cap={cap!r}: expected a number >= 1")
    if lower is None:
        return float(cap), 1.0 / float(cap)
    if isinstance(lower, bool) or not isinstance(lower, (int, float)) or not 0.0 < lower <= 1.0:
        raise ValueError(f"train.rollout.correction_lower={lower!r}: expected a number in (0, 1] (or null: 1 / cap)")
    return float(cap), float(lower)


def correct(name: str, p: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, cap: float = 2.0,
            lower: float | None = None) -> Correction:
    """The correction ``name`` of the proximal log-probs ``p`` against the behaviour log-probs ``b``.

    Args:
        name: a registered correction (:data:`CORRECTIONS`).
        p, b: (B, L) log-probs of the sampled tokens (the trainer's, the sampler's); mask: (B, L), 1 on response
            tokens.
        cap: C >= 1; lower: in (0, 1], None: 1 / C.
    Returns:
        The :class:`Correction` (weights detached).
    Raises:
        ValueError: as :func:`check_correction`; TypeError: a plug-in that returns no (B, L) :class:`Correction`.
    """
    cap, lower = check_correction(name, cap, lower)
    out = CORRECTIONS.get(name)(p, b, mask, cap=cap, lower=lower)
    if not isinstance(out, Correction) or out.weights.shape != mask.shape or out.keep.shape != mask.shape:
        raise TypeError(f"rollout correction {name!r} must return a Correction with (B, L) = {tuple(mask.shape)} "
                        f"weights and keep, got {type(out).__name__}")
    return Correction(out.weights.detach(), out.keep.detach(), dict(out.metrics))


# ----------------------------------------------------------------------------------------------------------- helpers

def _log_ratio(p: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log r, mask) as float (at least float32): ``log r = p - b`` on the mask, 0 elsewhere (unclamped)."""
    dtype = torch.promote_types(torch.promote_types(p.dtype, b.dtype), torch.float32)
    m = mask.to(dtype)
    lr = torch.where(m > 0, p.detach().to(dtype) - b.detach().to(dtype), torch.zeros((), dtype=dtype, device=m.device))
    return lr, m


def _seq_level(keep_row: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """A (B,) or (B, 1) bool of kept responses as the (B, L) float keep."""
    return m * keep_row.reshape(-1, 1).to(m.dtype)


def _result(w: torch.Tensor, keep: torch.Tensor, m: torch.Tensor, sequence: bool = False,
            tis_cap: float | None = None) -> Correction:
    """The :class:`Correction` of weights ``w`` on the kept tokens ``keep``: weights 0 on rejected tokens, 1 outside
    the mask, and the metrics: ``correction_weight_mean`` (over kept tokens), ``correction_masked_share`` (response
    tokens rejected), with ``sequence`` ``correction_rejected_share`` (responses with a rejected token, over the
    responses with a token), with ``tis_cap`` the TIS modes' ``tis_weight_mean`` and ``tis_capped_share``."""
    weights = torch.where(m > 0, w * keep, torch.ones_like(w)).detach()
    metrics = {"correction_weight_mean": float(masked_mean(weights, keep)),
               "correction_masked_share": float(masked_mean(1.0 - keep, m))}
    if sequence:
        has = m.sum(-1) > 0
        rejected = ((m - keep).sum(-1) > 0) & has
        metrics["correction_rejected_share"] = float(rejected.sum()) / max(int(has.sum()), 1)
    if tis_cap is not None:
        metrics["tis_weight_mean"] = float(masked_mean(weights, m))
        metrics["tis_capped_share"] = float(masked_mean((weights >= tis_cap - 1e-6).to(m.dtype), m))
    return Correction(weights, keep.detach(), metrics)


# -------------------------------------------------------------------------------------------------------- built-ins

@register_correction("none", reads=())
def no_correction(p, b, mask, cap: float, lower: float) -> Correction:
    """No correction: weights 1, every response token kept (the papers' protocols; the mismatch is still logged,
    :mod:`training.mismatch`). No metrics.

    Check values: any input gives weights 1 everywhere and ``keep`` = the mask."""
    m = mask.to(torch.promote_types(p.dtype, torch.float32))
    return Correction(torch.ones_like(m), m, {})


@register_correction("token_tis", reads=("cap",))
def token_tis(p, b, mask, cap: float, lower: float) -> Correction:
    """Token-level truncated importance sampling: ``w_t = min(r_t, C)``, every token kept.

    Source: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (the TIS
    blog); verl 0.9.1 ``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold=C)`` (the same
    weights on the mask; verl puts 0 on padding, here 1), TRL's ``token_truncate`` without ``clip_min``.

    Check values (C = 2): log r = [[0.5, -1, 0], [0, 1.5, pad]] gives weights
    [[e^0.5 = 1.6487, e^-1 = 0.3679, 1], [1, 2 (e^1.5 = 4.48 capped), 1]], ``tis_capped_share`` 1/5,
    ``tis_weight_mean`` 6.0166/5 = 1.2033."""
    lr, m = _log_ratio(p, b, mask)
    w = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().clamp(max=cap)
    return _result(w, m, m, tis_cap=cap)


@register_correction("sequence_tis", reads=("cap",))
def sequence_tis(p, b, mask, cap: float, lower: float) -> Correction:
    """Sequence-level truncated importance sampling: each token of response i weighted by
    ``w_i = min(prod_t r_t, C)`` (the product over the response's tokens, from the sum of log-ratios), every token kept.

    Source: Yao et al. 2025 (the TIS blog); verl 0.9.1 ``compute_rollout_correction_weights(rollout_is="sequence",
    rollout_is_threshold=C)`` (the sum of unclamped token log-ratios, clamped to [-20, 20], exponentiated, capped:
    the same), TRL's ``sequence_truncate``.

    Check values (C = 2): log r = [[0.5, -1, 0], [0, 1.5, pad]]: sums -0.5 and 1.5, weights
    [[e^-0.5 = 0.6065] * 3, [2, 2, 1 (pad)]] (e^1.5 capped), ``tis_capped_share`` 2/5."""
    lr, m = _log_ratio(p, b, mask)
    w = lr.sum(-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().clamp(max=cap).expand_as(lr)
    return _result(w, m, m, tis_cap=cap)


@register_correction("token_mis", reads=("cap",))
def token_mis(p, b, mask, cap: float, lower: float) -> Correction:
    """Token-level masked importance sampling: a token whose ratio exceeds C is rejected (instead of truncated),
    every other token weighted by its ratio: ``w_t = r_t 1{r_t <= C}``. One-sided, as the MIS of the source and
    TRL's ``token_mask`` without ``clip_min`` (``lower`` is not read; two-sided is :func:`icepop`).

    Source: Liu, Li, Fu, Wang, Liu, Shen 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
    Training-Inference Mismatch" (token-level MIS); verl 0.9.1 defines it as token IS plus token rejection:
    ``compute_rollout_correction_and_rejection_mask(rollout_is="token", rollout_is_threshold=C,
    rollout_rs="token_k1", rollout_rs_threshold=f"{1/C}_inf")``: verl's ``token_k1`` statistic is ``-log r``
    (bounds on pi_rollout / pi_old), its ``lower_upper`` = (1/C, inf) keeps r <= C, and its kept tokens carry the
    IS weight min(r, C) = r (the same weights and mask; verl's default ``token_k1`` band is two-sided, [1/C, C]).

    Check values (C = 2): log r = [[0.5, -1, 0], [0, 1.5, pad]]: keep [[1, 1, 1], [1, 0, 0]], weights
    [[1.6487, 0.3679, 1], [1, 0, 1]], ``correction_masked_share`` 1/5, ``correction_weight_mean`` 4.0166/4."""
    lr, m = _log_ratio(p, b, mask)
    safe = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    ok = (-safe) >= math.log(1.0 / cap)  # verl's token_k1 test against its lower bound 1/C
    return _result(safe.exp(), m * ok.to(m.dtype), m)


@register_correction("sequence_mis", reads=("cap",))
def sequence_mis(p, b, mask, cap: float, lower: float) -> Correction:
    """Sequence-level masked importance sampling: a response whose ratio ``prod_t r_t`` exceeds C is rejected whole,
    every other weighted by its ratio: ``w_i = prod_t r_t 1{prod_t r_t <= C}``. One-sided (``lower`` is not read), as
    the source and TRL's ``sequence_mask`` without ``clip_min``.

    Source: Liu et al. 2025, "When Speed Kills Stability" (sequence-level MIS); verl 0.9.1
    ``compute_rollout_correction_and_rejection_mask(rollout_is="sequence", rollout_is_threshold=C,
    rollout_rs="seq_sum_k1", rollout_rs_threshold=f"{1/C}_inf")`` (its ``decoupled_seq_is_rs`` preset with a
    one-sided band; the preset's default "0.5_2.0" is two-sided): the rejection reads the sum of the clamped token
    log-ratios, the weight min(prod r, C) the clamped sum of the unclamped ones, as here (they differ only where a
    token's |log r| > 20).

    Check values (C = 2): log r = [[0.5, -1, 0], [0, 1.5, pad]]: products e^-0.5 (kept) and e^1.5 = 4.48
    (rejected): keep [[1, 1, 1], [0, 0, 0]], weights [[0.6065] * 3, [0, 0, 1]], ``correction_masked_share`` 2/5,
    ``correction_rejected_share`` 1/2."""
    lr, m = _log_ratio(p, b, mask)
    stat = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).sum(-1)
    ok = (-stat) >= math.log(1.0 / cap)  # verl's seq_sum_k1 test against its lower bound 1/C
    w = lr.sum(-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().clamp(max=cap).expand_as(lr)
    return _result(w, _seq_level(ok, m), m, sequence=True)


@register_correction("icepop")
def icepop(p, b, mask, cap: float, lower: float) -> Correction:
    """IcePop: a two-sided band on the token ratio: a token with r_t outside [lower, C] is rejected, every other
    weighted by its ratio: ``w_t = r_t 1{lower <= r_t <= C}``.

    Source: the Ring-1T report (Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning for
    Trillion-Scale Thinking Model", IcePop: M(k) = k on [alpha, beta], else 0; its alpha = 0.5, beta = 5); verl
    0.9.1 ``compute_rollout_correction_weights(rollout_is="token", rollout_is_threshold=f"{lower}_{C}")`` (the band
    tested on the ratio itself, zero weights outside it, ``response_mask`` unchanged: the same); TRL's ``token_mask``
    with ``clip_min``. Defaults here: [1/C, C] = [0.5, 2] (set ``correction_cap=5, correction_lower=0.5`` for the
    report's band).

    Check values (C = 2, lower = 0.5): log r = [[0.5, -1, 0], [0, 1.5, pad]]: ratios 1.6487 (in), 0.3679 (out),
    1, 1 (in), 4.48 (out): keep [[1, 0, 1], [1, 0, 0]], weights [[1.6487, 0, 1], [1, 0, 1]],
    ``correction_masked_share`` 2/5."""
    lr, m = _log_ratio(p, b, mask)
    r = lr.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    ok = (r >= lower) & (r <= cap)
    return _result(r, m * ok.to(m.dtype), m)


@register_correction("geo_rs")
def geo_rs(p, b, mask, cap: float, lower: float) -> Correction:
    """Geometric rejection sampling: a response whose geometric-mean token ratio ``exp(mean_t log r_t)`` leaves
    [lower, C] is rejected whole; the kept tokens weigh 1 (rejection only, no IS weight).

    Source: Liu et al. 2025, "When Speed Kills Stability" (the length-normalised sequence ratio); verl 0.9.1
    ``compute_rollout_rejection_mask(rollout_rs="seq_mean_k1", rollout_rs_threshold=f"{1/C}_{1/lower}")`` with
    ``rollout_is=None`` (its ``decoupled_geo_rs`` preset, whose default band is 0.999_1.001): verl's ``seq_mean_k1``
    is the mean of ``-log r`` (so its bounds are on the inverse ratio: [1/C, 1/lower] there is [lower, C] here) over
    the clamped token log-ratios, as here; verl's masked mean adds 1e-8 to the token count (a relative 1e-8 / n, a
    different decision only on a tie).

    Check values (C = 2, lower = 0.5): log r = [[0.5, -1, 0], [0, 1.5, pad]]: geometric means e^(-0.5/3) = 0.846
    (kept) and e^0.75 = 2.117 (rejected): keep [[1, 1, 1], [0, 0, 0]], weights [[1, 1, 1], [0, 0, 1]],
    ``correction_rejected_share`` 1/2."""
    lr, m = _log_ratio(p, b, mask)
    stat = -(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    ok = (stat >= math.log(1.0 / cap)) & (stat <= math.log(1.0 / lower))
    return _result(torch.ones_like(lr), _seq_level(ok, m), m, sequence=True)
