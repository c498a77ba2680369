"""A training run's peak memory, planned from the model's shape alone (no weights loaded, nothing downloaded), and
the largest micro-batch that fits its device.

What a local training run holds (GiB, :class:`MemoryPlan.parts`):

- ``weights``: the policy in float32 (4 bytes per parameter; ``train.precision=bf16`` is autocast over float32
  weights), ``gradients`` (4), ``optimizer`` (AdamW's two moments, 8), ``reference`` (a frozen copy when a KL term
  is on: 4 bytes, 2 in bf16), ``autocast_cache`` (bf16 copies of the weights while autocast runs a pass);
  with LoRA (``train.lora.rank > 0``) the weights gain the adapters', and gradients and optimizer state are the
  adapters' only (:meth:`ModelShape.lora_params`); the reference is the base itself (no copy);
- ``activations``: what the forward pass keeps for the backward pass, per token position of a micro-batch
  (:func:`activation_bytes_per_token`), times the micro-batch budget (``train.micro_batch_tokens``);
- ``output_head``: one chunk of float32 logits, their log-softmax and their gradient (``core.scoring.HEAD_TOKENS``
  positions x vocabulary);
- ``rollout``: on a GPU the vLLM engine's share (``train.rollout.gpu_memory_utilization`` of the device; asleep
  while the trainer updates, so it competes with the update's transients only, not adds to them); on the CPU its
  copy of the weights and its key/value cache (sized for one generation call of the step, at most 2 GiB:
  :func:`core.sampling.vllm.kv_cache_bytes`), held throughout; transformers rollouts: their key/value cache
  and one step's logits; with overlapped generation (``train.rollout.overlap``, staleness >= 1) one more float32 copy
  of the weights, held (the policy the step started from, which generates during the update), and the generation's
  own memory (the GPU engine's share, transformers' cache and logits) held beside the update rather than in turn
  with it: the two run at the same time;
- ``runtime``: what the process holds besides (CPU: Python, torch and the libraries, measured; GPU: the CUDA
  context and allocator slack).

peak = weights + optimizer + reference + runtime + persistent rollout + max(gradients + activations + output head
+ autocast cache, rollout transients).

Calibration: the per-token activation constant was measured on the CPU (SmolLM2-135M and the tiny model, float32,
``benchmarks.memory``; dated on docs/performance.md); at start-up the engine measures one forward and backward pass of the largest
micro-batch (on a GPU; ``train.memory_check``) and logs both. Source of the accounting: the usual mixed-precision
training budget (Rajbhandari et al. 2020, ZeRO, sec. 3.1: 16 bytes per parameter with Adam in mixed precision;
here float32 master weights and moments make it 16 with no half-precision copy) and the per-layer activation count of
Korthikanti et al. 2023 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4.1), adapted to
grouped-query attention, SwiGLU and a fused attention kernel.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SHAPES_FILE = Path(__file__).with_name("model_shapes.json")
GIB = float(2**30)

#: bytes the CPU process holds besides the plan's parts (Python, torch, transformers, MLflow, the tokenizer),
#: measured on 2 cores (peak RSS of a process that loaded the libraries and the tiny model; docs/performance.md)
CPU_RUNTIME_GB = 1.3
#: the CUDA context and the caching allocator's slack on a GPU
GPU_RUNTIME_GB = 1.5
#: the vLLM CPU engine's runtime (its key/value cache: sized for the step, core.sampling.vllm.kv_cache_bytes)
VLLM_CPU_RUNTIME_GB = 1.0
#: activation floats kept per token and decoder layer, in units of (7 h + 2 kv + 4 i) (see
#: :func:`activation_bytes_per_token`); fitted to the measured slopes of benchmarks.memory
ACTIVATION_FACTOR = 1.0
#: the share of a device's memory a plan may use (fragmentation, other processes)
USABLE_SHARE = 0.9


@dataclass(frozen=True)
class ModelShape:
    """The parts of a decoder's configuration the plan reads (Llama-style: RMSNorm, grouped-query attention, SwiGLU).

    Attributes:
        name: where it came from (a hub id, a folder).
        layers, hidden, intermediate, heads, kv_heads, head_dim, vocab: the usual configuration fields.
        tied: input and output embeddings shared.
        qkv_bias: biases on the query, key and value projections (Qwen2).
        context: max_position_embeddings.
        sliding_window: a sliding-window attention layer is active.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False
    context: int = 0
    sliding_window: bool = False

    @property
    def n_params(self) -> int:
        """Parameters: embeddings (and an untied output head), per layer the attention projections (with biases
        where set), the SwiGLU MLP and two RMSNorms, and the final norm."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate
        per_layer = attn + mlp + 2 * h
        return self.vocab * h * (1 if self.tied else 2) + self.layers * per_layer + h

    def lora_params(self, rank: int, targets: tuple) -> int:
        """Parameters of rank-``rank`` LoRA adapters on the decoder projections named in ``targets`` (each
        ``r x (in + out)``: A is r x in, B is out x r)."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        dims = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
                "up_proj": h + i, "down_proj": i + h}
        return int(rank) * self.layers * sum(dims[t] for t in targets if t in dims)

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelShape":
        """From a transformers config object or a config.json dict."""
        get = (config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d)))
        h, heads = int(get("hidden_size")), int(get("num_attention_heads"))
        types = get("layer_types") or ()
        window = get("sliding_window")
        sliding = any("sliding" in str(t) for t in types) or (
            window is not None and get("use_sliding_window", True) is not False
            and int(window) < int(get("max_position_embeddings", 0) or 0))
        return cls(name=name or str(get("_name_or_path", "") or ""), layers=int(get("num_hidden_layers")), hidden=h,
                   intermediate=int(get("intermediate_size")), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads), head_dim=int(get("head_dim") or h // heads),
                   vocab=int(get("vocab_size")), tied=bool(get("tie_word_embeddings", True)),
                   qkv_bias=bool(get("attention_bias", False)) or str(get("model_type", "")) == "qwen2",
                   context=int(get("max_position_embeddings", 0) or 0), sliding_window=bool(sliding))


