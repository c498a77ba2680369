"""Local training engine: one process, CPU or one GPU, transformers + plain torch.

The loop is :func:`_train`, top to bottom: :func:`setup` (policy, reference, optimiser, prompts, algorithm, the
scorer's token budget and layout, the rollout sampler), :func:`resume` from a saved state, then per step
:func:`generate` (rollout -> reward -> advantage) and :func:`training.update.update_policy` (``ppo_epochs`` inner
epochs of minibatch updates, each minibatch in micro-batches under ``train.micro_batch_tokens``), the step's metrics
(:func:`training.step_metrics.step_metrics`), state saving; finally a Hugging Face checkpoint. Algorithms enter only
through the registry (``cfg.algo.advantage.name``, ``cfg.algo.policy_loss.name``); this file never branches on an
algorithm's name.

Rollouts come from the run's rollout sampler (``train.rollout.sampler``: transformers ``generate`` on the policy
itself, or the process's vLLM engine, which takes the policy's weights in place after every optimiser step); the
old-policy log-probs are the trainer's own (a forward pass of the policy), and with vLLM the difference to the
sampler's log-probs is logged as the training-inference mismatch and optionally corrected (:mod:`training.mismatch`).

Memory: every teacher-forced pass (old, reference and entropy scoring, the update's forward and backward) holds at
most ``train.micro_batch_tokens`` positions (``auto``: the largest the memory plan fits on the device,
:mod:`training.memory_plan`), in the layout ``train.packing`` chooses and a start-up self-test confirms
(:func:`core.scoring.choose_layout`: responses packed after their shared prompt, no padding).
"""
from __future__ import annotations

import copy
import logging
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
from omegaconf import OmegaConf
from tqdm.auto import trange

from core.lora import LoraSettings, adapter_state, attach, has_adapters, save_adapter, trainable_count
from core.lifecycle import (STOP_REQUESTED, Preempted, StepAborted, abortable, final_checkpoint_dir, save_atomically,
                            step_checkpoint_dir, validation_checkpoint_dir)
from core.models import load_policy
from training.compute import ComputeModel
from core.progress import LineProgress
from core.scoring import Scorer, Sequences, choose_layout
from core.tasks import load_prompts
from training.algorithms import BoundLoss, get_advantage_fn, needs_of
from training.batch import RolloutBatch, StepRollout, concat_batches
from training.engines import EngineChoices, PrecisionChoice, RolloutChoice, register_engine
from training.rewards import informative_rows, overlong_penalty
from training.settings import RunSettings

log = logging.getLogger("rlvr")
from training.collect import RolloutRequest, collect_rollouts
from training.run_state import (STATE_FILE, PromptOrder, RandomStates, has_state, load_state, save_state, state_paths,  # noqa: F401
                                seed_everything)
from training.step_metrics import StepTimes, peak_memory_gb, step_metrics  # noqa: F401
from training.token_probs import ARTIFACT as TOKEN_PROBS, TokenProbs
from training.update import (NONFINITE_TERMS, UpdateControl, UpdateSettings, UpdateStopped,  # noqa: F401
                             policy_objective, update_policy)

__all__ = ["STOP_REQUESTED", "Preempted", "NumericFault", "train", "update_policy", "policy_objective", "UpdateSettings"]


class NumericFault(RuntimeError):
    """``train.max_nonfinite_steps`` steps in a row had a non-finite term (their updates skipped), or the weights
    became non-finite: the run stops, its last saved state finite (the message names the step and the term)."""


def _finite_weights(model) -> bool:
    """Whether every trainable parameter of ``model`` is finite (a state with non-finite weights is never saved)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad)



def _params(node) -> dict:
    """A config node's parameters without its ``name`` key, as a plain dict."""
    d = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    d.pop("name", None)
    return d


register_engine("local")  # no engine.* keys of its own (sweeps/engine/local.yaml: the name only)


def validate(cfg) -> list[str]:
    """Pre-flight of the local engine's own settings (``train.gradient_checkpointing``, ``train.precision``,
    ``train.rollout.*``).

    Raises:
        ValueError: gradient checkpointing asked of a model class that does not support it; a rollout sampler that is
            unknown, not installed or cannot sample a policy; a correction without a sampler that returns its own
            log-probs; overlapped generation without staleness (one line, naming the key).
    """
    from core.models import model_class
    from core.sampling import SAMPLERS, choose_rollout_sampler, resolve_sampler

    warnings = []
    s = RunSettings.of(cfg)
    name, correction = s.rollout.sampler, s.rollout.correction
    if name != "auto":
        try:
            resolve_sampler(name)
            choose_rollout_sampler(name, None)
        except ValueError as e:
            raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None
    k, old_policy = s.rollout.staleness, s.rollout.old_policy
    if old_policy == "behaviour" and correction != "none":
        raise ValueError(f"train.rollout.correction={correction} with train.rollout.old_policy=behaviour: the loss's ratio "
                         "is already pi/b and there is no proximal pass p to correct by p/b; set "
                         "train.rollout.correction=none or train.rollout.old_policy=recompute")
    if correction != "none" and k == 0 and not (name in SAMPLERS and SAMPLERS[name].rollout_logprobs):
        raise ValueError(f"train.rollout.correction={correction}: corrects the mismatch between the trainer and a sampler "
                         f"with log-probs of its own: set train.rollout.sampler to one of "
                         f"{[k for k, v in SAMPLERS.items() if v.rollout_logprobs]} (it is {name}), or "
                         "train.rollout.staleness >= 1 (then it corrects the staleness)")
    if s.rollout.overlap and k == 0:
        raise ValueError("train.rollout.overlap=true with train.rollout.staleness=0: a step's samples come from the "
                         "weights its update changes, so there is nothing to generate during it; set "
                         "train.rollout.staleness >= 1 or train.rollout.overlap=false")
    if k >= 1 and old_policy == "recompute" and correction == "none":
        warnings.append(f"train.rollout.staleness={k} with train.rollout.correction=none: the loss's ratio is pi/p (p: "
                        "the policy at the step's start) and ignores that the samples came from a policy up to "
                        f"{k} steps older; a correction (token_tis, icepop, ...) weighs them by p/b")
    if s.gradient_checkpointing:
        cls = model_class(cfg.model)
        if cls is not None and not getattr(cls, "supports_gradient_checkpointing", False):
            raise ValueError(f"train.gradient_checkpointing=true: model {cfg.model.name!r} ({cls.__name__}) does not "
                             "support gradient checkpointing; set train.gradient_checkpointing=false")
    budget = s.micro_batch_tokens
    if not (budget is None or budget == "auto" or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1)):
        raise ValueError(f"train.micro_batch_tokens={budget!r}: expected auto, null (the whole minibatch in one pass) "
                         "or a number of tokens >= 1")
    if isinstance(budget, int) and not isinstance(budget, bool):
        longest = s.max_prompt_tokens + int(cfg.train.max_new_tokens)
        if budget < int(cfg.train.max_new_tokens) + 1:
            raise ValueError(f"train.micro_batch_tokens={budget}: one pass must hold a whole sequence, prompt and "
                             f"response (train.max_new_tokens={cfg.train.max_new_tokens}); set at least {longest} or auto")
    LoraSettings.of(cfg).check()
    check = s.memory_check
    if check not in ("auto", True, False):
        raise ValueError(f"train.memory_check={check!r}: expected auto, true or false")
    from core.precision import choose, native_bf16, phrase, probe_slowdown
    from training.memory_plan import resolve_device

    device = resolve_device(cfg)  # (emulated bf16 is refused by the orchestrator's pre-flight, not warned about)
    if device == "cpu" and choose(s.precision, device).bf16 and native_bf16(device)[0]:
        ratio = probe_slowdown("cpu")  # what bf16 costs or saves on this machine, measured now (not a fixed claim)
        warnings.append(f"train.precision={cfg.train.precision}: bf16 on this CPU (a probe just now: {phrase(ratio)}); "
                        "bf16's log-probabilities are coarse "
                        "(ratios are exact on the first minibatch, not after updates)")
    return warnings


