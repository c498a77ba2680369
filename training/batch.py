"""The rollout batch: plain tensors passed from rollout to advantage estimator to policy loss."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch


@dataclass
class ToolTrace:
    """What tool calls did in each response of a multi-turn rollout (``Task.tools``: search QA).

    Attributes:
        calls: (B,) long, tool calls per response.
        tokens: (B,) long, the tool's tokens inside the response (observations; masked out of every loss).
        answered: (B,) bool, whether the response ended with an answer.
    """

    calls: torch.Tensor
    tokens: torch.Tensor
    answered: torch.Tensor

    def select(self, index) -> "ToolTrace":
        return ToolTrace(self.calls[index], self.tokens[index], self.answered[index])

    def to(self, device) -> "ToolTrace":
        return ToolTrace(self.calls.to(device), self.tokens.to(device), self.answered.to(device))


#: the optional per-response tensors of a :class:`RolloutBatch`, each (B,) or (B, L)
OPTIONAL = ("ref_logprobs", "correct", "policy_version", "entropy", "finished", "format_miss", "echo",
            "rollout_logprobs", "behaviour_logprobs")
#: every per-response tensor, in field order
TENSORS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "old_logprobs", "rewards", "group_index",
           "response_lengths", *OPTIONAL)


@dataclass
class RolloutBatch:
    """B responses to a set of prompts, G responses per prompt (one *group* per prompt): the update's whole data
    contract, every field named (no free-form dict).

    Attributes:
        prompt_ids: (B, P) left-padded prompt token ids.
        prompt_mask: (B, P) 1 on real prompt tokens.
        response_ids: (B, L) right-padded response token ids.
        response_mask: (B, L) 1 on generated tokens (including the EOS token when emitted).
        old_logprobs: (B, L) log pi_old(y_t) of the sampled tokens: the ratio's denominator (NaN until the update fills
            them on the deferred path, :class:`training.settings.OldLogprobs`).
        rewards: (B,) scalar verifiable rewards.
        group_index: (B,) long, which prompt (group) each response belongs to.
        response_lengths: (B,) long, number of generated tokens.
        ref_logprobs: optional (B, L) log pi_ref(y_t) (only when a KL term is used).
        correct: optional (B,) bool, verifier outcome (rewards may be shaped).
        policy_version: optional (B,) long, the version of the policy that generated each response (the number of
            training steps behind its weights; ``train.rollout.staleness``).
        entropy: optional (B, L), the rollout policy's next-token entropy (filled with the old log-probs).
        finished: optional (B,) bool, the response ended with EOS (with tools: EOS or an answer).
        format_miss: optional (B,) bool, no answer in the form the task asks for.
        echo: optional (B,) bool, the answer was refused as a restatement of the prompt.
        rollout_logprobs: optional (B, L), the sampler's own log-probs (vLLM): the training-inference mismatch and
            its correction (:mod:`training.mismatch`, :mod:`training.corrections`).
        behaviour_logprobs: optional (B, L), b: the generating policy's log-probs, kept for an off-policy step (the
            sampler's own, or the trainer's pass on the generating weights).
        tools: optional :class:`ToolTrace` of a multi-turn rollout.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_index: torch.Tensor
    response_lengths: torch.Tensor
    ref_logprobs: Optional[torch.Tensor] = None
    correct: Optional[torch.Tensor] = None
    policy_version: Optional[torch.Tensor] = None
    entropy: Optional[torch.Tensor] = None
    finished: Optional[torch.Tensor] = None
    format_miss: Optional[torch.Tensor] = None
    echo: Optional[torch.Tensor] = None
    rollout_logprobs: Optional[torch.Tensor] = None
    behaviour_logprobs: Optional[torch.Tensor] = None
    tools: Optional[ToolTrace] = None

    @property
    def batch_size(self) -> int:
        return int(self.response_ids.shape[0])

    def to(self, device) -> "RolloutBatch":
        """The same batch with every tensor on ``device``."""
        return replace(self, **{f: None if getattr(self, f) is None else getattr(self, f).to(device) for f in TENSORS},
                       tools=None if self.tools is None else self.tools.to(device))

    def state_dict(self) -> dict:
        """Its tensors by field name (None where absent; the tool trace as a dict), for a saved training state
        (tensors only)."""
        out = {f: getattr(self, f) for f in TENSORS}
        out["tools"] = None if self.tools is None else {"calls": self.tools.calls, "tokens": self.tools.tokens,
                                                         "answered": self.tools.answered}
        return out

    @classmethod
    def from_state_dict(cls, d: dict) -> "RolloutBatch":
        """The batch :meth:`state_dict` gave (a state saved before the fields were typed keeps its per-response
        tensors in ``extras``: read into their fields)."""
        d = dict(d)
        extras = dict(d.pop("extras", None) or {})
        tools = d.pop("tools", None)
        if "tool_calls" in extras:
            tools = {"calls": extras.pop("tool_calls"), "tokens": extras.pop("tool_tokens"),
                     "answered": extras.pop("answered")}
        d.update({k: v for k, v in extras.items() if k in OPTIONAL})
        return cls(**{k: v for k, v in d.items() if k in TENSORS}, tools=None if tools is None else ToolTrace(**tools))

    def select(self, index: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of rows ``index`` (a minibatch), every per-response tensor sliced alike."""
        return replace(self, **{f: None if getattr(self, f) is None else getattr(self, f)[index] for f in TENSORS},
                       tools=None if self.tools is None else self.tools.select(index))


def to_groups(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Arrange per-response values as a (num_groups, G) matrix.

    Args:
        values: (B,) per-response values.
        group_index: (B,) group id of each response; every group must have the same size G.
    Returns:
        (matrix (num_groups, G), order (B,)) where ``matrix.flatten() == values[order]``;
        use :func:`from_groups` to scatter a matrix back to response order.
    Raises:
        ValueError: if the groups have different sizes.
    """
    order = torch.argsort(group_index, stable=True)
    _, counts = torch.unique(group_index, return_counts=True)
    if counts.numel() == 0:
        return values.new_zeros((0, 0)), order
    if not bool((counts == counts[0]).all()):
        raise ValueError(f"groups must have equal sizes, got sizes {counts.tolist()}")
    return values[order].reshape(counts.numel(), int(counts[0])), order


def from_groups(matrix: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_groups`: (num_groups, G) matrix -> (B,) values in response order."""
    out = torch.empty(order.numel(), dtype=matrix.dtype, device=matrix.device)
    out[order] = matrix.reshape(-1)
    return out


def _pad_right(t: torch.Tensor, length: int, value=0) -> torch.Tensor:
    if t.dim() < 2 or t.shape[1] == length:
        return t
    pad = t.new_full((t.shape[0], length - t.shape[1]) + tuple(t.shape[2:]), value)
    return torch.cat([t, pad], dim=1)


def _pad_left(t: torch.Tensor, length: int, value=0) -> torch.Tensor:
    if t.shape[1] == length:
        return t
    pad = t.new_full((t.shape[0], length - t.shape[1]), value)
    return torch.cat([pad, t], dim=1)


def concat_batches(batches: list[RolloutBatch], pad_token_id: int = 0) -> RolloutBatch:
    """Concatenate rollout batches (e.g. DAPO's refill rounds) into one.

    Prompts are re-padded on the left and responses on the right to the longest; group indices
    are renumbered so that groups of different batches stay distinct; an optional field is kept when every batch has
    it.
    """
    if len(batches) == 1:
        return batches[0]
    P = max(b.prompt_ids.shape[1] for b in batches)
    L = max(b.response_ids.shape[1] for b in batches)
    offset, groups = 0, []
    for b in batches:
        _, inverse = torch.unique(b.group_index, return_inverse=True)
        groups.append(inverse + offset)
        offset += int(inverse.max()) + 1 if inverse.numel() else 0

    def cat(name, pad_fn=_pad_right, length=L, value=0):
        parts = [getattr(b, name) for b in batches]
        if any(p is None for p in parts):
            return None
        return torch.cat([pad_fn(p, length, value) for p in parts], dim=0)

    traces = [b.tools for b in batches]
    tools = None if any(t is None for t in traces) else ToolTrace(
        torch.cat([t.calls for t in traces]), torch.cat([t.tokens for t in traces]),
        torch.cat([t.answered for t in traces]))
    return RolloutBatch(
        prompt_ids=cat("prompt_ids", _pad_left, P, pad_token_id), prompt_mask=cat("prompt_mask", _pad_left, P),
        response_ids=cat("response_ids", value=pad_token_id), response_mask=cat("response_mask"),
        old_logprobs=cat("old_logprobs"), rewards=torch.cat([b.rewards for b in batches]),
        group_index=torch.cat(groups), response_lengths=torch.cat([b.response_lengths for b in batches]),
        **{f: cat(f) for f in OPTIONAL}, tools=tools)


@dataclass
class StepRollout:
    """One step's samples: ``batch`` (what the update trains on), ``sampled`` (every generation round's batch),
    ``advantages`` (B,) or (B, L) and the estimator's metrics, ``rounds`` of dynamic sampling, ``phases`` (generate,
    reward, logprob seconds) and the whole rollout's ``seconds``; ``version``, the policy version that generated it
    (every round: DAPO's refills too) and ``generated``, metrics taken when it was generated (the engine-vs-trainer
    mismatch, on the same weights), for a rollout consumed later (``train.rollout.staleness``)."""

    batch: object
    sampled: list
    advantages: torch.Tensor
    adv_metrics: dict
    rounds: int
    phases: dict
    seconds: float
    version: int = 0
    generated: dict = field(default_factory=dict)
