"""Group-relative advantage estimators (GRPO family)."""
from __future__ import annotations

import torch

from training.batch import RolloutBatch, from_groups, to_groups

from .common import check_number
from .registry import register_advantage, register_validator


def group_normalized_advantages(rewards: torch.Tensor, norm_by_std: bool = True, epsilon: float = 1e-6) -> torch.Tensor:
    """GRPO's group-relative advantage.

    A_i = (R_i - mean_g R) / (std_g R + epsilon) with the unbiased standard deviation
    (GRPO, Shao et al. 2024, sec. 4.1.2); with ``norm_by_std=False``, A_i = R_i - mean_g R
    (Dr. GRPO, Liu et al. 2025, eq. 3). A group whose rewards are all equal gets A = 0, and so
    does a group of one response (its std is undefined).

    Args:
        rewards: (num_groups, G) rewards, one row per prompt.
        norm_by_std: divide by the group's standard deviation.
        epsilon: added to the std.
    Returns:
        (num_groups, G) advantages, float dtype of ``rewards``.
    """
    rewards = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean(-1, keepdim=True)
    if not norm_by_std:
        return centred
    return centred / (rewards.std(-1, unbiased=True, keepdim=True) + epsilon)


def zero_variance_share(rewards: torch.Tensor) -> float:
    """Share of groups (rows of a (num_groups, G) matrix) whose rewards are all equal."""
    if rewards.numel() == 0:
        return 0.0
    return float((rewards.max(-1).values == rewards.min(-1).values).float().mean())


@register_advantage("grpo")
def grpo_advantage(batch: RolloutBatch, norm_by_std: bool = True, epsilon: float = 1e-6):
    """Registered GRPO advantage estimator: see :func:`group_normalized_advantages`.

    Args:
        batch: a :class:`RolloutBatch` with ``rewards`` (B,) and ``group_index`` (B,).
    Returns:
        (advantages (B,), metrics) with the share of zero-variance groups.
    """
    matrix, order = to_groups(batch.rewards.double(), batch.group_index)
    adv = group_normalized_advantages(matrix, norm_by_std=norm_by_std, epsilon=epsilon)
    return from_groups(adv, order).float(), {"zero_variance_share": zero_variance_share(matrix)}


@register_validator("advantage", "grpo")
def _check_grpo(norm_by_std=True, epsilon=1e-6, **_):
    if not isinstance(norm_by_std, bool):
        raise ValueError(f"norm_by_std={norm_by_std!r}: expected true or false")
    check_number("epsilon", epsilon, 0)
    return []
