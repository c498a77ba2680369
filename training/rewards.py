"""Verifiable rewards: the registered task's checker for each prompt row (:mod:`core.tasks`), and DAPO's
overlong shaping."""
from __future__ import annotations

import torch

from core.tasks import score_responses


def row_rewards(responses: list[str], rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of responses to prompt rows, by each row's registered ``task`` (math-verify 1/0 for math, the
    K&K table for ``kk``, the letter for multiple choice, the share of unit tests for code).

    Args:
        responses: B decoded responses; rows: B prompt rows (one per response).
    Returns:
        (rewards (B,) float32, correct (B,) bool). A malformed response scores the task's lowest reward, never raises.
    Raises:
        ValueError: lengths differ, or a row whose task is not registered (naming it).
    """
    scores = score_responses(responses, rows)
    return (torch.tensor([s.reward for s in scores], dtype=torch.float32).reshape(len(rows)),
            torch.tensor([s.correct for s in scores], dtype=torch.bool).reshape(len(rows)))


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
