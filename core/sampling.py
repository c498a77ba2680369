"""Sampling responses from a policy: samplers registered by name behind one protocol.

- ``generate_responses`` is the low-level transformers call that training rollouts use too.
- :class:`HFSampler` (``hf``): transformers ``generate`` on the model's device (a GPU when present).
- :class:`VLLMSampler` (``vllm``): vLLM's offline engine on a checkpoint folder (GPU, or vLLM's CPU
  build on a CPU machine).
- ``auto`` (:func:`resolve_sampler`): the available sampler with the highest ``auto_rank`` on this
  machine: vLLM when it is installed and a CUDA device is visible, else transformers.

Every sampler fills ``mean_token_entropy`` with the exact entropy of the full next-token distribution at the
sampling temperature, when asked. The transformers sampler takes it from the logits ``generate`` computed while
sampling, when a call's logits fit :data:`ENTROPY_LOGITS_BUDGET` (else, and for vLLM, which returns only top-k
log-probs, from a teacher-forced pass of the sampled tokens through the transformers model,
:func:`core.scoring.mean_token_entropies`, output head in chunks). The two agree to float rounding (tested); the
run's ``rlvr.entropy_method`` tag says which was used.
"""
from __future__ import annotations

import collections
import gc
import importlib.util
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from .config_keys import MAP, B, F, I, S
from .generation import Generation, response_mask_from_ids  # noqa: F401  (the samplers' return type, re-exported)
from .registry import Registry



def prompt_texts(tokenizer, prompts: Sequence[str], chat_template: bool = True, system_prompt: str | None = None) -> list[str]:
    """Render user prompts as model input text (the tokenizer's chat template when asked)."""
    if not chat_template or getattr(tokenizer, "chat_template", None) is None:
        return list(prompts)
    out = []
    for p in prompts:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": p}]
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out



