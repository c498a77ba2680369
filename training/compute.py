"""The training compute a step spends, as an estimate in floating-point operations (``train/flops``; the validation
along training logs the running sum before each validated policy as ``val/compute_flops``, docs/curves.md).

The count (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1: a forward pass costs about
2 N FLOPs per token and a backward pass about 4 N, N the parameters; the ScaleRL study, Khatri et al. 2025, plots
its curves against GPU-hours, which this estimate stands in for where hardware differs between runs):

- **generation**: 2 N per token of every sampled row, prompt and response (prefill and decoding; every dynamic-
  sampling round's rows, kept or dropped);
- **scoring passes outside the update**: 2 N per token of the trained rows for each of: the old log-probs' pass
  (unless the update computes them itself), the reference policy's pass (a KL term), the proximal pass of a stale
  rollout (``train.rollout.old_policy=recompute`` with an estimator that reads old log-probs);
- **the update**: per epoch (``train.ppo_epochs``), per token of the trained rows, 2 N forward, 4 N backward (2 N
  with LoRA: the frozen weights take no weight gradient, the activations' gradients still flow through them) and
  2 N more with gradient checkpointing (the forward recomputed).

Tokens are real tokens (padding and packing excluded), so engines and layouts that waste positions count the same
compute; N counts every parameter of the policy (embeddings and LoRA adapters included). The verl engine applies the
same count to verl's token counts (:meth:`ComputeModel.flops_of_tokens` on ``perf/total_num_tokens``:
:mod:`training.engines.verl.verl_validation`), so both engines' curves use one FLOP definition.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ComputeModel:
    """What the count needs of a run: ``n_params`` (N), ``lora`` (only adapters train), ``checkpointing``
    (gradient checkpointing), ``epochs`` (``train.ppo_epochs``)."""

    n_params: int
    lora: bool
    checkpointing: bool
    epochs: int

    def step_flops(self, sampled, trained, extra_passes: int) -> float:
        """A step's estimated FLOPs.

        Args:
            sampled: the generated batches (every round), each with ``prompt_mask`` (B, P) and ``response_mask``
                (B, L).
            trained: the batch the update trains on (same fields).
            extra_passes: scoring passes over ``trained`` outside the update (old, reference, proximal).
        Returns:
            float FLOPs (not FLOP/s): 2 N tokens(sampled) + (2 N extra_passes + epochs (2 N + backward
            [+ 2 N recompute])) tokens(trained).
        """
        return self.flops_of_tokens(sum(tokens(b) for b in sampled), tokens(trained), extra_passes)

    def flops_of_tokens(self, sampled_tokens: int, trained_tokens: int, extra_passes: int) -> float:
        """:meth:`step_flops` from token counts (real tokens, prompt and response: every sampled row's, the trained
        rows'), for an engine that reports counts rather than batches (verl's ``perf/total_num_tokens``)."""
        n = float(self.n_params)
        backward = 2.0 * n if self.lora else 4.0 * n
        per_update_token = self.epochs * (2.0 * n + backward + (2.0 * n if self.checkpointing else 0.0))
        return 2.0 * n * float(sampled_tokens) + (2.0 * n * extra_passes + per_update_token) * float(trained_tokens)


def tokens(batch) -> int:
    """Real tokens of a batch: prompt tokens plus generated tokens over its rows (0 for an empty batch)."""
    if batch is None or not batch.batch_size:
        return 0
    return int(torch.as_tensor(batch.prompt_mask).sum()) + int(torch.as_tensor(batch.response_mask).sum())