def memory_plan(cfg, remote: bool = False):
    """The run's memory plan as pre-flight sees it (:func:`training.memory_plan.plan_for`), and the one-line
    refusal when it does not fit its device (None when it fits or the device's size is unknown).

    Args:
        remote: the run trains on another machine (a cluster launcher): its device's size is
            ``train.device_memory_gb`` when set, else unknown (nothing refused here; the job checks on its node).
    Raises:
        ValueError: the model's shape is not known here (names ``model.path``).
    """
    from training.memory_plan import plan_for, refusal

    if remote:  # a cluster node: a GPU unless train.device says cpu; its size only when train.device_memory_gb says
        device = "cpu" if str(cfg.train.device) == "cpu" else "cuda"
        plan = plan_for(cfg, device=device, detect=False)
        return plan, refusal(plan)
    plan = plan_for(cfg, longest_prompt=_preflight_longest_prompt(cfg))
    return plan, refusal(plan)


def _preflight_longest_prompt(cfg) -> int | None:
    """The longest training prompt in tokens, as the run will measure it (:func:`_longest_prompt`), when the
    tokenizer is on this machine and the prompts load here; else None (the plan then bounds it by
    ``train.max_prompt_tokens``). Cached per model, data and template: a sweep's points share it."""
    import json as _json

    from omegaconf import OmegaConf

    try:
        key = (_json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True, default=str),
               _json.dumps(OmegaConf.to_container(cfg.data, resolve=True), sort_keys=True, default=str))
    except Exception:
        return None
    return _longest_cached(key, cfg)


_LONGEST: dict = {}


def _longest_cached(key, cfg) -> int | None:
    if key not in _LONGEST:
        try:
            from core.models import load_tokenizer
            from core.tasks import load_prompts

            tokenizer = load_tokenizer(cfg.model)
            _LONGEST[key] = _longest_prompt(tokenizer, load_prompts(cfg.data, "train"),
                                            bool(cfg.model.chat_template)) or None
        except Exception:  # a hub model not cached here, data elsewhere: the plan keeps its upper bound
            _LONGEST[key] = None
    return _LONGEST[key]


def train(cfg, run_dir, log_metrics: Callable[[dict, int], None] = lambda m, s: None, logged_through: int = -1,
          choices: EngineChoices | None = None) -> Path:
    """Train a policy with ``cfg.algo`` on ``cfg.data`` and save a Hugging Face checkpoint.

    Args:
        cfg: the composed run config (``model``, ``data``, ``algo``, ``train``, ``seed``).
        run_dir: directory for this run's files; the checkpoint goes to ``run_dir/checkpoint``.
        log_metrics: ``fn(metrics: dict[str, float], step: int)``, called once per step.
        logged_through: the last step whose metrics the tracker already holds (resume: saved metrics of
            later steps are logged again, earlier ones are not, so every step is logged exactly once).
        choices: filled as the run decides (:class:`training.engines.EngineChoices`): the precision and why, the
            memory plan and scoring layout, the rollout sampler and why, the measured sampling time and peak memory.
    Returns:
        Path of the final checkpoint (``run_dir/checkpoint``). With ``train.save_every = N > 0`` the policy
        after every N-th step is also kept, in ``run_dir/checkpoints/step_<steps done>``
        (:func:`core.lifecycle.saved_checkpoints`).
    Raises:
        Preempted: :data:`STOP_REQUESTED` was set; the full state was saved first: during the update, after the
            running optimiser step, with the step's rollout and the update so far (:class:`InFlight`: the resumed run
            finishes the step from there, as if never stopped); after the update, at the end of the running step;
            or, when the request came during the step's generation and scoring (:func:`core.lifecycle.abortable`),
            at once, as the last completed step's state with the prompt order and random states of the stopped
            step's start, so that the resumed run redoes that step exactly.
        MemoryError: the start-up check found that the largest micro-batch does not fit the device (one line naming
            ``train.micro_batch_tokens``).

    Resumable: with ``train.checkpoint_every = N > 0`` the full state (policy, optimiser, scheduler, step,
    RNG states, prompt order, metrics not yet logged) is saved to ``run_dir/state`` every N steps and
    when a stop is requested; a later call with the same ``run_dir`` continues from the saved step and
    reproduces the uninterrupted run. Metrics are handed to ``log_metrics`` right after each save.

    Tasks that declare tools (``Task.tools``: question answering with search) roll out multi-turn episodes
    (:func:`core.agent.generate_with_tools`, ``tools.max_turns``, ``tools.max_obs_tokens``); the tools are opened
    for the run (a retrieval server started when ``tools.search.url`` is not set) and closed when it ends.
    """
    from core.tools import close_tools, open_tools_for

    choices = EngineChoices() if choices is None else choices
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    cfg = resolve_precision(cfg, choices)
    if RunSettings.of(cfg).memory_check is not False:  # on the training machine, before any weight loads
        plan, refused = memory_plan(cfg)
        if refused:
            raise MemoryError(refused)
    tools = open_tools_for(load_prompts(cfg.data, "train"), cfg.get("tools"))
    try:
        return _train(setup(cfg, Path(run_dir), tools, choices), log_metrics, logged_through)
    finally:
        close_tools(tools)


def resolve_precision(cfg, choices: EngineChoices):
    """``cfg`` with ``train.precision`` as it resolves on the device this run trains on (``auto``: bf16 where the
    device computes it natively, :func:`core.precision.choose`); the choice, its reason and the rollout engine's dtype
    go to ``choices.precision``."""
    from core.precision import choose
    from training.memory_plan import resolve_device

    device = resolve_device(cfg)
    choice = choose(str(cfg.train.precision), device)
    cfg = OmegaConf.merge(cfg, {"train": {"precision": choice.precision}})
    choices.precision = PrecisionChoice(choice.precision, choice.reason, device,
                                        _rollout_dtype(RunSettings.of(cfg), torch.device(device)))
    return cfg


