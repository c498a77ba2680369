"""Verifiable rewards."""
from __future__ import annotations

import torch

from evaluation.verify import is_correct


def math_rewards(responses: list[str], golds: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary correctness reward: 1.0 when math-verify finds the response's answer equal to the gold.

    Args:
        responses: B decoded responses; golds: B gold answers.
    Returns:
        (rewards (B,) float32, correct (B,) bool). A malformed response scores 0, never raises.
    Raises:
        ValueError: the two lists differ in length.
    """
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
    correct = torch.tensor([is_correct(r, g) for r, g in zip(responses, golds)], dtype=torch.bool)
    return correct.float(), correct
