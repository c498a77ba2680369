"""Advantage shaping on top of GRPO's group statistics: GPG, GRPO-UR, F-GRPO.

ExPPO has its own module (``exppo.py``).
"""
from __future__ import annotations

import torch

from training.batch import RolloutBatch, from_groups, to_groups

from .advantages import group_normalized_advantages, zero_variance_share
from .common import check_number
from .registry import register_advantage, register_validator


def sequence_mean_logprob(batch: RolloutBatch) -> torch.Tensor:
    """(B,) length-normalised old log-probability (1/|y_i|) sum_t log pi_old(y_{i,t})."""
    mask = batch.response_mask.to(batch.old_logprobs.dtype)
    return (batch.old_logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@register_advantage("gpg")
def gpg_advantage(batch: RolloutBatch):
    """GPG advantage A_i = alpha (R_i - mean_g R), alpha = B / (number of responses with A != 0).

    B is the number of responses in the batch; the rescaling compensates for the groups whose
    advantages vanish (Chu et al. 2025, "GPG", eq. 7-8). verl's implementation counts responses with
    a non-zero *reward* instead; with 0/1 rewards that differs whenever a group is all-correct.

    Returns:
        (advantages (B,), metrics with ``gpg_alpha`` and ``zero_variance_share``).
    """
    matrix, order = to_groups(batch.rewards.double(), batch.group_index)
    centred = group_normalized_advantages(matrix, norm_by_std=False)
    nonzero = int((centred != 0).sum())
    alpha = batch.batch_size / nonzero if nonzero else 1.0
    adv = from_groups(alpha * centred, order).float()
    return adv, {"gpg_alpha": alpha, "zero_variance_share": zero_variance_share(matrix)}


def unlikeliness_rank(seq_logprob: torch.Tensor) -> torch.Tensor:
    """(num_groups, G) rank of each response by length-normalised log-probability, least likely = 0."""
    return torch.argsort(torch.argsort(seq_logprob, dim=-1, stable=True), dim=-1, stable=True).to(seq_logprob.dtype)


@register_advantage("grpo_ur", needs={"old_logprobs": "its unlikeliness ranks"})
def grpo_ur_advantage(batch: RolloutBatch, beta: float = 0.25, norm_by_std: bool = True, epsilon: float = 1e-6):
    """GRPO-UR ("Rewarding the Unlikely", He et al. 2025): reward scaling by unlikeliness rank.

    Responses of a group are ranked by length-normalised old log-probability (least likely rank 0);
    rewards of correct responses become R_i (1 - beta rank_i / G), then GRPO normalisation. With the
    paper's 0/1 reward this is R_i (1 - beta rank_i / G) for every response (a zero reward stays zero);
    with rewards that can be negative (the K&K reward) wrong responses keep their reward, so the
    likeliest wrong answer is not rewarded for being likely. Correct = ``batch.correct`` (reward > 0 when absent).

    Returns:
        (advantages (B,), metrics with ``zero_variance_share``).
    """
    rewards, order = to_groups(batch.rewards.double(), batch.group_index)
    seq_lp, _ = to_groups(sequence_mean_logprob(batch).double(), batch.group_index)
    G = rewards.shape[-1]
    correct = rewards > 0 if batch.correct is None else to_groups(batch.correct.double(), batch.group_index)[0] > 0
    shaped = torch.where(correct, rewards * (1.0 - beta * unlikeliness_rank(seq_lp) / G), rewards)
    adv = group_normalized_advantages(shaped, norm_by_std=norm_by_std, epsilon=epsilon)
    return from_groups(adv, order).float(), {"zero_variance_share": zero_variance_share(rewards)}


@register_validator("advantage", "grpo_ur")
def _check_grpo_ur(beta=0.25, **_):
    check_number("beta", beta, 0, 1)
    return []


@register_advantage("f_grpo")
def f_grpo_advantage(batch: RolloutBatch, gamma: float = 1.0, norm_by_std: bool = True, epsilon: float = 1e-6):
    """F-GRPO: GRPO advantages of a group scaled by (1 - pass rate)^gamma, so that groups the policy
    already solves get smaller updates (ExPPO paper's baseline; pass rate = share of correct responses).

    Returns:
        (advantages (B,), metrics with ``zero_variance_share`` and ``pass_rate_mean``).
    """
    rewards, order = to_groups(batch.rewards.double(), batch.group_index)
    correct = rewards > 0 if batch.correct is None else to_groups(batch.correct.double(), batch.group_index)[0] > 0
    pass_rate = correct.double().mean(-1, keepdim=True)
    adv = group_normalized_advantages(rewards, norm_by_std=norm_by_std, epsilon=epsilon) * (1.0 - pass_rate) ** gamma
    return from_groups(adv, order).float(), {"zero_variance_share": zero_variance_share(rewards),
                                             "pass_rate_mean": float(pass_rate.mean())}


@register_validator("advantage", "f_grpo")
def _check_f_grpo(gamma=1.0, **_):
    check_number("gamma", gamma, 0)
    return []