@dataclass
class LocalRun:
    """Everything a local run's steps use (:func:`setup`)."""

    cfg: object
    run_dir: Path
    device: torch.device
    model: object
    tokenizer: object
    ref_model: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    prompts: PromptOrder
    adv_fn: Callable
    adv_params: dict
    loss: BoundLoss  # the policy loss bound to algo.policy_loss's parameters
    settings: UpdateSettings
    scorer: Scorer
    config: RunSettings  # the run's train.* settings, typed once (training/settings.py)
    choices: EngineChoices = field(default_factory=EngineChoices)  # what the run chose, for the orchestrator
    rollout: object = None
    tools: dict = field(default_factory=dict)
    token_probs: TokenProbs = field(default_factory=TokenProbs)
    pending: list = field(default_factory=list)  # (step, metrics) saved with the state but not yet logged
    inflight: "InFlight | None" = None  # a step whose update a stop interrupted (resume finishes it)
    queue: dict = field(default_factory=dict)  # step -> StepRollout generated ahead for it (train.rollout.staleness)
    ahead: "Ahead | None" = None  # train.rollout.overlap: the generation running during an update
    compute: ComputeModel | None = None  # the step's estimated FLOPs (training/compute.py)

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)


def setup(cfg, run_dir: Path, tools: dict, choices: EngineChoices | None = None) -> LocalRun:
    """The run's policy (on the device, gradient checkpointing as configured; with ``train.lora.rank > 0`` LoRA
    adapters on the frozen base, :mod:`core.lora`), the reference policy when a KL term reads it (a frozen copy; with
    LoRA the same model with its adapters disabled, no copy), AdamW over what trains with its warm-up schedule, the
    prompt order, the algorithm's functions, the update's settings and the scorer (:func:`open_scorer`: the token
    budget and the packed layout, checked on the model)."""
    t_cfg, algo, conf = cfg.train, cfg.algo, RunSettings.of(cfg)
    choices = EngineChoices() if choices is None else choices
    seed_everything(int(cfg.seed))
    device = torch.device("cuda" if torch.cuda.is_available() and conf.device != "cpu" else "cpu")
    model, tokenizer = load_policy(cfg.model)
    lora = LoraSettings.of(cfg)
    if lora.on:  # only the adapters train (B = 0: the policy starts as the base)
        attach(model, lora)
    model.to(device).train()
    if conf.gradient_checkpointing:  # activations recomputed in the backward pass
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ref_model = None
    if conf.terms.kl_beta > 0 or "ref_logprobs" in needs_of("policy_loss", algo.policy_loss.name,
                                                                         _params(algo.policy_loss)):
        if lora.on:  # the base itself: core.lora.reference disables the adapters while it scores
            ref_model = model
        else:  # a reference copy only when a KL term is used (in bf16 with train.precision=bf16: it is never trained)
            ref_model = copy.deepcopy(model).eval().requires_grad_(False)
            if conf.bf16:
                ref_model.to(torch.bfloat16)
    optimizer = make_optimizer(model, t_cfg, lr=lora.learning_rate(t_cfg.lr) if lora.on else None)
    warmup = conf.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    prompts = load_prompts(cfg.data, "train")
    adv_params = _params(algo.advantage)
    # old log-probs scored inside the update, minibatch by minibatch (the first from its own forward pass), unless
    # the advantage estimator reads them or dynamic sampling keeps a subset of the sampled rows
    # (with staleness or the behaviour policy's ratio, the rollout's own pass is the behaviour policy's: kept)
    defer_old = ("old_logprobs" not in needs_of("advantage", algo.advantage.name, adv_params)
                 and not conf.dynamic.enabled and not _off_policy(conf))
    scorer, choices.memory = open_scorer(cfg, model, tokenizer, prompts, device)
    settings = UpdateSettings.from_config(cfg, defer_old)
    if _proximal_in_update(conf, "old_logprobs" in needs_of("advantage", algo.advantage.name, adv_params)):
        settings = replace(settings, align_old=True)  # p: the update's own passes before its first optimiser step
    compute = ComputeModel(sum(p.numel() for p in model.parameters()), lora.on, conf.gradient_checkpointing,
                           int(t_cfg.ppo_epochs))
    return LocalRun(cfg, Path(run_dir), device, model, tokenizer, ref_model, optimizer, scheduler,
                    PromptOrder(prompts, int(cfg.seed)), get_advantage_fn(algo.advantage.name), adv_params,
                    BoundLoss.named(algo.policy_loss.name, _params(algo.policy_loss)),
                    settings, scorer, conf, choices, tools=tools, compute=compute)


def _proximal_in_update(conf: RunSettings, estimator_reads_old: bool) -> bool:
    """Whether a stale rollout's proximal log-probs p come from the update's own passes before its first optimiser
    step (the aligned path of :func:`training.update.update_policy`, free for the first minibatch), rather than a
    scoring pass when the step starts (:func:`_consume`): with staleness under ``recompute``, unless the estimator
    reads the old log-probs (it needs p before the update)."""
    return conf.rollout.staleness > 0 and conf.rollout.old_policy == "recompute" and not estimator_reads_old


