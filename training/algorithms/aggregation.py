"""Loss aggregation shared by every policy loss, with verl's mode names.

A policy loss computes a per-token loss matrix (B, L); exactly one function turns it into a
scalar, so that two algorithms never differ by an accidental normalisation. It is also the one place where a
per-token weight can enter every algorithm's loss without touching any of them (:func:`token_weights`: the
truncated importance-sampling correction of the training-inference mismatch, :mod:`training.mismatch`).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

_TOKEN_WEIGHTS: contextvars.ContextVar = contextvars.ContextVar("rlvr_token_weights", default=None)


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
        norm_constant: the constant of ``seq-mean-token-sum-norm`` (e.g. the max response length).
    Returns:
        Scalar tensor.
    Raises:
        ValueError: unknown mode.
    Source: verl ``core_algos.agg_loss``; Dr. GRPO (Liu et al., 2025) for the constant normaliser.
    """
    check_loss_agg_mode(mode)
    weights = _TOKEN_WEIGHTS.get()
    if weights is not None:  # inside token_weights(): e.g. the truncated importance-sampling correction
        loss_mat = loss_mat * weights.to(loss_mat.dtype)
    mask = mask.to(loss_mat.dtype)
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
