"""The sampler protocol and registry: what a sampler returns, its options, how one registers, how ``auto``
resolves (:func:`resolve_sampler`)."""
from __future__ import annotations

import collections
import gc
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from ..plugins import Registry


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample: temperature (>= 0; 0 is greedy decoding, every one of the n samples the same sequence),
    top_p in (0, 1], max_new_tokens (>= 1), and whether prompts are rendered with the tokenizer's chat template."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    chat_template: bool = True


@dataclass
class Sample:
    """One sampled response, as a sampler returns it.

    Attributes:
        response: the text, special tokens removed.
        n_tokens: generated tokens, the EOS token included.
        finish_reason: ``stop`` (an EOS or stop string) or ``length`` (the token budget).
        mean_token_entropy: nats per token at the sampling temperature, or None (not taken).
        seed: the seed the sample was drawn with (None: the caller's seed for the prompt).
        tool_calls: tool calls of a multi-turn episode (None: no tools).

    Read as the dict it replaced too (``s["response"]``, ``s.get("tool_calls")``), so code written against a
    sampler that returned dicts keeps working; :meth:`of` takes either.
    """

    response: str
    n_tokens: int
    finish_reason: str
    mean_token_entropy: float | None = None
    seed: int | None = None
    tool_calls: int | None = None

    def __getitem__(self, key: str):
        if key not in self.__dataclass_fields__:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        """The field ``key``, or ``default`` when it is None or not a field."""
        value = getattr(self, key, None) if key in self.__dataclass_fields__ else None
        return default if value is None else value

    @classmethod
    def of(cls, s) -> "Sample":
        """``s`` as a :class:`Sample`: itself, or a dict a sampler written before this record returned (its keys
        beyond the fields are dropped).

        Raises:
            TypeError: a dict without ``response``, ``n_tokens`` or ``finish_reason``.
        """
        if isinstance(s, cls):
            return s
        return cls(**{k: s[k] for k in cls.__dataclass_fields__ if k in s})


class Sampler(Protocol):
    """Draws n samples per prompt.

    ``sample(prompts, n, seeds, settings)`` returns, per prompt, a list of n :class:`Sample` records (the response,
    its token count, why it ended, its mean token entropy, its seed). ``seeds`` has one seed per prompt. ``close()``
    frees the engine (GPU memory, worker processes).
    """

    name: str
    entropy_method: str | None
    preferred_batch_prompts: int
    timings: collections.Counter  # wall seconds this sampler spent by phase (``entropy_s``), read by its caller

    def sample(self, prompts: Sequence[str], n: int, seeds: Sequence[int], settings: SamplingSettings) -> list[list[Sample]]: ...

    def close(self) -> None: ...


@dataclass
class SamplerOptions:
    """Engine-independent sampler options (from ``eval.*``).

    device: ``auto`` | ``cpu`` | ``cuda[:i]`` for transformers models (the sampler's and the entropy scorer's);
    dtype: ``auto`` (bfloat16 on a GPU, float32 on the CPU) | ``float32`` | ``bfloat16`` | ``float16``;
    entropy: fill ``mean_token_entropy``; score_rows, score_tokens: batch rows and output-head chunk of the
    entropy pass; engine: extra keyword arguments of the engine (``vllm.LLM`` for ``vllm``), None values dropped.
    """

    device: str = "auto"
    dtype: str = "auto"
    entropy: bool = True
    score_rows: int = 16
    score_tokens: int = 512
    score_budget: int | None = None  # positions per entropy pass (train.micro_batch_tokens when a number)
    engine: dict = field(default_factory=dict)


ENTROPY_METHOD = "exact: teacher-forced transformers pass over the sampled tokens, full distribution at the sampling temperature"
VLLM_ENTROPY_METHOD = ("exact: full next-token distribution at the sampling temperature, from the float32 logits "
                       "vLLM sampled from (a logits processor; no second pass)")
