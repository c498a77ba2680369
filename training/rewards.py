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


CHECKERS = ("math", "kk")


def row_rewards(responses: list[str], rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards of responses to prompt rows, by each row's ``checker`` (default ``math``).

    ``math``: :func:`math_rewards` (1 correct / 0). ``kk``: the Knights-and-Knaves reward of the TR-GRPO
    paper (:func:`training.data.knights_knaves.kk_reward`: +1/-1 format, +2/-1.5/-2 answer).

    Args:
        responses: B decoded responses; rows: B prompt rows (one per response).
    Returns:
        (rewards (B,) float32, correct (B,) bool). A malformed response scores the lowest reward, never raises.
    Raises:
        ValueError: lengths differ, or an unknown checker (naming it).
    """
    if len(responses) != len(rows):
        raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
    rewards = torch.zeros(len(rows))
    correct = torch.zeros(len(rows), dtype=torch.bool)
    by_checker: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_checker.setdefault(r.get("checker", "math"), []).append(i)
    unknown = sorted(set(by_checker) - set(CHECKERS))
    if unknown:
        raise ValueError(f"unknown reward checker(s) {unknown}; available: {list(CHECKERS)}")
    if "math" in by_checker:
        idx = by_checker["math"]
        r_, c_ = math_rewards([responses[i] for i in idx], [rows[i]["gold"] for i in idx])
        rewards[idx], correct[idx] = r_, c_
    if "kk" in by_checker:
        from training.data.knights_knaves import kk_reward

        for i in by_checker["kk"]:
            out = kk_reward(responses[i], rows[i]["gold"])
            rewards[i], correct[i] = out["reward"], out["correct"]
    return rewards, correct


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
