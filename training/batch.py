"""The rollout batch: plain tensors passed from rollout to advantage estimator to policy loss."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

import torch


@dataclass
class RolloutBatch:
    """B responses to a set of prompts, G responses per prompt (one *group* per prompt).

    Attributes:
        prompt_ids: (B, P) left-padded prompt token ids.
        prompt_mask: (B, P) 1 on real prompt tokens.
        response_ids: (B, L) right-padded response token ids.
        response_mask: (B, L) 1 on generated tokens (including the EOS token when emitted).
        old_logprobs: (B, L) log pi_old(y_t) of the sampled tokens under the rollout policy.
        rewards: (B,) scalar verifiable rewards.
        group_index: (B,) long, which prompt (group) each response belongs to.
        response_lengths: (B,) long, number of generated tokens.
        ref_logprobs: optional (B, L) log pi_ref(y_t) (only when a KL term is used).
        correct: optional (B,) bool, verifier outcome (rewards may be shaped).
        extras: free-form per-response tensors for estimators that need them.
        policy_version: optional (B,) long, the version of the policy that generated each response (the number of
            training steps behind its weights; ``train.rollout.staleness``).
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
    extras: dict = field(default_factory=dict)
    policy_version: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return int(self.response_ids.shape[0])

    def to(self, device) -> "RolloutBatch":
        """The same batch with every tensor on ``device``."""

        def mv(t):
            return None if t is None else t.to(device)

        return replace(
            self, **{f: mv(getattr(self, f)) for f in (
                "prompt_ids", "prompt_mask", "response_ids", "response_mask", "old_logprobs", "rewards",
                "group_index", "response_lengths", "ref_logprobs", "correct", "policy_version")},
            extras={k: v.to(device) for k, v in self.extras.items()},
        )

    def state_dict(self) -> dict:
        """Its tensors by field name (None where absent), for a saved training state (tensors only)."""
        from dataclasses import fields

        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_state_dict(cls, d: dict) -> "RolloutBatch":
        """The batch :meth:`state_dict` gave."""
        return cls(**{k: (dict(v) if k == "extras" else v) for k, v in d.items()})

    def select(self, index: torch.Tensor) -> "RolloutBatch":
        """The sub-batch of rows ``index`` (a minibatch), every per-response tensor sliced alike."""

        def take(t):
            return None if t is None else t[index]

        return replace(
            self,
            prompt_ids=self.prompt_ids[index],
            prompt_mask=self.prompt_mask[index],
            response_ids=self.response_ids[index],
            response_mask=self.response_mask[index],
            old_logprobs=self.old_logprobs[index],
            rewards=self.rewards[index],
            group_index=self.group_index[index],
            response_lengths=self.response_lengths[index],
            ref_logprobs=take(self.ref_logprobs),
            correct=take(self.correct),
            extras={k: v[index] for k, v in self.extras.items()},
            policy_version=take(self.policy_version),
        )


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
    are renumbered so that groups of different batches stay distinct.
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

    def cat(name, pad_fn, length, value=0):
        parts = [getattr(b, name) for b in batches]
        if any(p is None for p in parts):
            return None
        return torch.cat([pad_fn(p, length, value) for p in parts], dim=0)

    extras = {}
    for key in batches[0].extras:
        extras[key] = torch.cat([_pad_right(b.extras[key], L) for b in batches], dim=0)
    return RolloutBatch(
        prompt_ids=cat("prompt_ids", _pad_left, P, pad_token_id), prompt_mask=cat("prompt_mask", _pad_left, P),
        response_ids=cat("response_ids", _pad_right, L, pad_token_id), response_mask=cat("response_mask", _pad_right, L),
        old_logprobs=cat("old_logprobs", _pad_right, L), rewards=torch.cat([b.rewards for b in batches]),
        group_index=torch.cat(groups), response_lengths=torch.cat([b.response_lengths for b in batches]),
        ref_logprobs=cat("ref_logprobs", _pad_right, L), correct=cat("correct", _pad_right, L), extras=extras,
        policy_version=cat("policy_version", _pad_right, L),
    )


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
