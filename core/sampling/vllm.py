"""The ``vllm`` sampler: vLLM's offline engine on a checkpoint folder (GPU, or vLLM's CPU build)."""
from __future__ import annotations

import collections
import importlib.util
import time
from typing import Sequence

import torch

from ..config_keys import MAP, B, F, I, S
from .generate import entropy_temperature, prompt_texts
from .interface import (
    ENTROPY_METHOD,
    VLLM_ENTROPY_METHOD,
    Sample,
    SamplerOptions,
    SamplingSettings,
    _free_memory,
    register_sampler,
)
from .rollout import _DTYPE_NAMES, RolloutOptions, RolloutPlan, VLLMRollout, _eos_ids, _speed


def _vllm_missing() -> str | None:
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return ("vLLM is not installed here (on a CUDA machine: pip install -e '.[gpu]'; on a CPU machine "
                "scripts/install.sh installs vLLM's CPU build); use eval.sampler=hf or auto")
    return None


CPU_KV_CACHE_BYTES = 2 << 30  # the CPU engine's key/value cache unless sized (kv_cache_bytes) or set by the user
CPU_KV_BLOCK = 128  # positions per block of vLLM's CPU cache (vllm.platforms.cpu: block_size 128)
KV_MARGIN = 1.25


def kv_cache_bytes(per_position: int, sequences: int, positions: int, context: int) -> int:
    """The vLLM CPU engine's key/value cache for one generation call of ``sequences`` sequences of at most
    ``positions`` positions each (prompt and response), in whole blocks of :data:`CPU_KV_BLOCK` positions, times
    :data:`KV_MARGIN`; at least one sequence of the whole ``context`` plus a block (vLLM refuses a cache that cannot
    hold one request of its ``max_model_len``), at most :data:`CPU_KV_CACHE_BYTES` (the fixed reserve it replaces)
    unless that floor needs more. ``per_position``: 2 (key and value) x layers x key/value heads x head dimension x
    bytes per number. Bytes."""
    blocks = lambda n: -(-int(n) // CPU_KV_BLOCK)  # noqa: E731
    need = int(KV_MARGIN * int(sequences) * blocks(positions) * CPU_KV_BLOCK * int(per_position))
    floor = (blocks(context) + 1) * CPU_KV_BLOCK * int(per_position)
    return int(max(min(need, CPU_KV_CACHE_BYTES), floor))


def vllm_engine_defaults(on_gpu: bool) -> dict:
    """``vllm.LLM`` keyword arguments this suite sets unless ``eval.vllm`` overrides them.

    On a GPU: none (vLLM's own defaults). On the CPU (vLLM's CPU build):
    - ``enforce_eager=True``: no compilation; the engine starts in about 25 s;
    - ``kv_cache_memory_bytes`` 2 GiB: an explicit KV budget in RAM (``gpu_memory_utilization`` is a share
      of RAM there, and the default 0.92 fails on a shared machine); a training run sizes it for its step instead
      (:func:`kv_cache_bytes`, ``RolloutOptions.engine``);
    - ``enable_chunked_prefill=False``: with chunked prefill, vLLM 0.32's CPU runner rewinds the per-request
      seeded generator of a partially prefilled prompt with ``Generator.set_offset``, which CPU generators do
      not support ("CPU Generator does not use offset"); whole-prompt prefill never takes that path.
    Not an engine argument but set the same way (unless the environment sets it): on the CPU the engine core
    runs in the calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, see :class:`VLLMSampler`).
    """
    if on_gpu:
        return {}
    return {"enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "enable_chunked_prefill": False}


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
        from ..models import resolve_device, resolve_dtype

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
                from ..vllm_engine import shared_engine
            except ImportError as e:
                raise ImportError(_vllm_missing() or "vLLM failed to import") from e
            engine = dict(engine or {})
            dtype_name = engine.pop("dtype", None) or _DTYPE_NAMES[self.dtype]
            kwargs = {**vllm_engine_defaults(torch.cuda.is_available()), **{k: v for k, v in engine.items() if v is not None}}
            # a running engine serves whatever its cache (a training run's, sized for its step): vLLM schedules an
            # evaluation's requests in waves when they do not fit at once; unless eval.vllm sets the cache
            self.engine = shared_engine(self.model_path, dtype_name, kwargs,
                                        any_cache=engine.get("kv_cache_memory_bytes") is None)
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
        from ..vllm_engine import shared_engine

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
        from ..vllm_engine import open_entropies

        return open_entropies(tag)

    def _scoring_model(self):
        if self._scorer is None:
            from ..models import load_checkpoint

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
            from ..vllm_engine import take_entropies

            recorded = take_entropies(tag, [list(c.token_ids) for res in results for c in res.outputs])
            if any(r is None for r in recorded):  # not all recorded: the teacher-forced pass for the whole call
                recorded = None
        out, token_ids = [], []  # token_ids: each sample's, in the order of the flattened samples
        for res, seed in zip(results, seeds):
            outputs = list(res.outputs) * int(n) if greedy else res.outputs
            out.append([Sample(c.text, len(c.token_ids), "length" if c.finish_reason == "length" else "stop",
                               None, int(seed)) for c in outputs])
            token_ids += [list(c.token_ids) for c in outputs]
        if recorded is not None:
            self.entropy_method = VLLM_ENTROPY_METHOD
            for s, h in zip((s for group in out for s in group), recorded):
                s.mean_token_entropy = sum(h) / max(len(h), 1)
        elif self.with_entropy:
            from ..scoring import mean_token_entropies

            self.entropy_method = ENTROPY_METHOD
            t0 = time.perf_counter()
            flat = [(i, s) for i, group in enumerate(out) for s in group]
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            ent = mean_token_entropies(self._scoring_model(), [ids[i] for i, _ in flat], token_ids,
                                       entropy_temperature(settings.temperature), pad, self.score_rows, self.score_tokens)
            self.timings["entropy_s"] += time.perf_counter() - t0
            for (_, s), e in zip(flat, ent):
                s.mean_token_entropy = e
        return out

    def close(self) -> None:
        """Free the scoring model and hand the engine back: the process's shared engine stays up for the next
        evaluation or training run (on a GPU asleep, its memory freed); :func:`core.vllm_engine.close_shared` stops it."""
        if self.engine is not None:
            self.engine.sleep()
        self.llm = None
        self._scorer = None
        _free_memory()
