"""The local engine's setup phase: everything a run's steps use, built once from its settings (:class:`LocalRun`,
:func:`setup`): the policy on its device (gradient checkpointing, LoRA adapters), the reference policy when a KL term
reads it, AdamW and its warm-up schedule, the prompt order, the algorithm's functions, the update's settings, the
scorer (token budget and layout, :func:`open_scorer`) and, when the loop starts, the rollout sampler
(:func:`open_rollout`)."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from core.lora import attach, has_adapters, trainable_count
from core.models import load_policy
from core.scoring import Scorer, Sequences, choose_layout
from core.tasks import load_prompts
from training.algorithms import BoundLoss, get_advantage_fn
from training.compute import ComputeModel
from training.engines import EngineChoices, RolloutChoice
from training.engines.local.local_checks import longest_prompt, planned_sampler, rollout_choice
from training.run_state import PromptOrder, seed_everything
from training.settings import RunSettings
from training.token_probs import TokenProbs
from training.update import UpdateSettings


@dataclass
class LocalRun:
    """Everything a local run's steps use (:func:`setup`): the run's ``settings`` (the one settings object), its
    folder and device, the policy, tokenizer and reference, the optimiser and schedule, the prompt order, the
    advantage estimator, the policy loss bound to its parameters, the update's settings (derived from ``settings``)
    and the scorer; then what the loop keeps: the rollout sampler, the tools, the token counts, the metrics saved but
    not yet logged, a step stopped inside its update, the staleness queue, the overlap's generation, the
    validator and the compute spent."""

    settings: RunSettings
    run_dir: Path
    device: torch.device
    model: object
    tokenizer: object
    ref_model: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    prompts: PromptOrder
    adv_fn: Callable
    loss: BoundLoss  # the policy loss bound to algo.policy_loss's parameters
    update: UpdateSettings
    scorer: Scorer
    compute: ComputeModel  # the step's estimated FLOPs (training/compute.py)
    choices: EngineChoices = field(default_factory=EngineChoices)  # what the run chose, for the orchestrator
    rollout: object = None
    tools: dict = field(default_factory=dict)
    token_probs: TokenProbs = field(default_factory=TokenProbs)
    pending: list = field(default_factory=list)  # (step, metrics) saved with the state but not yet logged
    inflight: object = None  # a step whose update a stop interrupted (local_state.InFlight; resume finishes it)
    queue: dict = field(default_factory=dict)  # step -> StepRollout generated ahead for it (train.rollout.staleness)
    ahead: object = None  # train.rollout.overlap: the generation running during an update (local_queue.Ahead)
    validator: object = None  # train.validate_every: the validation inside the loop (training.engines.LoopValidation)
    compute_spent: float = 0.0  # FLOPs of the steps done (the sum of train/flops; saved with the state)

    @property
    def seed(self) -> int:
        return self.settings.seed


def setup(s: RunSettings, run_dir: Path, tools: dict, choices: EngineChoices | None = None) -> LocalRun:
    """The run's policy (on the device, gradient checkpointing as configured; with ``train.lora.rank > 0`` LoRA
    adapters on the frozen base, :mod:`core.lora`), the reference policy when a KL term reads it (a frozen copy; with
    LoRA the same model with its adapters disabled, no copy), AdamW over what trains with its warm-up schedule, the
    prompt order, the algorithm's functions, the update's settings and the scorer (:func:`open_scorer`: the token
    budget and the packed layout, checked on the model)."""
    choices = EngineChoices() if choices is None else choices
    seed_everything(s.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and s.device != "cpu" else "cpu")
    model, tokenizer = load_policy(s.model)
    if s.lora.on:  # only the adapters train (B = 0: the policy starts as the base)
        attach(model, s.lora)
    model.to(device).train()
    if s.gradient_checkpointing:  # activations recomputed in the backward pass
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ref_model = None
    if s.needs.reference:
        if s.lora.on:  # the base itself: core.lora.reference disables the adapters while it scores
            ref_model = model
        else:  # a reference copy only when a KL term is used (in bf16 with train.precision=bf16: it is never trained)
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            if s.bf16:
                ref_model.to(torch.bfloat16)
    optimizer = make_optimizer(model, s, lr=s.lora.learning_rate(s.lr) if s.lora.on else None)
    warmup = s.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)
    prompts = load_prompts(s.data, "train")
    scorer, choices.memory = open_scorer(s, model, tokenizer, prompts, device)
    compute = ComputeModel(sum(p.numel() for p in model.parameters()), s.lora.on, s.gradient_checkpointing,
                           s.ppo_epochs)
    return LocalRun(s, Path(run_dir), device, model, tokenizer, ref_model, optimizer, scheduler,
                    PromptOrder(prompts, s.seed), get_advantage_fn(s.algo.advantage),
                    BoundLoss.named(s.algo.policy_loss, s.algo.policy_loss_params), UpdateSettings.of(s), scorer,
                    compute, choices, tools=tools)


def make_optimizer(model, s: RunSettings, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (``lr``, default ``train.lr``; ``betas``, ``weight_decay``), PyTorch's fused
    kernel where it runs (CPU and CUDA, float32 parameters: one pass over the state instead of a dozen: about
    5x faster for SmolLM2 on 2 CPU cores, docs/performance.md), the same update to float rounding. With LoRA only the
    adapters are trainable, so only they have optimiser state."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=float(s.lr if lr is None else lr), betas=tuple(s.betas), weight_decay=float(s.weight_decay))
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError):  # a device or dtype the fused kernel does not take
        return torch.optim.AdamW(params, **kwargs)


def open_scorer(s: RunSettings, model, tokenizer, prompts: list, device) -> tuple[Scorer, dict]:
    """The run's :class:`core.scoring.Scorer`: the layout ``train.packing`` asks for when the model passes its
    self-test (:func:`core.scoring.choose_layout`), and ``train.micro_batch_tokens`` positions per pass (``auto``: the
    memory plan's largest on this device, at least the longest training prompt plus ``train.max_new_tokens``; null:
    the whole minibatch). Returns it with the memory record (the plan, the layout and its reason, the budget, the
    trainable parameters: :attr:`training.engines.EngineChoices.memory`); with ``train.memory_check`` (``auto``: on a
    GPU) one forward and backward pass of the largest micro-batch is measured against the plan first
    (:func:`check_memory`).

    Raises:
        ValueError: a fixed ``train.micro_batch_tokens`` below the longest sequence (names the key).
    """
    from training.memory_plan import RunShape, auto_budget, device_memory_gb, model_shape, plan_memory

    layout, reason = choose_layout(model, s.packing, s.bf16)
    longest = longest_prompt(tokenizer, prompts, s.chat_template)
    shape = model_shape(s.model)
    n_params = sum(p.numel() for p in model.parameters())
    run = dataclasses.replace(RunShape.of(s), max_prompt_tokens=max(longest, 1),
                              rollout=planned_sampler(s, n_params, device.type == "cuda"))
    given = s.device_memory_gb
    device_gb = given if given is not None else device_memory_gb(device.type)
    budget = s.micro_batch_tokens
    rollout_budget = None if budget is None else int(budget) if budget != "auto" else \
        auto_budget(shape, run, device.type, device_gb, cap=False)  # generation holds its KV cache, nothing more
    if budget == "auto":
        budget = auto_budget(shape, run, device.type, device_gb)
    budget = None if budget is None else max(int(budget), 1)
    if budget is not None and budget < run.sequence_tokens:
        raise ValueError(f"train.micro_batch_tokens={budget}: the longest training prompt ({longest} tokens) and "
                         f"train.max_new_tokens={run.max_new_tokens} need {run.sequence_tokens} positions in one pass; "
                         f"set at least {run.sequence_tokens}, or auto")
    plan = plan_memory(shape, run, budget, device.type, device_gb)
    scorer = Scorer(budget, layout, pad_id=int(tokenizer.pad_token_id or 0)).for_model(model)
    scorer.rollout_budget = rollout_budget  # what a transformers rollout's key/value cache may hold
    trainable, total = trainable_count(model)
    info = {"layout": layout, "layout_reason": reason, "micro_batch_tokens": budget, "rollout_tokens": rollout_budget,
            "longest_prompt": longest,
            "plan": plan.as_dict(),
            # what trains: every parameter, or with LoRA the adapters (their size is what a checkpoint holds)
            "parameters": {"trainable": trainable, "total": total, "lora_rank": s.lora.rank,
                           "adapter_mb": round(trainable * 4 / 2**20, 3) if has_adapters(model) else None}}
    check = s.memory_check
    if budget is not None and (check is True or (check == "auto" and device.type == "cuda")):
        info["calibration"] = check_memory(model, scorer, run, device, plan)
    return scorer, info


def check_memory(model, scorer: Scorer, run, device, plan) -> dict:
    """One forward and backward pass of the largest micro-batch the budget allows (rows of the longest sequence,
    random tokens), its peak memory beside the plan's; gradients dropped after.

    Returns:
        {"measured_peak_gb", "planned_peak_gb"}.
    Raises:
        MemoryError: the pass ran out of memory (one line naming ``train.micro_batch_tokens``).
    """
    from training.step_metrics import peak_memory_gb as peak

    seq = run.sequence_tokens
    rows = max(1, int(scorer.budget) // seq)
    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    p, r = run.max_prompt_tokens, run.max_new_tokens
    prompt_ids = torch.randint(0, vocab, (rows, p), generator=g).to(device)
    response_ids = torch.randint(0, vocab, (rows, r), generator=g).to(device)
    ones_p, ones_r = torch.ones_like(prompt_ids), torch.ones_like(response_ids)
    prompt_ids[1:] = prompt_ids[0]  # one prompt: the tree layout's shared-prompt row at its widest
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        for mb in scorer.plan(prompt_ids, ones_p, ones_r)[:1]:
            lp, _ = scorer.forward(model, mb, Sequences(prompt_ids, ones_p, response_ids, ones_r))
            lp.sum().backward()
    except torch.OutOfMemoryError:
        raise MemoryError(f"train.micro_batch_tokens={scorer.budget}: one pass of {rows} x {seq} tokens ran out of "
                          f"memory on {device} (the plan said {plan.total_gb:.1f} GiB); lower it, or set "
                          "train.gradient_checkpointing=true") from None
    finally:
        model.zero_grad(set_to_none=True)
    measured = peak(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return {"measured_peak_gb": round(measured, 3), "planned_peak_gb": round(plan.total_gb, 3)}


def open_rollout(run: LocalRun, steps_left: int):
    """The run's rollout sampler (:func:`rollout_choice`), holding the policy's current weights; its choice, the
    reason and ``auto``'s estimate go to ``run.choices.rollout`` (the orchestrator tags the run with them)."""
    from core.models import model_path
    from core.sampling import RolloutOptions, build_rollout
    from core.sampling.rollout import calibration_factor

    s, gpu = run.settings, run.device.type == "cuda"
    name, reason, estimate = rollout_choice(s, sum(p.numel() for p in run.model.parameters()), gpu, steps_left)
    run.choices.rollout = RolloutChoice(name, reason, estimate, gpu,
                                        calibration_factor(name, gpu) if estimate is not None else None)
    options = RolloutOptions(dtype=s.rollout_dtype, token_budget=run.scorer.rollout_budget,
                             engine={"gpu_memory_utilization": s.rollout.gpu_memory_utilization}
                             if gpu else cpu_engine_cache(run))
    return build_rollout(name, run.model, run.tokenizer, model_path(s.model), options)