def make_optimizer(model, t_cfg, lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (``lr``, default ``train.lr``; ``betas``, ``weight_decay``), PyTorch's fused
    kernel where it runs (CPU and CUDA, float32 parameters: one pass over the state instead of a dozen; 0.10 s against
    0.51 s per step for SmolLM2 on 2 CPU cores, 2026-12-05), the same update to float rounding. With LoRA only the
    adapters are trainable, so only they have optimiser state."""
    params = [p for p in model.parameters() if p.requires_grad]
    kwargs = dict(lr=float(t_cfg.lr if lr is None else lr), betas=tuple(t_cfg.betas), weight_decay=float(t_cfg.weight_decay))
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError, TypeError):  # a device or dtype the fused kernel does not take
        return torch.optim.AdamW(params, **kwargs)


def open_scorer(cfg, model, tokenizer, prompts: list, device) -> tuple[Scorer, dict]:
    """The run's :class:`core.scoring.Scorer`: the layout ``train.packing`` asks for when the model passes its
    self-test (:func:`core.scoring.choose_layout`), and ``train.micro_batch_tokens`` positions per pass (``auto``: the
    memory plan's largest on this device, at least the longest training prompt plus ``train.max_new_tokens``; null:
    the whole minibatch). Returns it with the memory record (the plan, the layout and its reason, the budget, the
    trainable parameters: :attr:`training.engines.EngineChoices.memory`); with
    ``train.memory_check`` (``auto``: on a GPU) one forward and backward pass of the largest micro-batch is measured
    against the plan first (:func:`check_memory`)."""
    from training.memory_plan import RunShape, auto_budget, device_memory_gb, model_shape, plan_memory

    conf = RunSettings.of(cfg)
    layout, reason = choose_layout(model, conf.packing, conf.bf16)
    longest_prompt = _longest_prompt(tokenizer, prompts, conf.chat_template)
    shape, run = model_shape(cfg.model), RunShape.of(cfg, device.type)
    import dataclasses

    run = dataclasses.replace(run, max_prompt_tokens=max(longest_prompt, 1))
    given = conf.device_memory_gb
    device_gb = given if given is not None else device_memory_gb(device.type)
    budget = conf.micro_batch_tokens
    rollout_budget = None if budget is None else int(budget) if budget != "auto" else \
        auto_budget(shape, run, device.type, device_gb, cap=False)  # generation holds its KV cache, nothing more
    if budget == "auto":
        budget = auto_budget(shape, run, device.type, device_gb)
    budget = None if budget is None else max(int(budget), 1)
    if budget is not None and budget < run.sequence_tokens:
        raise ValueError(f"train.micro_batch_tokens={budget}: the longest training prompt ({longest_prompt} tokens) and "
                         f"train.max_new_tokens={run.max_new_tokens} need {run.sequence_tokens} positions in one pass; "
                         f"set at least {run.sequence_tokens}, or auto")
    plan = plan_memory(shape, run, budget, device.type, device_gb)
    scorer = Scorer(budget, layout, pad_id=int(tokenizer.pad_token_id or 0)).for_model(model)
    scorer.rollout_budget = rollout_budget  # what a transformers rollout's key/value cache may hold
    trainable, total = trainable_count(model)
    info = {"layout": layout, "layout_reason": reason, "micro_batch_tokens": budget, "rollout_tokens": rollout_budget,
            "longest_prompt": longest_prompt,
            "plan": plan.as_dict(),
            # what trains: every parameter, or with LoRA the adapters (their size is what a checkpoint holds)
            "parameters": {"trainable": trainable, "total": total, "lora_rank": LoraSettings.of(cfg).rank,
                           "adapter_mb": round(trainable * 4 / 2**20, 3) if has_adapters(model) else None}}
    check = conf.memory_check
    if budget is not None and (check is True or (check == "auto" and device.type == "cuda")):
        info["calibration"] = check_memory(model, scorer, run, device, plan)
    return scorer, info


def _longest_prompt(tokenizer, prompts: list, chat: bool) -> int:
    """Tokens of the longest training prompt as the model sees it (chat template and a task's prefill included)."""
    from core.sampling import prompt_texts

    if not prompts:
        return 0
    texts = prompt_texts(tokenizer, [r["prompt"] for r in prompts], chat)
    texts = [x + r.get("response_prefix", "") for x, r in zip(texts, prompts)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return max(len(x) for x in ids)


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


def resume(run: LocalRun, log_metrics, logged_through: int) -> int:
    """Continue from ``run_dir``'s saved state, if any: weights, optimiser, scheduler, prompt order, random states,
    token counts; the saved metrics of steps after ``logged_through`` are logged. Returns the first step to run."""
    if not has_state(run.run_dir):
        return 0
    st = load_state(run.run_dir, run.device)
    if has_adapters(run.model):  # the state holds the adapters only; the frozen base is loaded from its source
        missing, unexpected = run.model.load_state_dict(st["model"], strict=False)
        lost = [k for k in missing if "lora_" in k]
        if unexpected or lost:
            raise RuntimeError(f"{run.run_dir}: the saved state does not match this run's adapters (train.lora): "
                               f"unexpected {unexpected[:3]}, missing {lost[:3]}")
    else:
        run.model.load_state_dict(st["model"])
    run.optimizer.load_state_dict(st["optimizer"])
    run.scheduler.load_state_dict(st["scheduler"])
    run.prompts.load_state_dict(st)
    RandomStates.from_state_dict(st).restore()
    if "token_probs" in st:
        run.token_probs.load_state_dict(st["token_probs"])
    if st.get("inflight"):
        run.inflight = InFlight.from_state_dict(st["inflight"])
    run.queue = {int(s_): rollout_from_state(d) for s_, d in (st.get("queue") or {}).items()}
    for s_, m_ in st["pending"]:
        if s_ > logged_through:
            log_metrics(m_, s_)
    return int(st["step"]) + 1


def save(run: LocalRun, step: int, inflight: "InFlight | None" = None) -> Path:
    """The full state after ``step`` (atomically: a kill mid-save leaves the previous one); with LoRA the adapters,
    not the frozen base. ``inflight``: step ``step + 1``'s rollout and the part of its update already done (a stop
    inside the update), which the resumed run finishes.

    Raises:
        NumericFault: a trainable weight is not finite (the previous state is kept)."""
    if not _finite_weights(run.model):
        raise NumericFault(f"step {step}: the policy's weights are not finite; the state is not saved (the last saved "
                           f"state in {run.run_dir / STATE_FILE} is kept)")
    return save_state(run.run_dir, {
        "model": adapter_state(run.model) if has_adapters(run.model) else run.model.state_dict(), "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        **run.prompts.state_dict(), **RandomStates.capture().state_dict(), "step": step, "pending": run.pending,
        "token_probs": run.token_probs.state_dict(), "inflight": inflight.state_dict() if inflight else None,
        "queue": {int(s_): rollout_state(ro) for s_, ro in run.queue.items()}})


@dataclass
class InFlight:
    """A step stopped inside its update: its rollout (``ro``) and the ``done`` optimiser steps taken, with their
    ``metrics``. Saved with the state (tensors, numbers and strings only), so the resumed run finishes the step on the
    same samples from the same point, as if it had never stopped."""

    step: int
    ro: StepRollout
    done: int
    metrics: list

    def state_dict(self) -> dict:
        return {"step": self.step, "done": self.done, "metrics": self.metrics, **rollout_state(self.ro)}

    @classmethod
    def from_state_dict(cls, d: dict) -> "InFlight":
        return cls(int(d["step"]), rollout_from_state(d), int(d["done"]), list(d["metrics"]))


def rollout_state(ro: StepRollout) -> dict:
    """A step's rollout as tensors, numbers and strings (a saved state: :class:`InFlight`, the staleness queue)."""
    return {"batch": ro.batch.state_dict(), "sampled": [b.state_dict() for b in ro.sampled],
            "advantages": ro.advantages, "adv_metrics": dict(ro.adv_metrics), "rounds": ro.rounds,
            "phases": dict(ro.phases), "seconds": ro.seconds, "version": ro.version, "generated": dict(ro.generated)}


def rollout_from_state(d: dict) -> StepRollout:
    """The rollout :func:`rollout_state` gave (a state saved before the queue existed has no version: 0)."""
    return StepRollout(RolloutBatch.from_state_dict(d["batch"]), [RolloutBatch.from_state_dict(b) for b in d["sampled"]],
                       d["advantages"], dict(d["adv_metrics"]), int(d["rounds"]), dict(d["phases"]),
                       float(d["seconds"]), int(d.get("version", 0)), dict(d.get("generated") or {}))


def _off_policy(conf: RunSettings) -> bool:
    """Whether a step's samples may come from another policy than the one the step starts from, or the loss divides
    by the generating policy's log-probs: then the rollout keeps the behaviour log-probs ``b``
    (``extras["behaviour_logprobs"]``) and measures the engine-vs-trainer mismatch when it generates."""
    return conf.rollout.staleness > 0 or conf.rollout.old_policy == "behaviour"


@dataclass(frozen=True)
class GenerationSide:
    """What a generation samples and scores with: the policy (its trainer pass gives the old, or behaviour,
    log-probs), the rollout sampler and the reference policy. The run's own (:func:`generate`'s default), or a copy of
    the weights for a generation that runs during an update (:class:`Ahead`)."""

    model: object
    rollout: object
    ref_model: object


def generate(run: LocalRun, step: int, version: int | None = None, side: GenerationSide | None = None) -> StepRollout:
    """One step's generation, scoring and advantages: G responses per prompt from the current (old) policy, with
    old log-probs (unless the update fills them); rewards from the verifier (+ DAPO's overlong shaping); with dynamic
    sampling, groups that are all correct or all wrong are dropped and new prompts sampled, for at most
    max_num_gen_batches rounds. Changes no weight, so a stop request may end it at once
    (core.lifecycle.abortable).

    ``version``: the policy version generating (default ``step``: on-policy), tagged on every sample
    (``batch.policy_version``). Off-policy (:func:`_off_policy`): the behaviour log-probs ``b`` (the sampler's own,
    else the trainer's pass on the generating weights, which for the transformers sampler is the sampler itself) go to
    ``extras["behaviour_logprobs"]``, the engine-vs-trainer mismatch is measured now (same weights on both sides:
    ``ro.generated``), and with ``train.rollout.old_policy=behaviour`` the old log-probs are ``b`` before the
    estimator reads them. ``side``: the policy, sampler and reference it generates with (default: the run's)."""
    side = side or GenerationSide(run.model, run.rollout, run.ref_model)
    cfg, t_cfg, dyn, overlong = run.cfg, run.cfg.train, run.config.dynamic, run.config.overlong
    G, n_prompts, max_new = int(t_cfg.group_size), int(t_cfg.prompts_per_step), int(t_cfg.max_new_tokens)
    request = RolloutRequest(G, float(t_cfg.temperature), float(t_cfg.top_p), max_new, 0,
                             chat_template=run.config.chat_template, bf16=run.settings.bf16,
                             old_logprobs=not run.settings.deferred_old, tools=run.tools, tools_cfg=cfg.get("tools"))
    t0 = time.perf_counter()
    kept, sampled, n_kept, rounds, phases = [], [], 0, 0, {}
    while True:
        batch, _texts = collect_rollouts(
            side.model, run.tokenizer, run.prompts.next_rows(n_prompts),
            replace(request, seed=run.seed * 1_000_003 + step * 1_009 + rounds), ref_model=side.ref_model,
            timings=phases, rollout=side.rollout, scorer=run.scorer)
        rounds += 1
        if overlong.enabled:
            batch.rewards = batch.rewards + overlong_penalty(
                batch.response_lengths, max_new, overlong.buffer_length(max_new), float(overlong.penalty_factor))
        sampled.append(batch)
        if not dyn.enabled:
            kept = [batch]
            break
        keep_rows = informative_rows(batch.correct, batch.group_index)   # 0 < #correct < G (DAPO eq. 11)
        if keep_rows.any():
            kept.append(batch.select(torch.nonzero(keep_rows).squeeze(-1)))
            n_kept += len(torch.unique(batch.group_index[keep_rows]))
        if n_kept >= n_prompts or rounds >= dyn.rounds:
            break
    if not kept:  # dynamic sampling found no informative group: nothing to learn from this step
        kept = [batch.select(torch.arange(0))]
    batch = concat_batches(kept, run.tokenizer.pad_token_id)
    if dyn.enabled and batch.batch_size > n_prompts * G:
        batch = batch.select(torch.arange(n_prompts * G))
    batch = batch.to(run.device)
    batch.policy_version = torch.full((batch.batch_size,), step if version is None else version, dtype=torch.long,
                                      device=run.device)
    generated = _behaviour(run, batch) if _off_policy(run.config) else {}
    if batch.batch_size == 0:
        advantages, adv_metrics = torch.zeros(0, device=run.device), {}
    else:  # the registered estimator; rewards come from the verifier in collect_rollouts
        advantages, adv_metrics = run.adv_fn(batch, **run.adv_params)
        advantages = advantages.to(run.device)
    return StepRollout(batch, sampled, advantages, adv_metrics, rounds if dyn.enabled else 0, phases,
                       time.perf_counter() - t0, step if version is None else version, generated)


def _behaviour(run: LocalRun, batch) -> dict:
    """Off-policy bookkeeping of a freshly generated ``batch`` (in place; :func:`generate`): the behaviour log-probs
    into ``extras["behaviour_logprobs"]`` (the sampler's own, which leave ``rollout_logprobs``, or the trainer's pass
    on the generating weights), the old log-probs set to them under ``old_policy=behaviour``. Returns the
    engine-vs-trainer mismatch on the generating weights (:func:`training.mismatch.mismatch_metrics`; {} without the
    sampler's own log-probs), which the step logs instead of a gap that would include the intended staleness."""
    from training.mismatch import mismatch_metrics

    own = batch.extras.pop("rollout_logprobs", None)
    out = {}
    if own is not None and batch.batch_size:
        out = mismatch_metrics(batch.old_logprobs, own, batch.response_mask)
    b = own if own is not None else batch.old_logprobs.clone()
    batch.extras["behaviour_logprobs"] = b
    if run.config.rollout.old_policy == "behaviour":
        batch.old_logprobs = b.to(batch.old_logprobs.dtype).clone()
    return out


class Ahead:
    """``train.rollout.overlap`` (k >= 1): step t+k's rollout generated in a background thread while step t's update
    runs, by policy version t as in the emulation: a copy of the weights the step starts from (refreshed at each
    start; its pass gives the behaviour log-probs and the mismatch, and with transformers it is the sampler), vLLM's
    engine holding them already (synced after step t-1; the sync after step t waits for this generation). The same
    prompts, seeds and order as the emulation (the update draws no prompt and nothing from the global random
    generator), so the same numbers; memory: one more copy of the weights (the memory plan's ``rollout_held``).

    A stop during the update waits for the generation to finish and saves its rollout with the queue (the weights
    that generated it exist no more once the update has moved on)."""

    def __init__(self, run: LocalRun):
        from core.sampling import HFRollout

        self.copy = copy.deepcopy(run.model).requires_grad_(False)
        rollout = run.rollout if run.rollout.name != "hf" else HFRollout(self.copy, run.tokenizer,
                                                                         run.rollout.token_budget)
        self.side = GenerationSide(self.copy, rollout, self.copy if run.ref_model is run.model else run.ref_model)
        self.thread: threading.Thread | None = None
        self.result: tuple = ()
        self.waited = 0.0  # seconds the last update waited for the generation (logged: train/overlap_wait_s)

    def start(self, run: LocalRun, step: int) -> bool:
        """Start generating step ``step + k``'s rollout (when the run has that step and it is not queued) with the
        weights the step starts from. Returns whether it started."""
        target = step + run.config.rollout.staleness
        if target >= int(run.cfg.train.steps) or target in run.queue:
            return False
        with torch.no_grad():
            for mine, theirs in zip(self.copy.state_dict().values(), run.model.state_dict().values()):
                mine.copy_(theirs)
        stream = None
        if run.device.type == "cuda":  # its own CUDA stream (on the update's, the two would run in turn), after the copy
            stream = torch.cuda.Stream(run.device)
            stream.wait_stream(torch.cuda.current_stream(run.device))

        def work():
            try:
                if stream is None:
                    ro = generate(run, target, version=step, side=self.side)
                else:
                    with torch.cuda.stream(stream):
                        ro = generate(run, target, version=step, side=self.side)
                    stream.synchronize()  # its tensors complete before the training thread reads them
                self.result = (target, ro)
            except BaseException as e:  # raised in the training thread by join()
                self.result = (target, e)

        self.thread = threading.Thread(target=work, name=f"rollout-step-{target}", daemon=True)
        self.thread.start()
        return True

    def join(self, run: LocalRun) -> None:
        """Wait for the generation started (if any) and queue its rollout; ``waited``: the seconds waited.

        Raises:
            Exception: what the generation raised.
        """
        t0 = time.perf_counter()
        if self.thread is not None:
            self.thread.join()
            self.thread = None
            target, out = self.result
            self.result = ()
            if isinstance(out, BaseException):
                raise out
            run.queue[target] = out
        self.waited = time.perf_counter() - t0


def _consume(run: LocalRun, ro: StepRollout, step: int) -> StepRollout:
    """The rollout step ``step`` trains on, generated by policy version ``ro.version``. Under
    ``train.rollout.old_policy=recompute`` its old log-probs become the proximal ones ``p`` (the trainer's pass with
    the weights the step starts from): the update computes them itself before its first optimiser step
    (:func:`_proximal_in_update`), or, when the estimator reads them, a scoring pass here gives them to a copy of the
    rollout with the estimator's advantages again (``ro`` itself is left as it was: a stop may keep it queued). Under
    ``behaviour`` (ratio pi/b) and for a fresh rollout, ``ro`` as it is."""
    if (run.config.rollout.old_policy != "recompute" or ro.version >= step or not ro.batch.batch_size
            or "old_logprobs" not in needs_of("advantage", run.cfg.algo.advantage.name, run.adv_params)):
        return ro  # (recompute, stale, an estimator that does not read them: the update's passes give p)
    t0 = time.perf_counter()
    b = ro.batch
    with torch.no_grad():
        p, _ = run.scorer.score(run.model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                float(run.cfg.train.temperature), with_entropy=False, bf16=run.settings.bf16)
    batch = replace(b, old_logprobs=p.to(b.old_logprobs.dtype), extras=dict(b.extras))
    advantages, adv_metrics = run.adv_fn(batch, **run.adv_params)
    phases = dict(ro.phases)
    phases["logprob_s"] = phases.get("logprob_s", 0.0) + time.perf_counter() - t0
    return replace(ro, batch=batch, advantages=advantages.to(run.device), adv_metrics=adv_metrics, phases=phases)


def _open_rollout(run: LocalRun, steps_left: int):
    """The run's rollout sampler (:func:`rollout_choice`), holding the policy's current weights; its choice, the
    reason and ``auto``'s estimate go to ``run.choices.rollout`` (the orchestrator tags the run with them)."""
    from core.models import model_path
    from core.sampling import RolloutOptions, build_rollout
    from core.sampling.rollout import calibration_factor

    gpu = run.device.type == "cuda"
    name, reason, estimate = rollout_choice(run.cfg, sum(p.numel() for p in run.model.parameters()), gpu, steps_left)
    run.choices.rollout = RolloutChoice(name, reason, estimate, gpu,
                                        calibration_factor(name, gpu) if estimate is not None else None)
    dtype = _rollout_dtype(run.config, run.device)
    options = RolloutOptions(dtype=dtype, token_budget=run.scorer.rollout_budget,
                             engine={"gpu_memory_utilization": run.config.rollout.gpu_memory_utilization}
                             if gpu else _cpu_engine_cache(run, dtype))
    return build_rollout(name, run.model, run.tokenizer, model_path(run.cfg.model), options)


def _cpu_engine_cache(run: LocalRun, dtype: str) -> dict:
    """The vLLM CPU engine's key/value cache for this run (``kv_cache_memory_bytes``): ``eval.vllm``'s when the user
    sets it (the engine is the process's, shared with the evaluation), else sized for one generation call of the
    step (prompts x group size sequences of the longest training prompt plus ``train.max_new_tokens``:
    :func:`core.sampling.vllm.kv_cache_bytes`) instead of the fixed 2 GiB; with tool calls (episodes whose length
    the observations set) the fixed reserve."""
    from core.sampling.vllm import CPU_KV_CACHE_BYTES, kv_cache_bytes
    from training.memory_plan import model_shape

    ev = OmegaConf.select(run.cfg, "eval.vllm") or {}
    if ev.get("kv_cache_memory_bytes") is not None:
        return {"kv_cache_memory_bytes": int(ev.get("kv_cache_memory_bytes"))}
    if run.tools:
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    t, shape = run.cfg.train, model_shape(run.cfg.model)
    per_position = 2 * shape.layers * shape.kv_heads * shape.head_dim * (4 if dtype == "float32" else 2)
    positions = int(run.choices.memory.get("longest_prompt") or run.config.max_prompt_tokens) + int(t.max_new_tokens)
    context = int(ev.get("max_model_len") or shape.context or positions)
    return {"kv_cache_memory_bytes": kv_cache_bytes(per_position, int(t.prompts_per_step) * int(t.group_size),
                                                    positions, context)}


def _rollout_dtype(conf: RunSettings, device) -> str:
    """``train.rollout.dtype``: ``auto`` is the precision the trainer computes in (``train.precision`` on ``device``:
    float32, or bfloat16 with bf16): the least training-inference mismatch."""
    from core.precision import choose

    if conf.rollout.dtype != "auto":
        return conf.rollout.dtype
    return choose(conf.precision, torch.device(device).type).dtype


def rollout_choice(cfg, n_params: int, gpu: bool, steps: int | None = None) -> tuple[str, str, float | None]:
    """The rollout sampler a run uses, why (``train.rollout.sampler``; ``auto``: the lowest estimated sampling time
    for the run's size, :func:`core.sampling.choose_rollout_sampler`) and, for ``auto``, the chosen sampler's
    estimated sampling time in seconds (None when asked for by name).

    Raises:
        ValueError: naming ``train.rollout.sampler`` (unknown, or not installed here).
    """
    from core.models import model_path
    from core.sampling import RolloutPlan, choose_rollout_sampler, vllm_engine_defaults
    from core.sampling.rollout import rollout_estimate_s

    t, conf = cfg.train, RunSettings.of(cfg)
    ready = False
    try:  # a vLLM engine of this process that would serve the run needs no start
        from core import vllm_engine

        engine = vllm_engine.current_engine()
        if engine is not None:
            kwargs = {**vllm_engine_defaults(gpu), **({"gpu_memory_utilization": conf.rollout.gpu_memory_utilization}
                                                      if gpu else {})}
            ready = vllm_engine.serves(engine, model_path(cfg.model), _rollout_dtype(conf, torch.device(
                "cuda" if gpu else "cpu")), kwargs, any_cache=True)  # (a cache of another size: still no start)
    except (ImportError, OSError):
        ready = False
    plan = RolloutPlan(steps=int(steps if steps is not None else t.steps),
                       sequences=int(t.prompts_per_step) * int(t.group_size) * conf.dynamic.rounds,
                       max_new_tokens=int(t.max_new_tokens), n_params=int(n_params), gpu=bool(gpu), engine_ready=ready)
    try:
        name, reason = choose_rollout_sampler(conf.rollout.sampler, plan)
    except ValueError as e:
        raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None
    return name, reason, (rollout_estimate_s(name, plan) if conf.rollout.sampler == "auto" else None)


def _train(run: LocalRun, log_metrics, logged_through: int) -> Path:
    """The run's life after :func:`setup`: resume, then each step's rollout (:func:`_rollout_step`), update
    (:func:`_update_step`), metrics (:func:`_step_metrics`), kept policy and saved state; the final checkpoint."""
    cfg = run.cfg
    start_step = resume(run, log_metrics, logged_through)
    n_steps, every, save_every = int(cfg.train.steps), run.config.checkpoint_every, run.config.save_every
    validate_every = run.config.validate_every
    t_open = time.perf_counter()
    run.rollout = _open_rollout(run, n_steps - start_step)
    run.ahead = Ahead(run) if run.config.rollout.overlap and run.config.rollout.staleness else None
    sampled_s = time.perf_counter() - t_open  # the sampler's start (vLLM's engine), then each step's generation

    def save_hf(path: Path) -> None:
        if has_adapters(run.model):  # peft's adapter format, naming the base folder it loads on
            from core.models import model_path

            save_adapter(run.model, run.tokenizer, path, model_path(cfg.model))
            return
        run.model.save_pretrained(path)
        run.tokenizer.save_pretrained(path)

    def flush() -> None:
        for s_, m_ in run.pending:
            log_metrics(m_, s_)
        run.pending.clear()

    from training.mismatch import SyncGuard

    guard = SyncGuard(float32=_rollout_dtype(run.config, run.device) == "float32" and not run.settings.bf16)
    max_faulty, faulty = run.config.max_nonfinite_steps, 0  # steps in a row with a skipped update
    lines = LineProgress(f"train {cfg.algo.name}", n_steps, start_step)
    for step in trange(start_step, n_steps, initial=start_step, total=n_steps, desc=f"train {cfg.algo.name}",
                       unit="step", disable=None):
        t_step = time.perf_counter()
        inflight, run.inflight = run.inflight, None
        if inflight is not None and inflight.step != step:
            inflight = None
        ro = inflight.ro if inflight is not None else _rollout_step(run, step, flush)
        update_metrics, times = _update_step(run, ro, step, inflight, flush, t_step)
        metrics = _step_metrics(run, ro, step, update_metrics, times, guard)
        sampled_s += float(metrics.get("generate_time_s") or 0.0)
        lines.update(step + 1, reward=metrics["reward_mean"], accuracy=metrics["accuracy"],
                     step_s=round(times.step, 1))
        # every metric, a non-finite one too (logged as NaN or infinity, never dropped)
        run.pending.append((step, {f"train/{k}": float(v) for k, v in metrics.items() if v is not None}))
        terms = [t for t in NONFINITE_TERMS if metrics.get(f"nonfinite_{t}")]
        faulty = faulty + 1 if terms else 0
        if terms:
            log.warning("step %d: %d of its optimiser steps skipped: non-finite %s (weights and optimiser state "
                        "untouched; train/nonfinite_skips)", step, int(metrics["nonfinite_skips"]), ", ".join(terms))

        # ---- checkpoints and state: the kept policy first, then the state (with these metrics), then the tracker
        if save_every and (step + 1) % save_every == 0 and step + 1 < n_steps:  # a trajectory point (the last is final)
            save_atomically(step_checkpoint_dir(run.run_dir, step + 1), save_hf)
        elif validate_every and (step + 1) % validate_every == 0 and step + 1 < n_steps:  # validated, then removed
            save_atomically(validation_checkpoint_dir(run.run_dir, step + 1), save_hf)
        stop = STOP_REQUESTED.is_set()
        saved = stop or (every and ((step + 1) % every == 0 or step == n_steps - 1))
        if saved:
            path = save(run, step)  # exactly-once on resume: the metrics travel with the state
        if saved or not every:  # with checkpointing, metrics reach the tracker only together with a saved state
            flush()
        if stop:
            raise Preempted(f"stopped after step {step} on request; state saved to {path}")
        if faulty >= max_faulty:
            raise NumericFault(f"step {step}: non-finite {', '.join(terms)} in {faulty} steps in a row "
                               f"(train.max_nonfinite_steps={max_faulty}): every update of those steps was skipped; "
                               "the run stops with its weights and last saved state finite")

    run.rollout.close()  # the shared vLLM engine stays up, holding the final policy, for the run's evaluation
    run.choices.rollout.measured_s = round(float(sampled_s), 2)  # beside auto's estimate (tagged; a 3x miss warns)
    # a GPU's allocated memory, or the process's peak resident memory on the CPU (which includes what an earlier
    # point of the same process held), beside the plan
    run.choices.memory["run_peak_gb"] = round(float(peak_memory_gb(run.device)), 3)
    run.token_probs.write(run.run_dir / TOKEN_PROBS, run.tokenizer)
    return save_atomically(final_checkpoint_dir(run.run_dir), save_hf)


def _rollout_step(run: LocalRun, step: int, flush: Callable[[], None]) -> StepRollout:
    """Step ``step``'s generation and scoring (:func:`generate`). A stop request ends them at once: the prompt order
    and random states go back to the step's start, the last completed step's state is saved (``flush`` logs its
    metrics) and :class:`Preempted` is raised, so the resumed run redoes this step exactly.

    With ``train.rollout.staleness`` k >= 1 (sequential emulation): the current policy (version ``step``) generates
    the rollouts of steps ``step`` .. ``step + k`` that are not queued yet (at step 0 all k + 1 of them: the warm-up
    steps t < k train on the start policy's samples, staleness t; afterwards one per step, for step ``step + k``),
    in step order with each target step's own sampling seeds and prompts, so the run draws what k = 0 draws; the step
    then trains on its queued rollout (:func:`_consume`). The queue is part of the saved state."""
    order_at_start, random_at_start = run.prompts.state_dict(), RandomStates.capture()
    k, queued = run.config.rollout.staleness, set(run.queue)
    try:
        with abortable():  # a stop request ends generation and scoring at once
            if k == 0:
                return generate(run, step)
            last = step + k - (run.ahead is not None)  # with overlap, step + k is generated during the update
            for target in range(step, min(last, int(run.cfg.train.steps) - 1) + 1):
                if target not in run.queue:
                    run.queue[target] = generate(run, target, version=step)
            ro = _consume(run, run.queue[step], step)
            del run.queue[step]
            return ro
    except StepAborted:
        # the weights, optimiser and scheduler are still the last completed step's
        run.prompts.load_state_dict(order_at_start)
        random_at_start.restore()
        for target in set(run.queue) - queued:  # what this step generated ahead is generated again
            del run.queue[target]
        path = save(run, step - 1)
        flush()
        raise Preempted(f"stopped during step {step}'s generation on request; the state after step {step - 1} "
                        f"saved to {path}") from None


def _update_step(run: LocalRun, ro: StepRollout, step: int, inflight: "InFlight | None", flush: Callable[[], None],
                 t_step: float) -> tuple[list, StepTimes]:
    """Step ``step``'s update on ``ro``: ``train.ppo_epochs`` epochs of minibatch optimiser steps
    (:func:`training.update.update_policy`; continued from ``inflight`` when a stop interrupted it), the scheduler's
    step, the rollout engine's weight sync. Returns (one metrics dict per optimiser step, the step's times).

    Raises:
        Preempted: a stop request, honoured after the running optimiser step: the state is saved with the step's
            rollout and the update so far (:class:`InFlight`), which the resumed run finishes.
    """
    t_update = time.perf_counter()
    if run.ahead is None or not run.ahead.start(run, step):  # overlap: step + k generated during the update
        run.rollout.sleep()  # on a GPU the vLLM engine's memory goes back to the trainer during the update
    done, done_metrics = (inflight.done, inflight.metrics) if inflight is not None else (0, None)
    try:
        update_metrics = update_policy(
            run.model, run.optimizer, ro.batch, ro.advantages, run.loss, run.settings, run.scorer,
            UpdateControl(torch.Generator().manual_seed(run.seed * 7919 + step), STOP_REQUESTED.is_set, done,
                          done_metrics)) if ro.batch.batch_size else []
    except UpdateStopped as e:
        if run.ahead is not None:  # the rollout generating ahead is saved with the queue
            run.ahead.join(run)
        path = save(run, step - 1, InFlight(step, ro, e.done, e.metrics))
        flush()
        raise Preempted(f"stopped during step {step}'s update on request, after {e.done} of its {e.total} "
                        f"optimiser steps; the state, with the step's samples and the update so far, saved to "
                        f"{path} (the resumed run finishes the step)") from None
    if ro.batch.batch_size:
        run.scheduler.step()
    else:  # nothing to learn from: said here (not by PyTorch's scheduler warning); the schedule still advances
        log.warning("step %d: dynamic sampling kept no group with mixed rewards in %d generation round(s) "
                    "(algo.dynamic_sampling.max_num_gen_batches=%s): no update this step (train/updated = 0)",
                    step, ro.rounds, run.config.dynamic.max_num_gen_batches)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            run.scheduler.step()
    waited = 0.0
    if run.ahead is not None:  # the engine keeps the generating weights until the generation is done
        run.ahead.join(run)
        waited = run.ahead.waited
    sync_s = run.rollout.sync(run.model)  # the sampler takes the new weights (vLLM: in place, from memory)
    t_old = sum(m.pop("update_old_logprob_time_s", 0.0) for m in update_metrics)
    ro.phases["logprob_s"] = ro.phases.get("logprob_s", 0.0) + t_old  # the old-log-prob pass is log-prob time
    times = StepTimes(step=time.perf_counter() - t_step, rollout=ro.seconds,
                      update=time.perf_counter() - t_update - t_old - sync_s - waited,
                      sync=sync_s if run.rollout.name != "hf" else None, phases=ro.phases)
    return update_metrics, times


def _step_metrics(run: LocalRun, ro: StepRollout, step: int, update_metrics: list, times: StepTimes, guard) -> dict:
    """Step ``step``'s metrics (:func:`training.step_metrics.step_metrics`): what the policy did over every sampled
    response (with dynamic sampling, also the dropped groups; with deferred old log-probs the entropies were filled in
    the batch the update saw, every sample), ``updated``; the weight-sync guard's error logged
    (:class:`training.mismatch.SyncGuard`); the sampled tokens counted (:class:`TokenProbs`)."""
    seen = ro.batch if run.settings.deferred_old else concat_batches(ro.sampled, run.tokenizer.pad_token_id)
    metrics = step_metrics(ro, seen, update_metrics, times, run.scheduler.get_last_lr()[0], run.device,
                           run.config.dynamic.enabled)
    metrics["updated"] = float(bool(ro.batch.batch_size))  # 0: dynamic sampling kept nothing to learn from
    proximal = (run.config.rollout.old_policy == "recompute" and ro.version < step
                and "old_logprobs" in needs_of("advantage", run.cfg.algo.advantage.name, run.adv_params))
    metrics["flops"] = run.compute.step_flops(  # the step's estimated compute (training/compute.py)
        ro.sampled, ro.batch, int(not run.settings.deferred_old) + int(run.ref_model is not None) + int(proximal))
    metrics.update(ro.generated)  # off-policy: the mismatch measured on the generating weights, the p-vs-b gap
    if run.ahead is not None:  # the update's wait for the generation running beside it (0: fully hidden)
        metrics["overlap_wait_s"] = run.ahead.waited
    if run.config.rollout.staleness > 0:  # steps between the generating policy and the one updated (every sample)
        versions = ro.batch.policy_version if ro.batch.batch_size else torch.tensor([ro.version])
        age = (step - versions).float()
        metrics.update(staleness_mean=float(age.mean()), staleness_max=float(age.max()))
        if run.config.rollout.old_policy == "recompute" and ro.version < step and ro.batch.batch_size:
            from training.algorithms import masked_mean

            b = ro.batch  # its old log-probs are p now (the update's passes or _consume's)
            metrics["staleness_logprob_gap"] = float(masked_mean(
                (b.old_logprobs.float() - b.extras["behaviour_logprobs"].float()).abs(), b.response_mask.float()))
    error = guard.check(step, metrics.get("mismatch_logprob_abs_diff"))
    if error:  # the engine samples other weights than the policy's after a sync (a stale adapter, say)
        log.error(error)
    if seen.batch_size:
        run.token_probs.update(seen.response_ids, seen.old_logprobs, seen.response_mask)
    return metrics