def _shared_prefill(model, input_ids, attention_mask, n: int):
    """A key/value cache of every prompt but its last token, computed once per prompt and repeated ``n`` times
    (prompt-major, as ``num_return_sequences`` orders rows), for ``generate`` to continue from; None when it does
    not apply (n = 1, a one-token prompt, a cache other than a plain dynamic key/value cache).

    ``generate`` would otherwise run the prefill of each prompt n times. The samples are the same draws (the
    prefill consumes no random numbers); the logits agree with the unshared prefill up to float rounding.
    Left padding keeps a real token in the last column, which ``generate`` then feeds itself; position ids
    follow the padding as ``generate`` computes them.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if n < 2 or input_ids.shape[1] < 2:
        return None
    pos = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    trunk = getattr(model, "base_model", None)
    trunk = model if trunk is None else trunk  # the decoder without the output head, when the model has one
    cache = trunk(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], position_ids=pos[:, :-1],
                  use_cache=True).past_key_values
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    cache.batch_repeat_interleave(n)
    return cache


@torch.no_grad()
def generate_responses(model, tokenizer, texts: Sequence[str], n: int, temperature: float = 1.0, top_p: float = 1.0,
                       max_new_tokens: int = 64, seed: int | None = None, with_entropy: bool = False) -> Generation:
    """Sample ``n`` responses to each input text with transformers ``generate``.

    The n samples of a prompt are drawn in one call from one RNG stream, so they differ; with a
    ``seed`` the whole call is reproducible.

    Args:
        texts: already-rendered model inputs (see :func:`prompt_texts`).
        n: samples per prompt (>= 1); temperature >= 0 (0: greedy decoding, one sequence per prompt repeated n
            times; top_p is then unused); 0 < top_p <= 1; max_new_tokens >= 1.
        with_entropy: also fill ``Generation.entropy`` from the logits ``generate`` computes while sampling (its
            unprocessed logits, divided by the temperature: the full next-token distribution, before top-p), so
            no second pass over the samples is needed. The logits of the whole call are held until it ends
            (rows x max_new_tokens x vocabulary x 4 bytes; see :data:`ENTROPY_LOGITS_BUDGET`).
    Returns:
        :class:`Generation`, prompt-major: rows i*n .. i*n+n-1 belong to texts[i].
    Raises:
        ValueError: on out-of-range sampling parameters.
    """
    if n < 1 or temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"bad sampling parameters: n={n}, temperature={temperature}, top_p={top_p}, max_new_tokens={max_new_tokens}")
    greedy = float(temperature) == 0.0
    device = next(model.parameters()).device
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    if seed is not None:
        torch.manual_seed(int(seed))
    was_training = model.training
    model.eval()
    inputs = dict(enc)
    cache = None if greedy else _shared_prefill(model, enc["input_ids"], enc["attention_mask"], int(n))
    if cache is not None:  # each prompt's prefill once, its cache repeated for the n samples
        inputs = {"input_ids": enc["input_ids"].repeat_interleave(n, 0),
                  "attention_mask": enc["attention_mask"].repeat_interleave(n, 0), "past_key_values": cache}
    decoding = (dict(do_sample=False, temperature=None, top_p=None, top_k=None) if greedy else
                dict(do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=0))
    out = model.generate(
        **inputs, **decoding, max_new_tokens=int(max_new_tokens),
        num_return_sequences=1 if cache is not None or greedy else int(n),
        pad_token_id=tokenizer.pad_token_id, output_logits=with_entropy, return_dict_in_generate=with_entropy,
    )
    model.train(was_training)
    entropy = None
    if with_entropy:
        entropy = torch.stack([_entropy(step, temperature) for step in out.logits], dim=1)  # (B, L)
        out = out.sequences
    if greedy and n > 1:  # the one greedy sequence of each prompt stands for its n samples
        out = out.repeat_interleave(n, 0)
        entropy = None if entropy is None else entropy.repeat_interleave(n, 0)
    p_len = enc["input_ids"].shape[1]
    response_ids = out[:, p_len:]
    if response_ids.shape[1] == 0:
        response_ids = torch.full((out.shape[0], 1), tokenizer.pad_token_id, dtype=out.dtype, device=out.device)
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    mask, finished = response_mask_from_ids(response_ids, eos_ids)
    texts_out = tokenizer.batch_decode(response_ids.masked_fill(mask == 0, tokenizer.pad_token_id), skip_special_tokens=True)
    return Generation(
        prompt_ids=enc["input_ids"].repeat_interleave(n, 0),
        prompt_mask=enc["attention_mask"].repeat_interleave(n, 0),
        response_ids=response_ids, response_mask=mask, response_lengths=mask.sum(-1), finished=finished, texts=texts_out,
        entropy=None if entropy is None else entropy[:, :response_ids.shape[1]],
    )


def entropy_temperature(temperature: float) -> float:
    """The temperature entropies are taken at: the sampling temperature, or 1 (the model's own distribution) for
    greedy decoding, whose sampling distribution is a point mass."""
    return float(temperature) if float(temperature) > 0 else 1.0


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B,) entropy (nats) of softmax(logits / T) for (B, V) logits, in float32 (T = 0: at T = 1)."""
    logp = torch.log_softmax(logits.float() / entropy_temperature(temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample: temperature (>= 0; 0 is greedy decoding, every one of the n samples the same sequence),
    top_p in (0, 1], max_new_tokens (>= 1), and whether prompts are rendered with the tokenizer's chat template."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    chat_template: bool = True


class Sampler(Protocol):
    """Draws n samples per prompt.

    ``sample(prompts, n, seeds, settings)`` returns, per prompt, a list of n dicts with keys ``response``
    (text, special tokens removed), ``n_tokens`` (generated tokens, the EOS token included),
    ``finish_reason`` ('stop': an EOS or stop string; 'length': the token budget), ``mean_token_entropy``
    (nats, or None) and ``seed`` (the seed those samples were drawn with). ``seeds`` has one seed per
    prompt. ``close()`` frees the engine (GPU memory, worker processes).
    """

    name: str
    entropy_method: str | None
    preferred_batch_prompts: int
    timings: collections.Counter  # wall seconds this sampler spent by phase (``entropy_s``), read by its caller

    def sample(self, prompts: Sequence[str], n: int, seeds: Sequence[int], settings: SamplingSettings) -> list[list[dict]]: ...

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


SAMPLERS: Registry = Registry("sampler")  # the built-in samplers register below; others from a ``plugins`` module


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


def running_engine_serves(model_path, options: "SamplerOptions") -> bool:
    """Whether this process already runs a vLLM engine that :class:`VLLMSampler` would take for ``model_path`` with
    ``options`` (same architecture, dtype and engine arguments: no start to pay). A training run's rollouts leave
    it holding the final policy, so the run's evaluation samples there without loading anything: on 2 CPU cores the
    main job's evaluation sampled in 20.5 s against 35.4 s with transformers (SmolLM2, 12 x 8 x 48 tokens,
    2026-12-05)."""
    if torch.cuda.is_available() or _vllm_missing() is not None:
        return False
    try:
        from .models import resolve_device, resolve_dtype
        from .vllm_engine import current_engine, engine_key

        engine = current_engine()
        if engine is None:
            return False
        extra = {k: v for k, v in dict(options.engine or {}).items() if v is not None}
        dtype = extra.pop("dtype", None) or _DTYPE_NAMES[resolve_dtype(options.dtype, resolve_device(options.device))]
        return engine.key == engine_key(model_path, dtype, {**vllm_engine_defaults(False), **extra})
    except Exception:  # an unreadable checkpoint config: no claim
        return False


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
        from .models import load_checkpoint, resolve_device, resolve_dtype

        device = resolve_device(options.device)
        model, tok = load_checkpoint(model_path, device, resolve_dtype(options.dtype, device))
        return cls(model, tok, options.entropy, options.score_rows, options.score_tokens, options.score_budget)

    @torch.no_grad()
    def _entropies(self, gen: Generation, temperature: float) -> list[float]:
        """Mean exact entropy of each sample, teacher-forced: ``score_rows`` rows per pass, or with ``score_budget``
        (``train.micro_batch_tokens``) passes of at most that many positions (:class:`core.scoring.Scorer`)."""
        from .scoring import Scorer, token_entropies

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
            from .agent import generate_with_tools

            gen = generate_with_tools(self.model, self.tokenizer, texts, n, settings.temperature, settings.top_p,
                                      settings.max_new_tokens, seed, tools, max_turns, max_obs_tokens)
        else:
            gen = generate_responses(self.model, self.tokenizer, texts, n, settings.temperature, settings.top_p,
                                     settings.max_new_tokens, seed, with_entropy=during)
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
            out.append([{
                "response": gen.texts[j], "n_tokens": int(gen.response_lengths[j]),
                "finish_reason": "stop" if bool(gen.finished[j]) else "length",
                "mean_token_entropy": entropies[j], "seed": seed,
                **({"tool_calls": int(gen.tool_calls[j])} if gen.tool_calls is not None else {}),
            } for j in range(i * n, (i + 1) * n)])
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


def _vllm_missing() -> str | None:
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return ("vLLM is not installed here (on a CUDA machine: pip install -e '.[gpu]'; on a CPU machine "
                "scripts/install.sh installs vLLM's CPU build); use eval.sampler=hf or auto")
    return None


def vllm_engine_defaults(on_gpu: bool) -> dict:
    """``vllm.LLM`` keyword arguments this suite sets unless ``eval.vllm`` overrides them.

    On a GPU: none (vLLM's own defaults). On the CPU (vLLM's CPU build):
    - ``enforce_eager=True``: no compilation; the engine starts in about 25 s;
    - ``kv_cache_memory_bytes`` 2 GiB: an explicit KV budget in RAM (``gpu_memory_utilization`` is a share
      of RAM there, and the default 0.92 fails on a shared machine);
    - ``enable_chunked_prefill=False``: with chunked prefill, vLLM 0.32's CPU runner rewinds the per-request
      seeded generator of a partially prefilled prompt with ``Generator.set_offset``, which CPU generators do
      not support ("CPU Generator does not use offset"); whole-prompt prefill never takes that path.
    Not an engine argument but set the same way (unless the environment sets it): on the CPU the engine core
    runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see :class:`VLLMSampler`).
    """
    if on_gpu:
        return {}
    return {"enforce_eager": True, "kv_cache_memory_bytes": 2 << 30, "enable_chunked_prefill": False}


@register_sampler("vllm", missing=_vllm_missing,
                  auto_rank=lambda: 10 if torch.cuda.is_available() else None)
class VLLMSampler:
    """vLLM offline-engine sampler behind the :class:`Sampler` protocol.

    The engine is the process's shared one (:func:`core.vllm_engine.shared_engine`): a sweep process starts it once
    and loads each checkpoint's weights into it in place, and a training run's rollouts leave it holding the final
    policy, which the run's evaluation then samples without loading anything. One ``generate`` call per batch of
    prompts (all of an evaluation's prompts at once by default: :attr:`preferred_batch_prompts`; vLLM's scheduler
    batches them), fed as token ids (the same ids the transformers path feeds: chat template rendered, no extra
    special tokens), with one ``SamplingParams(n, seed, temperature, top_p, max_tokens)`` per prompt: the n samples
    of a prompt are distinct draws of one seeded request, and a prompt's samples do not depend on which other
    prompts share its batch.

    Entropy: a teacher-forced transformers pass over the sampled token ids (see the module docstring), with
    the scoring model loaded once, on ``options.device`` in ``options.dtype``.

    Args:
        model_path: a Hugging Face model folder or hub id.
        engine: ``vllm.LLM`` keyword arguments (``gpu_memory_utilization``, ``tensor_parallel_size``,
            ``max_model_len``, ``enforce_eager``, ``dtype``, ...), over :func:`vllm_engine_defaults`.
        llm: an existing ``vllm.LLM`` to wrap instead of the shared engine (benchmarks).
    Raises:
        ImportError: vLLM is not installed.
    """

    CONFIG = {  # eval.vllm.*: vllm.LLM arguments (null: the sampler's own default); any other under eval.vllm.extra
        "eval.vllm.dtype": S(("auto", "float32", "bfloat16", "float16"), null=True),
        "eval.vllm.enforce_eager": B(null=True), "eval.vllm.gpu_memory_utilization": F(0, 1, lo_open=True, null=True),
        "eval.vllm.kv_cache_memory_bytes": I(1, null=True), "eval.vllm.max_model_len": I(1, null=True),
        "eval.vllm.tensor_parallel_size": I(1, null=True), "eval.vllm.extra": MAP,
    }

    name = "vllm"
    rollout_logprobs = True
    preferred_batch_prompts = 4096  # an evaluation's prompts in one call: vLLM's scheduler batches them itself

    def __init__(self, model_path, engine: dict | None = None, with_entropy: bool = True, device: str = "auto",
                 dtype: str = "auto", score_rows: int = 16, score_tokens: int = 512, llm=None):
        from .models import resolve_device, resolve_dtype

        self.model_path = str(model_path)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.with_entropy, self.score_rows, self.score_tokens = with_entropy, score_rows, score_tokens
        self.entropy_method = ENTROPY_METHOD if with_entropy else None
        self.timings: collections.Counter = collections.Counter()  # entropy_s: the entropies' own wall seconds
        self._scorer = None
        self.engine = None
        if llm is None:
            try:
                from .vllm_engine import shared_engine
            except ImportError as e:
                raise ImportError(_vllm_missing() or "vLLM failed to import") from e
            engine = dict(engine or {})
            dtype_name = engine.pop("dtype", None) or _DTYPE_NAMES[self.dtype]
            kwargs = {**vllm_engine_defaults(torch.cuda.is_available()), **{k: v for k, v in engine.items() if v is not None}}
            self.engine = shared_engine(self.model_path, dtype_name, kwargs)
            llm = self.engine.llm
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()

    @classmethod
    def from_path(cls, model_path: str, options: SamplerOptions) -> "VLLMSampler":
        return cls(model_path, options.engine, options.entropy, options.device, options.dtype, options.score_rows,
                   options.score_tokens)

    @classmethod
    def for_policy(cls, model, tokenizer, model_path, options: "RolloutOptions") -> "VLLMRollout":
        """Training rollouts through the shared engine, holding ``model``'s current weights (loaded in place now and
        after every optimiser step: :meth:`VLLMRollout.sync`)."""
        from .vllm_engine import shared_engine

        kwargs = {**vllm_engine_defaults(torch.cuda.is_available()), **options.engine}
        engine = shared_engine(str(model_path), options.dtype, kwargs)
        rollout = VLLMRollout(engine, tokenizer, _eos_ids(model, tokenizer))
        rollout.sync(model)
        return rollout

    @staticmethod
    def rollout_cost(plan: "RolloutPlan") -> float:
        """Estimated seconds of sampling for a training run: engine start (none when the process's engine already
        matches), generation at :data:`ROLLOUT_SPEED`, and a weight sync per step."""
        start = 0.0 if plan.engine_ready else _speed("vllm_start_s", plan)
        sync = plan.steps * plan.n_params * 4 / 2e9  # about 2 GB/s of weight copying (fp32)
        return start + plan.tokens / _speed("vllm", plan) + sync

    def prompt_token_ids(self, prompts: Sequence[str], chat_template: bool) -> list[list[int]]:
        """Token ids of the rendered prompts, as fed to the engine (no special tokens added)."""
        texts = prompt_texts(self.tokenizer, prompts, chat_template)
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    @staticmethod
    def _open_entropies(tag: str) -> dict:
        from .vllm_engine import open_entropies

        return open_entropies(tag)

    def _scoring_model(self):
        if self._scorer is None:
            from .models import load_checkpoint

            self._scorer = load_checkpoint(self.model_path, self.device, self.dtype)[0]
        return self._scorer

    def sample(self, prompts: Sequence[str], n: int, seeds: Sequence[int], settings: SamplingSettings) -> list[list[dict]]:
        from vllm import SamplingParams

        ids = self.prompt_token_ids(prompts, settings.chat_template)
        greedy = float(settings.temperature) == 0.0  # vLLM's greedy decoding: one sequence per prompt, repeated n times
        # entropies recorded while vLLM samples (the shared engine's logits processor), unless greedy: vLLM's greedy
        # path skips such processors, and greedy entropies are taken at T = 1, not at the sampling temperature
        tag = f"eval-{id(self)}-{time.monotonic_ns()}"
        record = self.with_entropy and not greedy and self.engine is not None
        extra = {"extra_args": self._open_entropies(tag)} if record else {}
        params = [SamplingParams(n=1 if greedy else int(n), seed=int(s), temperature=float(settings.temperature),
                                 top_p=1.0 if greedy else float(settings.top_p), max_tokens=int(settings.max_new_tokens),
                                 **extra)
                  for s in seeds]
        if self.engine is not None:
            self.engine.wake_up()
        results = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        recorded = None
        if record:
            from .vllm_engine import take_entropies

            recorded = take_entropies(tag, [list(c.token_ids) for res in results for c in res.outputs])
            if any(r is None for r in recorded):  # not all recorded: the teacher-forced pass for the whole call
                recorded = None
        out = []
        for res, seed in zip(results, seeds):
            outputs = list(res.outputs) * int(n) if greedy else res.outputs
            out.append([{"response": c.text, "n_tokens": len(c.token_ids),
                         "finish_reason": "length" if c.finish_reason == "length" else "stop",
                         "mean_token_entropy": None, "seed": int(seed),
                         "_ids": list(c.token_ids)} for c in outputs])
        if recorded is not None:
            self.entropy_method = VLLM_ENTROPY_METHOD
            for s, h in zip((s for group in out for s in group), recorded):
                s["mean_token_entropy"] = sum(h) / max(len(h), 1)
        elif self.with_entropy:
            from .scoring import mean_token_entropies

            self.entropy_method = ENTROPY_METHOD
            t0 = time.perf_counter()
            flat = [(i, s) for i, group in enumerate(out) for s in group]
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ent = mean_token_entropies(self._scoring_model(), [ids[i] for i, _ in flat], [s["_ids"] for _, s in flat],
                                       entropy_temperature(settings.temperature), pad, self.score_rows, self.score_tokens)
            self.timings["entropy_s"] += time.perf_counter() - t0
            for (_, s), e in zip(flat, ent):
                s["mean_token_entropy"] = e
        for group in out:
            for s in group:
                del s["_ids"]
        return out

    def close(self) -> None:
        """Free the scoring model and hand the engine back: the process's shared engine stays up for the next
        evaluation or training run (on a GPU asleep, its memory freed); :func:`core.vllm_engine.close_shared` stops it."""
        if self.engine is not None:
            self.engine.sleep()
        self.llm = None
        self._scorer = None
        _free_memory()


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _eos_ids(model, tokenizer) -> list[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])


# ----------------------------------------------------------------------------------- training rollouts

@dataclass(frozen=True)
class RolloutOptions:
    """How a training run's rollout sampler runs (``train.rollout``): ``dtype`` of the vLLM engine (``float32`` |
    ``bfloat16`` | ``float16``) and its other ``vllm.LLM`` arguments (``gpu_memory_utilization``, ...)."""

    dtype: str = "float32"
    engine: dict = field(default_factory=dict)
    token_budget: int | None = None  # positions a transformers rollout's key/value cache may hold (train.micro_batch_tokens)


@dataclass(frozen=True)
class RolloutPlan:
    """What ``train.rollout.sampler=auto`` weighs (:func:`choose_rollout_sampler`): optimiser steps, sequences
    sampled per step (prompts x group size), the token budget of each, the policy's parameter count, whether it
    trains on a GPU, and whether this process already runs a vLLM engine that would serve the run."""

    steps: int
    sequences: int
    max_new_tokens: int
    n_params: int
    gpu: bool = False
    engine_ready: bool = False

    @property
    def tokens(self) -> int:
        return self.steps * self.sequences * self.max_new_tokens


#: Sampling speeds of a training run's rollouts for a 100M-parameter model, in token budget per second (sequences x
#: max_new_tokens over the generation's wall time; speeds scale as 1 / parameters), and vLLM's start in the training
#: process (import and engine, seconds). CPU: measured on 2 cores (Xeon with AMX), SmolLM2-135M, float32, 4 prompts x
#: 8 x 48 tokens, 2026-12-02 (``python -m benchmarks.train_step``: generation 9.95 s with hf, 6.92 s with vLLM per
#: step; the engine's start about 11 s). GPU: not measured here (no GPU was lent); vLLM's usual order of magnitude
#: over transformers ``generate``, and a start of a minute.
ROLLOUT_SPEED = {"cpu": {"hf": 208.0, "vllm": 300.0, "vllm_start_s": 11.0},
                 "gpu": {"hf": 1500.0, "vllm": 15000.0, "vllm_start_s": 60.0}}


def _speed(what: str, plan: RolloutPlan) -> float:
    value = ROLLOUT_SPEED["gpu" if plan.gpu else "cpu"][what]
    return value if what.endswith("_s") else value * 1e8 / max(plan.n_params, 1)


def choose_rollout_sampler(name: str, plan: RolloutPlan) -> tuple[str, str]:
    """The rollout sampler of a training run and why: ``name`` itself when it is not ``auto`` (after checking it can
    run here), else the registered sampler with the lowest estimated sampling time for ``plan`` (each sampler's
    ``rollout_cost``; vLLM's includes its start unless this process's engine already serves the run).

    Raises:
        ValueError: an unknown sampler, one that cannot run here, or one that cannot roll out a policy.
    """
    if name != "auto":
        resolved = resolve_sampler(name)
        if SAMPLERS[resolved].rollout is None:
            raise ValueError(f"train.rollout.sampler={name!r}: this sampler cannot sample a policy in training")
        return resolved, "asked for"
    costs = {spec.name: float(spec.rollout_cost(plan)) for spec in SAMPLERS.values()
             if spec.rollout is not None and spec.rollout_cost is not None and spec.missing() is None}
    best = min(costs, key=costs.get)
    shown = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(costs.items(), key=lambda kv: kv[1]))
    return best, (f"auto: estimated sampling time for {plan.steps} steps x {plan.sequences} sequences x "
                  f"{plan.max_new_tokens} tokens ({plan.n_params / 1e6:.0f}M parameters, "
                  f"{'GPU' if plan.gpu else 'CPU'}): {shown}")


def build_rollout(name: str, model, tokenizer, model_path, options: RolloutOptions | None = None):
    """The training rollout sampler ``name`` (resolved, not ``auto``) for the policy ``model``."""
    return SAMPLERS[name].rollout(model, tokenizer, model_path, options or RolloutOptions())


class HFRollout:
    """Training rollouts with transformers ``generate`` on the policy itself: nothing to copy or sync; no log-probs of
    its own (the trainer's old log-probs are the rollout policy's)."""

    name = "hf"

    def __init__(self, model, tokenizer, token_budget: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.sync_s = 0.0
        self.token_budget = token_budget

    def generate(self, texts: Sequence[str], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> Generation:
        """``n`` samples per text; with a token budget the prompts go in groups whose key/value cache (rows x
        (longest prompt + ``max_new_tokens``) positions) fits it, group k seeded ``seed + k`` (one group, the whole
        call: the same samples as without a budget)."""
        chunks = _budget_chunks(self.tokenizer, texts, n, max_new_tokens, self.token_budget)
        gens = [generate_responses(self.model, self.tokenizer, [texts[i] for i in idx], n, temperature, top_p,
                                   max_new_tokens, seed + k) for k, idx in enumerate(chunks)]
        return gens[0] if len(gens) == 1 else concat_generations(gens, self.tokenizer.pad_token_id)

    def generate_with_tools(self, texts, n, temperature, top_p, max_new_tokens, seed, tools, max_turns, max_obs_tokens):
        from .agent import generate_with_tools

        return generate_with_tools(self.model, self.tokenizer, texts, n, temperature, top_p, max_new_tokens, seed,
                                   tools, max_turns, max_obs_tokens)

    def sync(self, model) -> float:
        return 0.0

    def sleep(self) -> None:
        return None

    def close(self) -> None:
        self.model = None


def _budget_chunks(tokenizer, texts: Sequence[str], n: int, max_new_tokens: int, budget: int | None) -> list[list[int]]:
    """Consecutive groups of prompt indices whose generation holds at most ``budget`` positions (each group's rows x
    (its longest prompt + ``max_new_tokens``)); one group of all without a budget. A prompt that alone exceeds the
    budget goes alone."""
    if budget is None or not texts:
        return [list(range(len(texts)))]
    lengths = [len(x) for x in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
    out, cur, longest = [], [], 0
    for i, p in enumerate(lengths):
        wide = max(longest, p)
        if cur and (len(cur) + 1) * n * (wide + max_new_tokens) > int(budget):
            out.append(cur)
            cur, wide = [], p
        cur.append(i)
        longest = wide
    out.append(cur)
    return out


def concat_generations(gens: list["Generation"], pad_id: int) -> "Generation":
    """One :class:`Generation` of several (rows in order): prompts re-padded on the left, responses on the right."""
    import dataclasses

    P = max(g.prompt_ids.shape[1] for g in gens)
    L = max(g.response_ids.shape[1] for g in gens)

    def left(t, value):
        return torch.cat([t.new_full((t.shape[0], P - t.shape[1]), value), t], dim=1)

    def right(t, value):
        return torch.cat([t, t.new_full((t.shape[0], L - t.shape[1]), value)], dim=1)

    out = {"prompt_ids": torch.cat([left(g.prompt_ids, pad_id) for g in gens]),
           "prompt_mask": torch.cat([left(g.prompt_mask, 0) for g in gens]),
           "response_ids": torch.cat([right(g.response_ids, pad_id) for g in gens]),
           "response_mask": torch.cat([right(g.response_mask, 0) for g in gens]),
           "texts": [t for g in gens for t in g.texts]}
    for f in dataclasses.fields(gens[0]):
        if f.name in out:
            continue
        vals = [getattr(g, f.name) for g in gens]
        if all(v is None for v in vals):
            out[f.name] = None
        elif isinstance(vals[0], torch.Tensor):
            out[f.name] = torch.cat([right(v, 0) if v.dim() == 2 else v for v in vals])
        elif isinstance(vals[0], list):
            out[f.name] = [x for v in vals for x in v]
        else:
            out[f.name] = vals[0]
    return dataclasses.replace(gens[0], **out)


class VLLMRollout:
    """Training rollouts through the process's vLLM engine (:mod:`core.vllm_engine`), which takes the policy's
    weights in place after every optimiser step (:meth:`sync`). Each generation also returns vLLM's log-prob of each
    sampled token at the sampling temperature (``Generation.logprobs``), for the trainer to measure, and optionally
    correct, the training-inference mismatch.

    Seeds: prompt i of a call is one request seeded from (``seed``, i), its n samples vLLM's draws of that request; in
    multi-turn episodes each episode's turn is its own request, seeded from (``seed``, episode, turn)."""

    name = "vllm"

    def __init__(self, engine, tokenizer, eos_ids: Sequence[int]):
        self.engine, self.tokenizer, self.eos_ids = engine, tokenizer, list(eos_ids)
        self.version = 0
        self.sync_s = 0.0

    def _params(self, n, temperature, top_p, max_tokens, seed, **extra):
        from vllm import SamplingParams

        greedy = float(temperature) == 0.0
        return SamplingParams(n=1 if greedy else int(n), seed=int(seed) % (2**31), temperature=float(temperature),
                              top_p=1.0 if greedy else float(top_p), max_tokens=int(max_tokens), logprobs=0, stop_token_ids=self.eos_ids, detokenize=False,
                              **extra)

    @staticmethod
    def _token_logprobs(c) -> list[float]:
        return [float(d[t].logprob) if d and t in d else 0.0 for t, d in zip(c.token_ids, c.logprobs or [])]

    def generate(self, texts: Sequence[str], n: int, temperature: float, top_p: float, max_new_tokens: int,
                 seed: int) -> Generation:
        """``n`` samples per text, as :func:`generate_responses` lays them out (prompt-major, left-padded prompts,
        right-padded responses, the mask through the first EOS), with ``logprobs`` (B, L)."""
        self.engine.wake_up()
        ids = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        params = [self._params(n, temperature, top_p, max_new_tokens, seed * 1_000_003 + i * 10_007)
                  for i in range(len(ids))]
        outs = self.engine.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        greedy = float(temperature) == 0.0
        rows, lps = [], []
        for res in outs:
            cs = list(res.outputs) * int(n) if greedy else list(res.outputs)
            rows += [list(c.token_ids) or [self.tokenizer.pad_token_id] for c in cs]
            lps += [self._token_logprobs(c) for c in cs]
        return _generation(self.tokenizer, ids, int(n), rows, lps, self.eos_ids)

    def generate_with_tools(self, texts, n, temperature, top_p, max_new_tokens, seed, tools, max_turns, max_obs_tokens):
        """Multi-turn episodes (:func:`core.agent.run_episodes`) on the engine: each turn of each episode one request
        that stops at a tool's closing tag, ``</answer>`` or EOS, seeded by (``seed``, episode, turn)."""
        from .agent import ANSWER_CLOSE, run_episodes

        self.engine.wake_up()
        stops = [t.close_tag for t in tools.values()] + [ANSWER_CLOSE]

        def cont(seqs, budgets, turn):
            params = [self._params(1, temperature, top_p, b, seed * 7919 + turn * 100_003 + j, stop=stops,
                                   include_stop_str_in_output=True) for j, b in enumerate(budgets)]
            outs = self.engine.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
            return [(list(o.outputs[0].token_ids), self._token_logprobs(o.outputs[0])) for o in outs]

        return run_episodes(cont, self.tokenizer, self.eos_ids, texts, n, max_new_tokens, tools, max_turns,
                            max_obs_tokens)

    def sync(self, model) -> float:
        """Load ``model``'s current weights into the engine in place (after an optimiser step). Returns seconds."""
        self.version += 1
        self.sync_s = self.engine.load_module(model, f"policy:{id(model)}:{self.version}")
        return self.sync_s

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer updates the policy (a no-op on the CPU)."""
        self.engine.sleep()

    def close(self) -> None:
        self.engine.sleep()


def _generation(tokenizer, prompt_ids: list[list[int]], n: int, responses: list[list[int]], logprobs: list[list[float]],
                eos_ids: Sequence[int]) -> Generation:
    """A :class:`Generation` from token lists: prompts (one per n rows) left-padded, responses right-padded."""
    pad = tokenizer.pad_token_id
    B = len(responses)
    p_width = max(len(p) for p in prompt_ids)
    prompts = [prompt_ids[i // n] for i in range(B)]
    width = max(1, max(len(r) for r in responses))
    response_ids = torch.tensor([r + [pad] * (width - len(r)) for r in responses])
    mask, finished = response_mask_from_ids(response_ids, eos_ids)
    lp = torch.tensor([x + [0.0] * (width - len(x)) for x in logprobs]) * mask
    texts = tokenizer.batch_decode(response_ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
    return Generation(
        prompt_ids=torch.tensor([[pad] * (p_width - len(p)) + p for p in prompts]),
        prompt_mask=torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts]),
        response_ids=response_ids, response_mask=mask, response_lengths=mask.sum(-1), finished=finished, texts=texts,
        logprobs=lp)
