"""Verifiable rewards: the registered task's checker for each prompt row (:mod:`core.tasks`), and DAPO's
overlong shaping."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from core.tasks import score_responses


def row_rewards(responses: list[str], rows: list[dict], answered: bool = False, forms: bool = False):
    """Rewards of responses to prompt rows, by each row's registered ``task`` (math-verify 1/0 for math, on the final
    answer in the form the prompt asks for; the K&K table for ``kk``, the letter for multiple choice, the share of unit
    tests for code).

    Args:
        responses: B decoded responses; rows: B prompt rows (one per response).
        answered: also return whether each response gave an answer the task could read (its extracted answer).
        forms: also return, per response, whether it gave no answer in the asked form (``format_miss``) and whether its
            answer was refused as an echo of the prompt or an expression where a value is asked (``echo``), as two
            (B,) bool tensors (:mod:`core.tasks.answer_forms`; False for tasks without an answer form).
    Returns:
        (rewards (B,) float32, correct (B,) bool), followed by answered (B,) bool when ``answered`` and by format_miss
        (B,) bool and echo (B,) bool when ``forms``. A malformed response scores the task's lowest reward, never
        raises.
    Raises:
        ValueError: lengths differ, or a row whose task is not registered (naming it).
    """
    from core.tasks.answer_forms import ECHOES, MISSING

    scores = score_responses(responses, rows)
    n = len(rows)
    out = (torch.tensor([s.reward for s in scores], dtype=torch.float32).reshape(n),
           torch.tensor([s.correct for s in scores], dtype=torch.bool).reshape(n))
    if answered:
        out += (torch.tensor([s.extracted is not None for s in scores], dtype=torch.bool).reshape(n),)
    if forms:
        out += (torch.tensor([s.status == MISSING for s in scores], dtype=torch.bool).reshape(n),
                torch.tensor([s.status in ECHOES for s in scores], dtype=torch.bool).reshape(n))
    return out


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


@dataclass(frozen=True)
class OverlongShaping:
    """``algo.overlong_buffer`` (DAPO's overlong reward shaping, Yu et al. 2025 eq. 13): a penalty growing linearly
    over the last ``length`` tokens (or ``fraction`` of ``train.max_new_tokens``) before the maximum length. Off for
    algorithms that do not set it."""

    enabled: bool = False
    fraction: float | None = 0.2
    length: int | None = None
    penalty_factor: float = 1.0

    def buffer_length(self, max_new_tokens: int) -> int:
        """The buffer B in tokens: ``length`` when set, else ``fraction`` (0.2 when null: DAPO's 4,096 of 20,480) of
        ``max_new_tokens``, rounded, at least 1.

        Raises:
            ValueError: a fraction outside (0, 1] or a length outside [1, max_new_tokens] (names the key).
        """
        length = self.length
        if length is None:
            fraction = float(OverlongShaping.fraction if self.fraction is None else self.fraction)
            if not 0 < fraction <= 1:
                raise ValueError(f"algo.overlong_buffer.fraction={fraction!r}: must be in (0, 1]")
            length = max(1, round(fraction * int(max_new_tokens)))
        if not (int(length) == length and 1 <= length <= int(max_new_tokens)):
            raise ValueError(f"algo.overlong_buffer.length={length!r}: expected an integer in [1, train.max_new_tokens="
                             f"{int(max_new_tokens)}]")
        return int(length)

    @classmethod
    def of(cls, node) -> "OverlongShaping":
        """The record of an ``algo.overlong_buffer`` node (None: off); keys it does not name are ignored."""
        from omegaconf import DictConfig, OmegaConf

        d = {} if node is None else OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def overlong_buffer_length(overlong, max_new_tokens: int) -> int:
    """DAPO's overlong buffer B in tokens for an ``algo.overlong_buffer`` config node
    (:meth:`OverlongShaping.buffer_length`, which owns the rule and its errors).

    Raises:
        ValueError: a fraction outside (0, 1] or a length outside [1, max_new_tokens] (names the key).
    """
    shaping = overlong if isinstance(overlong, OverlongShaping) else OverlongShaping.of(overlong)
    return shaping.buffer_length(max_new_tokens)


def informative_rows(correct: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic-sampling filter (Yu et al. 2025, eq. 11): rows of groups with 0 < #correct < G.

    The filter reads correctness, not the shaped reward: an all-correct group whose rewards differ only by
    the overlong penalty carries no signal about the answer and is dropped.

    Args:
        correct: (B,) bool; group_index: (B,) group id of each row.
    Returns:
        (B,) bool, True for the rows to keep.
    """
    ids, inverse = torch.unique(group_index, return_inverse=True)
    n_correct = torch.zeros(len(ids), dtype=torch.long).index_add_(0, inverse.cpu(), correct.long().cpu())
    size = torch.zeros(len(ids), dtype=torch.long).index_add_(0, inverse.cpu(), torch.ones_like(inverse.cpu()))
    keep = (n_correct > 0) & (n_correct < size)
    return keep[inverse.cpu()].to(correct.device)
