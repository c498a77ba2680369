"""The ``hf`` sampler: transformers ``generate`` on the model's device."""
from __future__ import annotations

import collections
import time
from typing import Sequence

import torch

from ..generation import Generation
from .generate import entropy_temperature, generate_responses, prompt_texts
from .interface import (
    ENTROPY_LOGITS_BUDGET,
    ENTROPY_METHOD,
    GENERATION_ENTROPY_METHOD,
    Sample,
    SamplerOptions,
    SamplingSettings,
    _free_memory,
    register_sampler,
)
from .rollout import HFRollout, RolloutOptions, RolloutPlan, _speed


@register_sampler("hf", missing=lambda: None, auto_rank=lambda: 0)
class HFSampler:
    """transformers sampler on the model's device (CPU or one GPU).

    The n samples of all prompts of one call come from one ``generate`` call seeded with ``seeds[0]`` (one
    RNG stream for the batch: batched generation cannot take a seed per prompt), so the same batches with
    the same seeds give the same samples.
    """

    name = "hf"
    preferred_batch_prompts = 4
    supports_tools = True  # sample(..., tools=...) runs multi-turn episodes (core.agent)

    def __init__(self, model, tokenizer, with_entropy: bool = True, score_rows: int = 16, score_tokens: int = 512,
                 score_budget: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.with_entropy, self.score_rows, self.score_tokens = with_entropy, score_rows, score_tokens
        self.score_budget = score_budget
        self.entropy_method = ENTROPY_METHOD if with_entropy else None
        self.timings: collections.Counter = collections.Counter()  # entropy_s: the entropies' own wall seconds

    @classmethod
    def from_path(cls, model_path: str, options: SamplerOptions) -> "HFSampler":
        from ..models import load_checkpoint, resolve_device, resolve_dtype

        device = resolve_device(options.device)
        model, tok = load_checkpoint(model_path, device, resolve_dtype(options.dtype, device))
        return cls(model, tok, options.entropy, options.score_rows, options.score_tokens, options.score_budget)

    @torch.no_grad()
    def _entropies(self, gen: Generation, temperature: float) -> list[float]:
        """Mean exact entropy of each sample, teacher-forced: ``score_rows`` rows per pass, or with ``score_budget``
        (``train.micro_batch_tokens``) passes of at most that many positions (:class:`core.scoring.Scorer`)."""
        from ..scoring import Scorer, token_entropies

        if self.score_budget is not None:
            _, ent = Scorer(self.score_budget, "padded", head_tokens=self.score_tokens).score(
                self.model, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask, temperature,
                with_entropy=True)
            m = gen.response_mask.to(ent.dtype)
            return ((ent * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
        out = []
        for a in range(0, gen.response_ids.shape[0], self.score_rows):
            sl = slice(a, a + self.score_rows)
            ent = token_entropies(self.model, gen.prompt_ids[sl], gen.prompt_mask[sl], gen.response_ids[sl],
                                  gen.response_mask[sl], temperature, self.score_tokens)
            m = gen.response_mask[sl].to(ent.dtype)
            out += ((ent * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
        return out

    def _while_sampling(self, rows: int, max_new_tokens: int) -> bool:
        """Whether a call's logits (rows x max_new_tokens x vocabulary, float32) fit :data:`ENTROPY_LOGITS_BUDGET`."""
        vocab = int(getattr(self.model.config, "vocab_size", 0) or 0) or 1 << 20
        return rows * max_new_tokens * vocab * 4 <= ENTROPY_LOGITS_BUDGET

    def sample(self, prompts: Sequence[str], n: int, seeds: Sequence[int], settings: SamplingSettings,
               tools: dict | None = None, max_turns: int = 4, max_obs_tokens: int = 256,
               prefixes: Sequence[str] | None = None) -> list[list[dict]]:
        """n samples per prompt (see :class:`Sampler`); with ``tools`` ({name: core.tools.Tool}) multi-turn episodes
        (:func:`core.agent.generate_with_tools`), each sample also carrying ``tool_calls``, its entropy taken over
        the policy's tokens only (teacher-forced). ``prefixes``: text put after each rendered prompt, where the
        response starts (a task's ``response_prefix``; part of the prompt, not of the response)."""
        texts = prompt_texts(self.tokenizer, prompts, settings.chat_template)
        if prefixes:
            texts = [t + (p or "") for t, p in zip(texts, prefixes)]
        seed = int(seeds[0])
        during = not tools and self.with_entropy and self._while_sampling(len(prompts) * n, settings.max_new_tokens)
        if tools:
            from ..agent import ToolUse, generate_with_tools

            gen = generate_with_tools(self.model, self.tokenizer, texts, n, settings, seed,
                                      ToolUse(tools, max_turns, max_obs_tokens))
        else:
            gen = generate_responses(self.model, self.tokenizer, texts, n, settings, seed, with_entropy=during)
        t0 = time.perf_counter()
        if during:  # taken while sampling: the mean over each response's tokens
            m = gen.response_mask.to(gen.entropy.dtype)
            entropies = ((gen.entropy * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
            self.entropy_method = GENERATION_ENTROPY_METHOD
        elif self.with_entropy:
            entropies = self._entropies(gen, entropy_temperature(settings.temperature))
            self.entropy_method = ENTROPY_METHOD
        else:
            entropies = [None] * len(gen.texts)
        self.timings["entropy_s"] += time.perf_counter() - t0
        out = []
        for i in range(len(prompts)):
            out.append([Sample(gen.texts[j], int(gen.response_lengths[j]), "stop" if bool(gen.finished[j]) else "length",
                               entropies[j], seed, int(gen.tool_calls[j]) if gen.tool_calls is not None else None)
                        for j in range(i * n, (i + 1) * n)])
        return out

    def close(self) -> None:
        self.model = None
        _free_memory()

    @classmethod
    def for_policy(cls, model, tokenizer, model_path=None, options: "RolloutOptions | None" = None) -> "HFRollout":
        """Training rollouts with transformers ``generate`` on the policy itself (nothing to copy or sync)."""
        return HFRollout(model, tokenizer, (options or RolloutOptions()).token_budget)

    @staticmethod
    def rollout_cost(plan: "RolloutPlan") -> float:
        """Estimated seconds of sampling for a training run (:data:`ROLLOUT_SPEED`)."""
        return plan.tokens / _speed("hf", plan)
