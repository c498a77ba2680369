"""Rollouts: sample G responses per prompt and score their tokens under a policy."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from core.sampling import prompt_texts
from core.scoring import Scorer, autocast, compute_logprobs  # noqa: F401  (re-exported for training code)

from .batch import RolloutBatch, ToolTrace
from .rewards import row_rewards


@dataclass(frozen=True)
class RolloutRequest:
    """What one round of rollouts asks for: ``group_size`` responses per prompt, sampled at ``temperature`` and
    ``top_p`` for at most ``max_new_tokens`` tokens with ``seed``.

    Attributes:
        chat_template: prompts go through the tokenizer's chat template.
        bf16: score (old and reference log-probs) under bfloat16 autocast.
        old_logprobs: score the samples under the rollout policy here (old log-probs and entropies); False
            leaves both NaN for :func:`training.update.update_policy` to fill minibatch by minibatch
            (the DEFERRED path, :class:`training.settings.OldLogprobs`), the first minibatch from its own forward pass.
        tools: ``{name: core.tools.Tool}``: multi-turn episodes with tool calls (:func:`core.agent.run_episodes`;
            ``tools_cfg.max_turns``, ``tools_cfg.max_obs_tokens``); the response mask then marks the policy's tokens
            only, so every loss, KL and entropy skips the tool's.
    """

    group_size: int
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    chat_template: bool = True
    bf16: bool = False
    old_logprobs: bool = True
    tools: dict | None = None
    tools_cfg: object = None


@torch.no_grad()
def collect_rollouts(model, tokenizer, rows: list[dict], request: RolloutRequest, ref_model=None,
                     timings: dict | None = None, rollout=None, scorer=None):
    """Sample a group of ``request.group_size`` responses for each prompt row and score them.

    Args:
        rows: prompt rows ``{"id", "prompt", "gold", "task"}`` (scored by their registered task, see
            :func:`training.rewards.row_rewards`).
        request: what to sample and how to score it (:class:`RolloutRequest`).
        ref_model: the reference policy whose log-probs the KL term uses (None: no reference pass).
        timings: when given, wall seconds are added to its ``generate_s``, ``reward_s`` and ``logprob_s``
            (old and reference log-probs) keys.
        rollout: the rollout sampler (:func:`core.sampling.build_rollout`: ``hf`` on ``model`` itself, or ``vllm``
            holding the policy's weights); None: transformers on ``model``.
        scorer: the run's :class:`core.scoring.Scorer` for the old and reference passes (token budget, layout);
            None: one padded pass over the batch.
    Returns:
        (RolloutBatch, texts): the batch has ``entropy`` (B, L), the rollout policy's next-token entropy,
        ``finished``, ``format_miss``, ``echo`` (B,), with tools its :class:`training.batch.ToolTrace`, and when the
        sampler returns its own log-probs (vLLM) ``rollout_logprobs`` (B, L), for the mismatch metrics and correction
        (:mod:`training.mismatch`).
    """
    q, t = request, {} if timings is None else timings
    group_size, temperature, bf16 = q.group_size, q.temperature, q.bf16
    t0 = time.perf_counter()
    texts = prompt_texts(tokenizer, [r["prompt"] for r in rows], q.chat_template)
    texts = [t + r.get("response_prefix", "") for t, r in zip(texts, rows)]  # a task's prefill (prompt side)
    if rollout is None:
        from core.sampling import HFRollout

        rollout = HFRollout(model, tokenizer)
    if q.tools:
        from core.agent import ToolUse
        from core.sampling import SamplingSettings

        tc = q.tools_cfg if q.tools_cfg is not None else {}
        use = ToolUse(q.tools, **{k: int(tc[k]) for k in ("max_turns", "max_obs_tokens") if k in tc})
        gen = rollout.generate_with_tools(texts, group_size, SamplingSettings(temperature, q.top_p, q.max_new_tokens),
                                          q.seed, use)
    else:
        gen = rollout.generate(texts, group_size, temperature, q.top_p, q.max_new_tokens, q.seed)
    device = next(model.parameters()).device
    if gen.response_ids.device != device:
        gen = _to(gen, device)
    t1 = time.perf_counter()
    rewards, correct, answered, format_miss, echo = row_rewards(gen.texts, [r for r in rows for _ in range(group_size)],
                                                                answered=True, forms=True)
    t2 = time.perf_counter()
    scorer = scorer or Scorer()
    if q.old_logprobs:
        old, entropy = scorer.score(model, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask,
                                    temperature, with_entropy=True, bf16=bf16)
    else:
        old = torch.full(gen.response_ids.shape, float("nan"), device=gen.response_ids.device)
        entropy = old.clone()
    ref_logprobs = None
    if ref_model is not None:  # a frozen copy, or the policy itself with its LoRA adapters disabled
        from core.lora import reference

        with reference(ref_model):
            ref_logprobs, _ = scorer.score(ref_model, gen.prompt_ids, gen.prompt_mask, gen.response_ids,
                                           gen.response_mask, temperature, bf16=bf16)
    t3 = time.perf_counter()
    for k, v in (("generate_s", t1 - t0), ("reward_s", t2 - t1), ("logprob_s", t3 - t2)):
        t[k] = t.get(k, 0.0) + v
    batch = RolloutBatch(
        prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
        response_mask=gen.response_mask, old_logprobs=old, rewards=rewards,
        group_index=torch.arange(len(rows)).repeat_interleave(group_size), response_lengths=gen.response_lengths,
        ref_logprobs=ref_logprobs, correct=correct, entropy=entropy, finished=gen.finished,
        format_miss=format_miss.to(device), echo=echo.to(device), rollout_logprobs=gen.logprobs,
        tools=None if gen.tool_calls is None else ToolTrace(gen.tool_calls, gen.tool_tokens, answered))
    return batch, gen.texts


def _to(gen, device):
    """A :class:`core.sampling.Generation` with its tensors on ``device``."""
    import dataclasses

    return dataclasses.replace(gen, **{f.name: getattr(gen, f.name).to(device) for f in dataclasses.fields(gen)
                                       if isinstance(getattr(gen, f.name), torch.Tensor)})