def cpu_engine_cache(run: LocalRun) -> dict:
    """The vLLM CPU engine's key/value cache for this run (``kv_cache_memory_bytes``): ``eval.vllm``'s when the user
    sets it (the engine is the process's, shared with the evaluation), else sized for one generation call of the
    step (prompts x group size sequences of the longest training prompt plus ``train.max_new_tokens``:
    :func:`core.sampling.vllm.kv_cache_bytes`) instead of the fixed 2 GiB; with tool calls (episodes whose length
    the observations set) the fixed reserve."""
    from core.sampling.vllm import CPU_KV_CACHE_BYTES, kv_cache_bytes
    from training.memory_plan import model_shape

    s, ev = run.settings, run.settings.eval_vllm
    if ev.get("kv_cache_memory_bytes") is not None:
        return {"kv_cache_memory_bytes": int(ev.get("kv_cache_memory_bytes"))}
    if run.tools:
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    shape = model_shape(s.model)
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * (4 if s.rollout_dtype == "float32" else 2)
    positions = int(run.choices.memory.get("longest_prompt") or s.max_prompt_tokens) + s.max_new_tokens
    context = int(ev.get("max_model_len") or shape.context or positions)
    return {"kv_cache_memory_bytes": kv_cache_bytes(per_position, s.rows_per_step, positions, context)}
