"""Verifiable rewards."""
from __future__ import annotations

import torch

from evaluation.verify import default_verifier


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
    correct = torch.tensor([ok for ok, _ in default_verifier().check_many(responses, golds)], dtype=torch.bool)
    return correct.float(), correct


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward (Yu et al. 2025, eq. 13).

    penalty = factor * min(-(len - (L - B)) / B, 0) with L = ``max_length``, B = ``buffer``: 0 up to
    L - B tokens, then linear down to -factor at L tokens.

    Args:
        lengths: (B,) response lengths in tokens.
    Returns:
        (B,) float32 penalties (<= 0).
    Raises:
        ValueError: buffer outside [1, max_length].
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"overlong buffer={buffer}: must be in [1, max_length={max_length}]")
    excess = lengths.float() - (max_length - buffer)
    return factor * torch.clamp(-excess / buffer, max=0.0)