GENERATION_ENTROPY_METHOD = ("exact: full next-token distribution at the sampling temperature, from the logits "
                             "transformers computed while sampling (no second pass)")
ENTROPY_LOGITS_BUDGET = 1 << 30  # bytes of float32 logits the hf sampler may hold to take entropies while sampling


@dataclass(frozen=True)
class SamplerSpec:
    """A registered sampler: ``build(model_path, options) -> Sampler``; ``missing() -> reason or None`` (why it
    cannot run on this machine); ``auto_rank() -> int or None`` (``auto`` takes the highest rank; None: never);
    ``rollout(model, tokenizer, model_path, options) -> Rollout`` (training rollouts from a policy held in memory,
    None when the sampler cannot) and ``rollout_cost(plan) -> seconds or None`` (its estimated sampling time for a
    training run, for ``train.rollout.sampler=auto``: :func:`choose_rollout_sampler`)."""

    name: str
    build: Callable[[str, SamplerOptions], "Sampler"]
    missing: Callable[[], str | None]
    auto_rank: Callable[[], int | None]
    rollout: Callable | None = None
    rollout_cost: Callable | None = None
    rollout_logprobs: bool = False   # its rollouts carry the sampler's own log-probs (what a mismatch correction needs)
    config: dict = field(default_factory=dict)  # the ``eval.*`` keys it reads: {dotted key: Spec}, from ``cls.CONFIG``
    tools: bool = False  # it runs multi-turn tool episodes (``sample(..., tools=...)``), from ``cls.supports_tools``


SAMPLERS: Registry = Registry("sampler", packages=("core.sampling",))  # the folder's samplers (hf.py, vllm.py)
# register on first look-up, by the folder scan that finds tasks, algorithms and engines; others from a ``plugins`` module


def register_sampler(name: str, missing: Callable[[], str | None], auto_rank: Callable[[], int | None]):
    """Class decorator: register a sampler class by name: its ``from_path(model_path, options)`` constructor, and when
    it has them its ``for_policy(model, tokenizer, model_path, options)`` rollout constructor, ``rollout_cost(plan)`` and
    ``CONFIG`` (the config keys it reads, ``{"eval.<key>": Spec}``, collected by the schema) and ``supports_tools``
    (True: its ``sample`` runs multi-turn tool episodes)."""
    def deco(cls):
        SAMPLERS.register(name, SamplerSpec(name, cls.from_path, missing, auto_rank, getattr(cls, "for_policy", None),
                                            getattr(cls, "rollout_cost", None), bool(getattr(cls, "rollout_logprobs", False)),
                                            dict(getattr(cls, "CONFIG", {}) or {}),
                                            bool(getattr(cls, "supports_tools", False))), replace=True)
        return cls
    return deco


def resolve_sampler(name: str) -> str:
    """The registered sampler ``name`` stands for on this machine (``auto`` chooses; see the module docstring).

    Raises:
        ValueError: an unknown name, or a sampler that cannot run here (the message says why and how to fix it).
    """
    if name == "auto":
        ranked = [(spec.auto_rank(), spec.name) for spec in SAMPLERS.values() if spec.missing() is None]
        ranked = [(r, n) for r, n in ranked if r is not None]
        return max(ranked)[1]
    if name not in SAMPLERS:
        raise ValueError(f"eval.sampler={name!r}: available samplers: {['auto', *SAMPLERS]}")
    reason = SAMPLERS[name].missing()
    if reason:
        raise ValueError(f"eval.sampler={name!r}: {reason}")
    return name


def tool_samplers() -> list[str]:
    """Names of the registered samplers that run multi-turn tool episodes (``supports_tools``), sorted."""
    return sorted(n for n, spec in SAMPLERS.items() if spec.tools)


def build_sampler(name: str, model_path, options: SamplerOptions | None = None) -> "Sampler":
    """A ready sampler ``name`` (``auto`` resolved) on the model at ``model_path`` (folder or hub id)."""
    return SAMPLERS[resolve_sampler(name)].build(str(model_path), options or SamplerOptions())


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