@functools.lru_cache(maxsize=1)
def shipped_shapes() -> dict:
    """{hub id: shape fields} of every preset's model, shipped with the suite (``training/model_shapes.json``)."""
    data = json.loads(SHAPES_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def model_shape(model_cfg) -> ModelShape:
    """The shape of ``model_cfg``'s model, without loading weights or downloading anything: the tiny model's from
    its config keys; a local folder's or a cached hub model's ``config.json``; else the shipped shape of a preset's
    model (:func:`shipped_shapes`).

    Raises:
        ValueError: a hub model that is neither cached nor shipped (names ``model.path`` and what to do).
    """
    src = str(model_cfg.get("source"))
    if src == "tiny_random":
        from core.models import TINY_CONTEXT

        h, heads = int(model_cfg.hidden_size), int(model_cfg.num_heads)
        return ModelShape(str(model_cfg.name), int(model_cfg.num_layers), h, int(model_cfg.intermediate_size), heads,
                          heads, h // heads, 49152, True, False, TINY_CONTEXT)
    if src == "gguf_wheel":
        return ModelShape(name=str(model_cfg.name), **shipped_shapes()["HuggingFaceTB/SmolLM2-135M-Instruct"])
    path = str(model_cfg.get("path"))
    local = Path(path) / "config.json"
    if local.is_file():
        return ModelShape.from_config(json.loads(local.read_text()), path)
    if path in shipped_shapes():
        return ModelShape(name=path, **shipped_shapes()[path])
    try:
        from transformers import AutoConfig

        return ModelShape.from_config(AutoConfig.from_pretrained(path, local_files_only=True), path)
    except Exception:
        raise ValueError(f"model.path={path!r}: its shape is not known here (not a local folder, not in the hub cache, "
                         f"not one of the shipped shapes in {SHAPES_FILE.name}); download it once, or set "
                         "train.memory_check=false to skip the memory plan") from None


def activation_bytes_per_token(shape: ModelShape, bf16: bool = False, checkpointing: bool = False) -> float:
    """Bytes the forward pass keeps for the backward pass, per token position of a micro-batch.

    Per decoder layer and token, the tensors autograd saves: the two RMSNorm inputs and outputs, the query, key and
    value projections, the attention output and its projection's input (about 7 h + 2 kv floats with a fused
    attention kernel, kv = kv_heads x head_dim) and the SwiGLU MLP's gate, up, activation and product (4 i floats);
    times :data:`ACTIVATION_FACTOR`. With gradient checkpointing, each layer keeps its input only (h floats) and one
    layer's whole set exists during its recomputation. bf16 autocast keeps most of them in 2 bytes.
    """
    per_layer = ACTIVATION_FACTOR * (7 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate)
    width = 2 if bf16 else 4
    if checkpointing:
        return 4.0 * shape.hidden * shape.layers + width * per_layer + 4.0 * shape.hidden
    return width * per_layer * shape.layers + 4.0 * shape.hidden * 2  # + the embeddings' output and the final norm


@dataclass
class MemoryPlan:
    """A run's planned peak memory (GiB) and the micro-batch budget it was planned with.

    Attributes:
        parts: GiB per part (module docstring).
        budget_tokens: positions per forward and backward pass the activations were planned for.
        device: ``cuda`` or ``cpu``; device_gb: its memory (None: unknown here, nothing refused).
        per_token_mb: activation MiB per position.
        model: the model's name; n_params: its parameters.
    """

    parts: dict
    budget_tokens: int
    device: str
    device_gb: float | None
    per_token_mb: float
    model: str
    n_params: int
    notes: list = field(default_factory=list)
    sequence_tokens: int = 0

    @property
    def total_gb(self) -> float:
        p = self.parts
        update = p["gradients"] + p["activations"] + p["output_head"] + p["autocast_cache"]
        return (p["weights"] + p["optimizer"] + p["reference"] + p["runtime"] + p["rollout_held"]
                + max(update, p["rollout_transient"]))

    @property
    def allocated_gb(self) -> float:
        """The peak less the runtime: what torch's allocator holds at the peak (``torch.cuda.max_memory_allocated``
        on a GPU; the CUDA context is not in it)."""
        return self.total_gb - self.parts["runtime"]

    @property
    def fits(self) -> bool:
        return self.device_gb is None or self.total_gb <= USABLE_SHARE * self.device_gb

    def summary(self) -> str:
        """One line: the total, the device and the largest parts."""
        where = f"{self.device_gb:.1f} GiB {self.device}" if self.device_gb is not None else f"{self.device} (size unknown)"
        big = sorted(((v, k) for k, v in self.parts.items() if v >= 0.05), reverse=True)[:5]
        return (f"memory plan: {self.total_gb:.1f} GiB peak on {where} for {self.model} ({self.n_params / 1e9:.2f}B "
                f"parameters, {self.budget_tokens} tokens per pass, sequences up to {self.sequence_tokens}): "
                + ", ".join(f"{k} {v:.1f}" for v, k in big)
                + "".join(f"; {n}" for n in self.notes if not n.startswith("would fit")))

    def as_dict(self) -> dict:
        return {"total_gb": round(self.total_gb, 3), "fits": self.fits, "device": self.device,
                "device_gb": self.device_gb, "budget_tokens": self.budget_tokens,
                "per_token_mb": round(self.per_token_mb, 4), "model": self.model, "n_params": self.n_params,
                **{f"{k}_gb": round(v, 3) for k, v in self.parts.items()}}


@dataclass(frozen=True)
class RunShape:
    """What the plan reads of a run config (:meth:`of`)."""

    minibatch_rows: int
    max_prompt_tokens: int
    max_new_tokens: int
    kl: bool
    bf16: bool
    checkpointing: bool
    rollout: str           # vllm | hf | auto | none (no rollout engine: benchmarks, the GPU check)
    gpu_share: float
    prompts_per_step: int
    group_size: int
    lora_rank: int = 0     # train.lora.rank (0: full fine-tuning)
    lora_targets: tuple = ()
    generation_copy: bool = False  # train.rollout.overlap with staleness >= 1: a copy of the weights generates

    @classmethod
    def of(cls, s) -> "RunShape":
        """The shape of a run's settings (:class:`training.settings.RunSettings`, its precision resolved on the device
        it trains on; a GPU not visible here is assumed to compute bf16, :func:`core.precision.native_bf16`)."""
        rows = s.rows_per_step
        ro = s.rollout
        return cls(minibatch_rows=int(s.minibatch_size or rows), max_prompt_tokens=s.max_prompt_tokens,
                   max_new_tokens=s.max_new_tokens, kl=s.needs.reference, bf16=s.bf16,
                   checkpointing=s.gradient_checkpointing, rollout=str(ro.sampler),
                   gpu_share=float(ro.gpu_memory_utilization or 0.3), prompts_per_step=s.prompts_per_step,
                   group_size=s.group_size, lora_rank=s.lora.rank, lora_targets=s.lora.targets() if s.lora.on else (),
                   generation_copy=bool(ro.overlap) and ro.staleness > 0)

    @property
    def sequence_tokens(self) -> int:
        """The longest sequence a pass must hold: the longest prompt and the longest response."""
        return self.max_prompt_tokens + self.max_new_tokens

    @property
    def one_pass_tokens(self) -> int:
        """Positions of a whole minibatch in one padded pass (``train.micro_batch_tokens=null``)."""
        return self.minibatch_rows * self.sequence_tokens


def plan_memory(shape: ModelShape, run: RunShape, budget_tokens: int | None, device: str = "cpu",
                device_gb: float | None = None, head_tokens: int | None = None) -> MemoryPlan:
    """The plan of a run (module docstring) with ``budget_tokens`` per pass (None: the whole minibatch in one).

    Args:
        device: ``cuda`` or ``cpu``; device_gb: the device's memory (None: unknown).
        head_tokens: output-head positions per call (default :data:`core.scoring.HEAD_TOKENS`).
    """
    from core.scoring import HEAD_TOKENS

    n = shape.n_params
    # what trains: every parameter, or with LoRA the adapters only (gradients and AdamW state for them; the frozen
    # base is the reference policy, so no copy)
    lora = shape.lora_params(run.lora_rank, run.lora_targets) if run.lora_rank > 0 else 0
    trained = lora or n
    budget = int(budget_tokens) if budget_tokens is not None else run.one_pass_tokens
    per_tok = activation_bytes_per_token(shape, run.bf16, run.checkpointing)
    head = min(int(head_tokens or HEAD_TOKENS), run.one_pass_tokens)  # one chunk, whatever the budget
    parts = {
        "weights": 4.0 * (n + lora) / GIB,
        "gradients": 4.0 * trained / GIB,
        "optimizer": 8.0 * trained / GIB,
        "reference": ((2.0 if run.bf16 else 4.0) * n / GIB) if run.kl and not lora else 0.0,
        "autocast_cache": (2.0 * n / GIB) if run.bf16 else 0.0,
        "activations": per_tok * budget / GIB,
        "output_head": 4.0 * 4 * head * shape.vocab / GIB,
        "runtime": GPU_RUNTIME_GB if device == "cuda" else CPU_RUNTIME_GB,
        "rollout_held": 0.0,
        "rollout_transient": 0.0,
    }
    rows = run.prompts_per_step * run.group_size
    kv_cache = rows * (run.sequence_tokens) * shape.layers * 2 * shape.kv_heads * shape.head_dim * 4.0 / GIB
    hf = kv_cache + 4.0 * rows * shape.vocab / GIB
    from core.sampling.vllm import kv_cache_bytes

    # the CPU engine's cache, sized for one generation call of the step (training.engines.local._cpu_engine_cache)
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * (2 if run.bf16 else 4)
    engine_kv = kv_cache_bytes(per_position, rows, run.sequence_tokens, shape.context or run.sequence_tokens) / GIB
    if run.rollout == "vllm" or (run.rollout == "auto" and device == "cuda"):
        if device == "cuda":
            parts["rollout_transient"] = run.gpu_share * (device_gb or 0.0)
        else:
            parts["rollout_held"] = (2.0 if run.bf16 else 4.0) * n / GIB + engine_kv + VLLM_CPU_RUNTIME_GB
    elif run.rollout == "auto":  # the CPU's choice is made at start: plan for the larger of the two
        parts["rollout_held"] = (2.0 if run.bf16 else 4.0) * n / GIB + engine_kv + VLLM_CPU_RUNTIME_GB
    elif run.rollout == "hf":
        parts["rollout_transient"] = hf
    if run.generation_copy:  # overlapped generation: the weights the step started from, beside the trained ones;
        # and the generation runs during the update (on a GPU its engine is not put to sleep): its transients are held
        parts["rollout_held"] += 4.0 * (n + lora) / GIB + parts["rollout_transient"]
        parts["rollout_transient"] = 0.0
    return MemoryPlan(parts, budget, device, device_gb, per_tok / 2**20, shape.name, n,
                      sequence_tokens=run.sequence_tokens)


def auto_budget(shape: ModelShape, run: RunShape, device: str, device_gb: float | None,
                quantum: int = 64, cap: bool = True) -> int | None:
    """The largest micro-batch budget (positions per pass, a multiple of ``quantum``) whose plan fits
    :data:`USABLE_SHARE` of ``device_gb``, capped at the whole minibatch in one pass (``cap``); None when the device's
    size is unknown (then: the whole minibatch). At least the longest sequence, even when that does not fit (the plan
    then says so)."""
    if device_gb is None:
        return None
    base = plan_memory(shape, run, run.sequence_tokens, device, device_gb)
    spare = USABLE_SHARE * device_gb - (base.total_gb - base.parts["activations"])
    per_tok = base.per_token_mb / 1024.0
    tokens = int(spare / per_tok) if spare > 0 and per_tok > 0 else 0
    tokens = tokens // quantum * quantum
    if cap:
        tokens = min(tokens, run.one_pass_tokens)
    return max(tokens, run.sequence_tokens)


def _kib(path: str, field: str) -> int | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def device_memory_gb(device: str) -> float | None:
    """The training device's memory, GiB: a GPU's total; on the CPU the machine's RAM (Linux ``MemTotal``, or the
    container's cgroup limit when lower). A total, as on a GPU, never what is free at the moment: the budget and
    the refusal must not change with what else runs beside the sweep. Reading ``MemAvailable`` made them do so: two
    test workers' vLLM and verl processes shrank a tiny model's budget to one sequence per pass and per rollout
    batch, and the suite ran about three times longer on a CI machine."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available() else None
    total = _kib("/proc/meminfo", "MemTotal")
    if total is None:
        return None
    limit = None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limit = int(text) / 1024
            break
    return min(total, limit or total) * 1024 / GIB


def plan_for(s, device_gb: float | None = None, detect: bool = True, longest_prompt: int | None = None,
             rollout: str | None = None) -> MemoryPlan:
    """The plan of a run's settings (:class:`training.settings.RunSettings`) on the device it trains on
    (``s.device_type``) with ``device_gb`` (default: ``train.device_memory_gb``, else this machine's when ``detect``,
    else unknown), at its ``train.micro_batch_tokens`` (``auto``: the largest that fits, :func:`auto_budget`).
    ``longest_prompt``: the longest training prompt in tokens when known (the run plans with it; else
    ``train.max_prompt_tokens``, an upper bound: 512 by default, which planned 13.1 GiB for the main job whose run
    planned 8.7 and peaked at 10.5). ``rollout``: the rollout sampler the run uses when known (``auto`` resolved;
    default ``train.rollout.sampler``, whose ``auto`` on a CPU plans the larger of the two engines).

    Raises:
        ValueError: the model's shape is not known here (:func:`model_shape`).
    """
    shape = model_shape(s.model)
    device = s.device_type
    run = RunShape.of(s)
    if rollout is not None:
        import dataclasses

        run = dataclasses.replace(run, rollout=str(rollout))
    if longest_prompt:
        import dataclasses

        run = dataclasses.replace(run, max_prompt_tokens=min(int(longest_prompt), run.max_prompt_tokens))
    if device_gb is None:
        given = s.device_memory_gb
        device_gb = float(given) if given is not None else (device_memory_gb(device) if detect else None)
    budget = s.micro_batch_tokens
    if budget == "auto":  # on a device of unknown size (a cluster node seen from the login node): the least it takes
        budget = auto_budget(shape, run, device, device_gb) if device_gb is not None else run.sequence_tokens
    plan = plan_memory(shape, run, None if budget is None else int(budget), device, device_gb)
    if device_gb is None and s.micro_batch_tokens == "auto":
        plan.notes.append("train.micro_batch_tokens=auto is chosen on the training device")
    if not plan.fits:
        plan.notes.append(advice(shape, run, device, device_gb, plan))
    return plan


def advice(shape: ModelShape, run: RunShape, device: str, device_gb: float | None, plan: MemoryPlan) -> str:
    """What would make a plan that does not fit fit: the settings that lower it enough, or verl on N GPUs."""
    usable = USABLE_SHARE * (device_gb or 0.0)
    fixes = []
    seq = run.sequence_tokens
    small = plan_memory(shape, run, seq, device, device_gb)
    if small.total_gb <= usable:
        best = auto_budget(shape, run, device, device_gb)
        fixes.append(f"train.micro_batch_tokens={best} (or auto)")
    else:
        import dataclasses

        ck = dataclasses.replace(run, checkpointing=True)
        if plan_memory(shape, ck, seq, device, device_gb).total_gb <= usable:
            fixes.append("train.gradient_checkpointing=true (with train.micro_batch_tokens=auto)")
        if device == "cuda" and small.parts["rollout_transient"] > 0:
            lower = dataclasses.replace(run, gpu_share=0.1)
            if plan_memory(shape, lower, seq, device, device_gb).total_gb <= usable:
                fixes.append("train.rollout.gpu_memory_utilization=0.1")
    # verl shards weights, gradients and optimizer state over N GPUs (FSDP) and checkpoints activations (the suite's
    # engine=verl default): the states over N, one sequence's checkpointed activations and a head chunk per GPU, and
    # its vLLM rollout's share (train.rollout.gpu_memory_utilization) beside them
    import dataclasses

    ck = plan_memory(shape, dataclasses.replace(run, checkpointing=True), seq, "cuda", 80.0)
    states = (ck.parts["weights"] + ck.parts["gradients"] + ck.parts["optimizer"] + ck.parts["reference"])
    per_gpu = (80.0 * USABLE_SHARE - GPU_RUNTIME_GB - ck.parts["activations"] - ck.parts["output_head"]
               - run.gpu_share * 80.0)
    gpus = next((g for g in (1, 2, 4, 8, 16, 32, 64) if per_gpu > 0 and states / g <= per_gpu), None)
    if gpus is not None and gpus > 1:
        fixes.append(f"engine=verl engine.n_gpus_per_node={gpus} (80 GiB GPUs)")
    elif gpus == 1 and device != "cuda":
        fixes.append("one 80 GiB GPU (hydra/launcher=slurm)")
    if not fixes:
        fixes.append("a device with more memory")
    return "would fit with " + " or ".join(fixes)


def refusal(plan: MemoryPlan) -> str | None:
    """The one-line pre-flight refusal of a plan that does not fit its device (None when it fits)."""
    if plan.fits:
        return None
    return (f"train.micro_batch_tokens: the run needs about {plan.total_gb:.1f} GiB ({plan.summary().split(': ', 1)[1]}) "
            f"and the {plan.device} has {plan.device_gb:.1f} GiB ({int(USABLE_SHARE * 100)}% usable); "
            + "; ".join(plan.notes))


def round_up(x: float, q: int) -> int:
    return int(math.ceil(x / q) * q)
