"""Loss aggregation shared by every policy loss, with verl's mode names.

A policy loss computes a per-token loss matrix (B, L); exactly one function turns it into a
scalar, so that two algorithms never differ by an accidental normalisation. It is also the one place where a
per-token weight can enter every algorithm's loss without touching any of them (:func:`token_weights`: the
truncated importance-sampling correction of the training-inference mismatch, :mod:`training.mismatch`).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

_TOKEN_WEIGHTS: contextvars.ContextVar = contextvars.ContextVar("rlvr_token_weights", default=None)
_NORMALISERS: contextvars.ContextVar = contextvars.ContextVar("rlvr_minibatch_normalisers", default=None)


@dataclass(frozen=True)
class Normalisers:
    """The denominators of every aggregation mode, counted over a whole minibatch before it is split into
    micro-batches (:func:`over_minibatch`), so that the micro-batches' losses add up to the minibatch's.

    Attributes:
        tokens: response tokens the mask keeps (``token-mean``).
        sequences: responses (``seq-mean-token-sum``, ``seq-mean-token-sum-norm``).
        valid_sequences: responses with at least one kept token (``seq-mean-token-mean``).
        norm_constant: ``seq-mean-token-sum-norm``'s constant where the loss sets none: the configured maximum
            response length (Dr. GRPO's constant), never a padded width.
    """

    tokens: float
    sequences: int
    valid_sequences: int
    norm_constant: float | None = None

    @classmethod
    def of(cls, mask: torch.Tensor, norm_constant: float | None = None) -> "Normalisers":
        """The normalisers of a minibatch's (B, L) response mask."""
        m = mask.to(torch.float64)
        return cls(float(m.sum()), int(m.shape[0]), int((m.sum(-1) > 0).sum()),
                   None if norm_constant is None else float(norm_constant))


@contextlib.contextmanager
def over_minibatch(normalisers: Normalisers | None):
    """Within this context :func:`agg_loss` divides by ``normalisers`` (the whole minibatch's) instead of counting
    the batch it is given: a micro-batch's loss is then its share of the minibatch's loss, and the gradients of
    the micro-batches add up to the one-pass gradient exactly (for a loss whose only reduction across responses is
    :func:`agg_loss`: every built-in one; a loss that couples responses otherwise declares it,
    :func:`training.algorithms.registry.register_policy_loss`). ``None`` changes nothing.

    Peers that got this wrong: verl's critic divided per micro-batch until PR #6957 (gradient K-fold too large);
    OpenRLHF averaged micro-batch means until #1249."""
    token = _NORMALISERS.set(normalisers)
    try:
        yield
    finally:
        _NORMALISERS.reset(token)


@contextlib.contextmanager
def token_weights(weights: torch.Tensor | None):
    """Within this context every :func:`agg_loss` call multiplies its per-token loss matrix by ``weights`` (B, L)
    (or (B, 1)) before aggregating, normalisers unchanged; ``None`` changes nothing. The trainer wraps the policy
    loss's call in it, so the weights reach each per-token term a registered loss aggregates (its surrogate, and a
    KL term inside the loss such as TR-GRPO's), and not the trainer's own KL and entropy terms."""
    token = _TOKEN_WEIGHTS.set(weights)
    try:
        yield
    finally:
        _TOKEN_WEIGHTS.reset(token)

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def check_loss_agg_mode(mode: str) -> None:
    """Raise ``ValueError`` naming ``mode`` when it is not one of :data:`LOSS_AGG_MODES`."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode={mode!r}: unknown; expected one of {list(LOSS_AGG_MODES)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1.

    Args:
        values: any shape; mask: same shape, 0/1 (bool or float).
        dim: reduce over this dim (or all dims when None).
    Returns:
        The masked mean; 0 where the mask is empty (never NaN).
    """
    mask = mask.to(values.dtype)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_constant: float | None = None) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Args:
        loss_mat: (B, L) per-token loss.
        mask: (B, L) response mask, 1 on generated tokens.
        mode: one of verl's names:
            ``token-mean``: sum over all tokens / number of tokens in the batch (DAPO);
            ``token-sum``: sum over all tokens of the batch (no normalisation: the gradient grows with the
            batch's token count; verl's ``token-sum``);
            ``seq-mean-token-mean``: mean over tokens per sequence, then mean over sequences (GRPO, GSPO);
            ``seq-mean-token-sum``: sum over tokens per sequence, then mean over sequences;
            ``seq-mean-token-sum-norm``: sum over all tokens / (B * norm_constant) (Dr. GRPO;
            ``norm_constant`` defaults to L, the padded response length).
        norm_constant: the constant of ``seq-mean-token-sum-norm`` (e.g. the max response length); None: the
            :func:`over_minibatch` context's (the trainer sets the configured maximum response length), else L.
    Returns:
        Scalar tensor. Inside :func:`over_minibatch` every denominator is the whole minibatch's.
    Raises:
        ValueError: unknown mode.
    Source: verl ``core_algos.agg_loss``; Dr. GRPO (Liu et al., 2025) for the constant normaliser.
    """
    check_loss_agg_mode(mode)
    weights = _TOKEN_WEIGHTS.get()
    if weights is not None:  # inside token_weights(): e.g. the truncated importance-sampling correction
        loss_mat = loss_mat * weights.to(loss_mat.dtype)
    mask = mask.to(loss_mat.dtype)
    whole = _NORMALISERS.get()
    if whole is not None:  # a micro-batch's share of its minibatch's loss
        if mode == "token-mean":
            return (loss_mat * mask).sum() / max(whole.tokens, 1.0)
        if mode == "token-sum":
            return (loss_mat * mask).sum()
        seq_sum = (loss_mat * mask).sum(-1)
        if mode == "seq-mean-token-mean":
            per_seq = seq_sum / mask.sum(-1).clamp(min=1.0)
            return per_seq.sum() / max(whole.valid_sequences, 1)
        if mode == "seq-mean-token-sum":
            return seq_sum.sum() / max(whole.sequences, 1)
        constant = norm_constant if norm_constant is not None else whole.norm_constant
        constant = float(constant if constant is not None else loss_mat.shape[-1])
        return seq_sum.sum() / (max(whole.sequences, 1) * constant)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "token-sum":
        return (loss_mat * mask).sum()
    seq_sum = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        seq_len = mask.sum(-1)
        valid = seq_len > 0
        per_seq = seq_sum / seq_len.clamp(min=1.0)
        return per_seq[valid].mean() if valid.any() else loss_mat.sum() * 0.0
    if mode == "seq-mean-token-sum":
        return seq_sum.mean()
    constant = float(norm_constant if norm_constant is not None else loss_mat.shape[-1])
    return seq_sum.sum() / (loss_mat.shape[0] * constant)
