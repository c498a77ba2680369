"""Local training engine: one process, CPU or one GPU, transformers + plain torch.

The whole loop is in :func:`train`, top to bottom: setup, then per step rollout -> reward ->
advantage -> ``ppo_epochs`` inner epochs of minibatch policy-loss updates -> metrics; finally a
Hugging Face checkpoint. Algorithms enter only through the registry (``cfg.algo.advantage.name``,
``cfg.algo.policy_loss.name``); this file never branches on an algorithm's name.

Rollouts come from the run's rollout sampler (``train.rollout.sampler``: transformers ``generate`` on the policy
itself, or the process's vLLM engine, which takes the policy's weights in place after every optimiser step); the
old-policy log-probs are the trainer's own (a forward pass of the policy), and with vLLM the difference to the
sampler's log-probs is logged as the training-inference mismatch and optionally corrected (:mod:`training.mismatch`).
"""
from __future__ import annotations

import copy
import math
import os
import random
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm.auto import trange

from core.lifecycle import (STOP_REQUESTED, Preempted, StepAborted, abortable, final_checkpoint_dir, save_atomically,
                            step_checkpoint_dir)
from core.models import load_policy
from core.progress import LineProgress
from training.algorithms import agg_loss, get_advantage_fn, get_policy_loss_fn, kl_k3, masked_mean, needs_of
from training.algorithms.aggregation import token_weights
from training.engines import register_engine
from training.mismatch import mismatch_metrics, tis_metrics, tis_weights
from training.token_probs import ARTIFACT as TOKEN_PROBS, TokenProbs
from training.batch import concat_batches
from core.tasks import load_prompts
from training.rewards import informative_rows, overlong_buffer_length, overlong_penalty
from training.rollout import collect_rollouts, compute_logprobs

__all__ = ["STOP_REQUESTED", "Preempted", "train", "update_policy", "policy_objective"]  # the flag lives in core.lifecycle


def _params(node) -> dict:
    """A config node's parameters without its ``name`` key, as a plain dict."""
    d = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    d.pop("name", None)
    return d


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _mean_metrics(items: list[dict]) -> dict:
    keys = {k for m in items for k in m}
    return {k: float(np.mean([m[k] for m in items if k in m])) for k in keys}


STATE_FILE = Path("state") / "train_state.pt"


def has_state(run_dir) -> bool:
    """Whether ``run_dir`` holds a saved training state to resume from (the orchestrator asks before resuming)."""
    return (Path(run_dir) / STATE_FILE).is_file()


def load_state(run_dir, device="cpu") -> dict:
    """The saved training state of ``run_dir``, loaded with ``torch.load(weights_only=True)`` (tensors, numbers,
    strings and containers only: a state file cannot run code when it is read).

    Raises:
        ValueError: the state file resolves (through links) outside ``run_dir``.
    """
    run_dir = Path(run_dir).resolve()
    path = (run_dir / STATE_FILE).resolve()
    if run_dir not in path.parents:
        raise ValueError(f"training state {run_dir / STATE_FILE} resolves to {path}, outside the run folder {run_dir}")
    return torch.load(path, map_location=device, weights_only=True)


register_engine("local")  # no engine.* keys of its own (sweeps/engine/local.yaml: the name only)


def validate(cfg) -> list[str]:
    """Pre-flight of the local engine's own settings (``train.gradient_checkpointing``, ``train.precision``,
    ``train.rollout.*``).

    Raises:
        ValueError: gradient checkpointing asked of a model class that does not support it; a rollout sampler that is
            unknown, not installed or cannot sample a policy; a correction without a sampler that returns its own
            log-probs (one line, naming the key).
    """
    from core.models import model_class
    from core.sampling import SAMPLERS, choose_rollout_sampler, resolve_sampler

    warnings = []
    ro = cfg.train.get("rollout") or {}
    name, correction = str(ro.get("sampler", "auto")), str(ro.get("correction", "none"))
    if name != "auto":
        try:
            resolve_sampler(name)
            choose_rollout_sampler(name, None)
        except ValueError as e:
            raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None
    if correction != "none" and not (name in SAMPLERS and SAMPLERS[name].rollout_logprobs):
        raise ValueError(f"train.rollout.correction={correction}: corrects the mismatch between the trainer and a sampler "
                         f"with log-probs of its own: set train.rollout.sampler to one of "
                         f"{[k for k, v in SAMPLERS.items() if v.rollout_logprobs]} (it is {name})")
    if bool(cfg.train.get("gradient_checkpointing", False)):
        cls = model_class(cfg.model)
        if cls is not None and not getattr(cls, "supports_gradient_checkpointing", False):
            raise ValueError(f"train.gradient_checkpointing=true: model {cfg.model.name!r} ({cls.__name__}) does not "
                             "support gradient checkpointing; set train.gradient_checkpointing=false")
    if str(cfg.train.get("precision", "fp32")) == "bf16" and str(cfg.train.get("device", "auto")) == "cpu":
        warnings.append("train.precision=bf16 on the CPU: about 20% faster than fp32 there, with bf16's coarse "
                        "log-probabilities (ratios are exact on the first minibatch, not after updates)")
    return warnings


def peak_memory_gb(device) -> float:
    """Peak memory so far, GiB: CUDA memory allocated on ``device`` when it is a GPU, else the process's peak
    resident set size (Linux ``ru_maxrss``, KiB)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _py_rng_to(state) -> dict:
    version, internal, gauss = state
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def _py_rng_from(d) -> tuple:
    return int(d["version"]), tuple(int(x) for x in d["internal"].tolist()), d["gauss"]


def _np_rng_to(state) -> dict:
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached": float(cached)}


def _np_rng_from(d) -> tuple:
    return d["name"], d["keys"].numpy().astype(np.uint32), d["pos"], d["has_gauss"], d["cached"]


def policy_objective(logprobs, entropy, batch, advantages, loss_fn, loss_params: dict, beta: float = 0.0,
                     entropy_coef: float = 0.0, weights=None):
    """The loss one optimiser step minimises (the verl engine's adapter is tested against this).

    loss = policy_loss(logprobs, batch, advantages) + beta * agg(k3 KL to the reference)
           - entropy_coef * agg(entropy),
    both extra terms aggregated with the policy loss's own ``loss_agg_mode`` (and ``norm_constant``), as verl does.

    Args:
        logprobs: (B, L) log pi_theta of the sampled tokens (with gradient); entropy: (B, L) or None
            (needed when entropy_coef > 0); batch: the minibatch (``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L).
        weights: (B, L) per-token weights of the policy loss's terms (the truncated importance-sampling correction,
            :func:`training.mismatch.tis_weights`), applied inside its aggregation
            (:func:`training.algorithms.aggregation.token_weights`); None: none.
    Returns:
        (loss, policy loss term, metrics dict).
    """
    agg_mode = loss_params.get("loss_agg_mode", "token-mean")
    norm = loss_params.get("norm_constant")
    with token_weights(weights):
        pg_loss, m = loss_fn(logprobs, batch, advantages, **loss_params)
    loss = pg_loss
    if entropy_coef > 0:
        ent = agg_loss(entropy, batch.response_mask, agg_mode, norm)
        loss = loss - entropy_coef * ent
        m["entropy_bonus"] = float(ent.detach())
    if beta > 0:
        kl = agg_loss(kl_k3(logprobs, batch.ref_logprobs), batch.response_mask, agg_mode, norm)
        loss = loss + beta * kl
        m["kl_ref"] = float(kl.detach())
    return loss, pg_loss, m


def update_policy(model, optimizer, batch, advantages, loss_fn, loss_params: dict, ppo_epochs: int = 1,
                  minibatch_size=None, max_grad_norm: float = 1.0, beta: float = 0.0, temperature: float = 1.0,
                  bf16: bool = False, generator=None, entropy_coef: float = 0.0, align_old: bool | None = None,
                  deferred_old: bool = False, correction: str = "none", correction_cap: float = 2.0) -> list[dict]:
    """``ppo_epochs`` passes over ``batch`` in shuffled minibatches, one AdamW step per minibatch.

    With ``align_old`` (default: when ``bf16``), the old log-probabilities are recomputed before the first
    update, without gradients, minibatch by minibatch in the first epoch's order: the same rows, shapes and
    precision path as the updates' own forward passes, so the first minibatch's ratio is exactly 1 in bf16 too
    (bf16 results depend on the batch shape; the rollout's pass over the whole batch is not bit-identical).
    The first minibatch needs no such pass: before any update its own forward pass *is* the rollout policy, so its
    old log-probs are that pass's values, detached. With ``deferred_old`` the rollout computed no old log-probs at
    all (:func:`training.rollout.collect_rollouts` with ``old_logprobs=False``): they, and the rollout policy's
    entropies (``batch.extras["entropy"]``), are filled here the same way, so one forward pass over the first
    minibatch's rows is saved per step (with the whole batch in one minibatch, the whole old-log-prob pass).

    loss = policy_loss(logprobs, minibatch, advantages) + beta * agg(k3 KL to the reference)
           - entropy_coef * agg(entropy)   (GRPO-H's entropy bonus when entropy_coef > 0),
    with the policy loss's own aggregation mode for both extra terms; gradients clipped to ``max_grad_norm``.

    With ``correction`` (``token_tis`` | ``sequence_tis``) and the sampler's own log-probs in
    ``batch.extras["rollout_logprobs"]`` (vLLM rollouts), each minibatch's policy-loss terms are weighted by the
    truncated importance-sampling weights of its old log-probs against the sampler's (:mod:`training.mismatch`).

    Args:
        batch: RolloutBatch of B responses (with ``ref_logprobs`` when beta > 0);
        advantages: (B,) or (B, L) on the model's device.
        correction, correction_cap: ``train.rollout.correction`` and its cap C (weights min(ratio, C)).
    Returns:
        One metrics dict per optimiser step (loss terms, grad norm, the loss function's metrics); the first also
        has ``first_minibatch_ratio_dev``, max |pi_theta / pi_old - 1| over its tokens before any update (0 when
        old and new log-probs come from the same path).
    """
    B = batch.batch_size
    mb_size = int(minibatch_size or B)
    out = []
    perms = [torch.randperm(B, generator=generator).to(advantages.device) for _ in range(ppo_epochs)]
    aligned = (bf16 if align_old is None else align_old) or deferred_old
    t_old = time.perf_counter()
    if aligned:
        with torch.no_grad():
            for start in range(mb_size, B, mb_size):  # every minibatch but the first, before any update
                idx = perms[0][start:start + mb_size]
                mb = batch.select(idx)
                lp, ent = compute_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                           temperature, with_entropy=deferred_old, bf16=bf16)
                batch.old_logprobs[idx] = lp
                if deferred_old:
                    batch.extras["entropy"][idx] = ent
    t_old = time.perf_counter() - t_old
    for perm in perms:
        for start in range(0, B, mb_size):
            idx = perm[start:start + mb_size]
            mb = batch.select(idx)
            first = perm is perms[0] and start == 0
            t_fwd = time.perf_counter()
            logprobs, entropy = compute_logprobs(model, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.response_mask,
                                                 temperature, with_entropy=entropy_coef > 0 or (first and deferred_old),
                                                 bf16=bf16)
            if first and aligned:  # before any update this pass is the rollout policy: its own old log-probs
                batch.old_logprobs[idx] = mb.old_logprobs = logprobs.detach()
                if deferred_old:
                    batch.extras["entropy"][idx] = entropy.detach()
            weights = None
            if correction != "none" and "rollout_logprobs" in mb.extras:
                weights = tis_weights(mb.old_logprobs, mb.extras["rollout_logprobs"], mb.response_mask, correction,
                                      correction_cap)
            loss, pg_loss, m = policy_objective(logprobs, entropy, mb, advantages[idx], loss_fn, loss_params,
                                                beta=beta, entropy_coef=entropy_coef, weights=weights)
            if weights is not None:
                m.update(tis_metrics(weights, mb.response_mask, correction_cap))
            if first:  # before any update the ratio must be exactly 1 on every token
                with torch.no_grad():
                    dev = ((logprobs.detach() - mb.old_logprobs).exp() - 1).abs()
                    m["first_minibatch_ratio_dev"] = float(dev[mb.response_mask.bool()].max()) if mb.response_mask.any() else 0.0
            t_bwd = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            m.update(policy_loss=float(pg_loss.detach()), loss=float(loss.detach()), grad_norm=float(grad_norm),
                     update_forward_time_s=t_bwd - t_fwd, update_backward_time_s=time.perf_counter() - t_bwd)
            if first:
                m["update_old_logprob_time_s"] = t_old
            out.append(m)
    return out


def train(cfg, run_dir, log_metrics: Callable[[dict, int], None] = lambda m, s: None, logged_through: int = -1) -> Path:
    """Train a policy with ``cfg.algo`` on ``cfg.data`` and save a Hugging Face checkpoint.

    Args:
        cfg: the composed run config (``model``, ``data``, ``algo``, ``train``, ``seed``).
        run_dir: directory for this run's files; the checkpoint goes to ``run_dir/checkpoint``.
        log_metrics: ``fn(metrics: dict[str, float], step: int)``, called once per step.
        logged_through: the last step whose metrics the tracker already holds (resume: saved metrics of
            later steps are logged again, earlier ones are not, so every step is logged exactly once).
    Returns:
        Path of the final checkpoint (``run_dir/checkpoint``). With ``train.save_every = N > 0`` the policy
        after every N-th step is also kept, in ``run_dir/checkpoints/step_<steps done>``
        (:func:`core.lifecycle.saved_checkpoints`).
    Raises:
        Preempted: :data:`STOP_REQUESTED` was set; the full state was saved first: at the end of the running step,
            or, when the request came during the step's generation and scoring (:func:`core.lifecycle.abortable`),
            at once, as the last completed step's state with the prompt order and random states of the stopped
            step's start, so that the resumed run redoes that step exactly.

    Resumable: with ``train.checkpoint_every = N > 0`` the full state (policy, optimiser, scheduler, step,
    RNG states, prompt order, metrics not yet logged) is saved to ``run_dir/state`` every N steps and
    when a stop is requested; a later call with the same ``run_dir`` continues from the saved step and
    reproduces the uninterrupted run. Metrics are handed to ``log_metrics`` right after each save.

    Tasks that declare tools (``Task.tools``: question answering with search) roll out multi-turn episodes
    (:func:`core.agent.generate_with_tools`, ``tools.max_turns``, ``tools.max_obs_tokens``); the tools are opened
    for the run (a retrieval server started when ``tools.search.url`` is not set) and closed when it ends.
    """
    from core.tools import close_tools, open_tools_for

    tools = open_tools_for(load_prompts(cfg.data, "train"), cfg.get("tools"))
    try:
        return _train(cfg, run_dir, log_metrics, logged_through, tools)
    finally:
        close_tools(tools)


def _open_rollout(cfg, model, tokenizer, device, steps_left: int, run_dir: Path):
    """The run's rollout sampler (:func:`rollout_choice`), holding the policy's current weights; its choice and
    the reason are written to ``run_dir/rollout.json`` (the orchestrator tags the run with them)."""
    import json

    from core.models import model_path
    from core.sampling import RolloutOptions, build_rollout

    ro = cfg.train.get("rollout") or {}
    name, reason = rollout_choice(cfg, sum(p.numel() for p in model.parameters()), device.type == "cuda", steps_left)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "rollout.json").write_text(json.dumps({"sampler": name, "reason": reason}))
    options = RolloutOptions(dtype=_rollout_dtype(cfg, device),
                             engine={"gpu_memory_utilization": ro.get("gpu_memory_utilization")}
                             if device.type == "cuda" else {})
    return build_rollout(name, model, tokenizer, model_path(cfg.model), options), ro


def _rollout_dtype(cfg, device) -> str:
    """``train.rollout.dtype``: ``auto`` is the precision the trainer computes in (float32; bfloat16 with
    ``train.precision=bf16``): the least training-inference mismatch."""
    dtype = str((cfg.train.get("rollout") or {}).get("dtype", "auto"))
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(cfg.train.get("precision", "fp32")) == "bf16" else "float32"


def rollout_choice(cfg, n_params: int, gpu: bool, steps: int | None = None) -> tuple[str, str]:
    """The rollout sampler a run uses and why (``train.rollout.sampler``; ``auto``: the lowest estimated sampling time
    for the run's size, :func:`core.sampling.choose_rollout_sampler`).

    Raises:
        ValueError: naming ``train.rollout.sampler`` (unknown, or not installed here).
    """
    from core.models import model_path
    from core.sampling import RolloutPlan, choose_rollout_sampler, vllm_engine_defaults

    t = cfg.train
    ro = t.get("rollout") or {}
    dyn = cfg.algo.get("dynamic_sampling") or {}
    rounds = int(dyn.get("max_num_gen_batches", 1)) if dyn.get("enabled", False) else 1
    ready = False
    try:  # a vLLM engine of this process that would serve the run needs no start
        from core import vllm_engine

        engine = vllm_engine.current_engine()
        if engine is not None:
            kwargs = {**vllm_engine_defaults(gpu), **({"gpu_memory_utilization": ro.get("gpu_memory_utilization")}
                                                      if gpu else {})}
            ready = engine.key == vllm_engine.engine_key(model_path(cfg.model), _rollout_dtype(cfg, torch.device(
                "cuda" if gpu else "cpu")), {k: v for k, v in kwargs.items() if v is not None})
    except (ImportError, OSError):
        ready = False
    plan = RolloutPlan(steps=int(steps if steps is not None else t.steps),
                       sequences=int(t.prompts_per_step) * int(t.group_size) * rounds,
                       max_new_tokens=int(t.max_new_tokens), n_params=int(n_params), gpu=bool(gpu), engine_ready=ready)
    try:
        return choose_rollout_sampler(str(ro.get("sampler", "auto")), plan)
    except ValueError as e:
        raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None


def _train(cfg, run_dir, log_metrics, logged_through: int, tools: dict) -> Path:
    t_cfg, algo = cfg.train, cfg.algo
    run_dir = Path(run_dir)
    seed = int(cfg.seed)
    seed_everything(seed)
    device = torch.device("cuda" if torch.cuda.is_available() and t_cfg.get("device", "auto") != "cpu" else "cpu")

    # ---- setup: policy, optional frozen reference, optimiser, prompts, algorithm functions
    model, tokenizer = load_policy(cfg.model)
    model.to(device).train()
    if bool(t_cfg.get("gradient_checkpointing", False)):  # activations recomputed in the backward pass
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    beta = float(algo.get("kl_beta", 0.0))
    entropy_coef = float(algo.get("entropy_coef", 0.0))
    ref_model = None
    if beta > 0 or "ref_logprobs" in needs_of("policy_loss", algo.policy_loss.name, _params(algo.policy_loss)):
        # a reference copy only when a KL term is used (in bf16 with train.precision=bf16: it is never trained)
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if str(t_cfg.get("precision", "fp32")) == "bf16":
            ref_model.to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(t_cfg.lr), betas=tuple(t_cfg.betas),
                                  weight_decay=float(t_cfg.weight_decay))
    warmup = int(t_cfg.get("warmup_steps", 0))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    prompts = load_prompts(cfg.data, "train")
    order_rng = random.Random(seed)
    order: list[int] = []
    adv_fn, adv_params = get_advantage_fn(algo.advantage.name), _params(algo.advantage)
    loss_fn, loss_params = get_policy_loss_fn(algo.policy_loss.name), _params(algo.policy_loss)
    G, n_prompts = int(t_cfg.group_size), int(t_cfg.prompts_per_step)
    temperature, bf16 = float(t_cfg.temperature), str(t_cfg.get("precision", "fp32")) == "bf16"
    chat = bool(cfg.model.get("chat_template", True))

    dyn = algo.get("dynamic_sampling") or {}
    overlong = algo.get("overlong_buffer") or {}
    # old log-probs scored inside the update, minibatch by minibatch (the first from its own forward pass), unless
    # the advantage estimator reads them or dynamic sampling keeps a subset of the sampled rows
    defer_old = "old_logprobs" not in needs_of("advantage", algo.advantage.name, adv_params) and not dyn.get("enabled", False)

    # ---- resume from a saved state (preemption, requeue, re-run of an unfinished point)
    state_path = run_dir / "state" / "train_state.pt"
    every, n_steps, start_step, pending = int(t_cfg.get("checkpoint_every", 0) or 0), int(t_cfg.steps), 0, []
    save_every = int(t_cfg.get("save_every", 0) or 0)
    token_probs = TokenProbs()  # every sampled token's probability, by token id (TR-GRPO's Fig. 1; token_probs.csv)

    def save_hf(path: Path) -> None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    if state_path.exists():
        st = load_state(run_dir, device)
        model.load_state_dict(st["model"])
        optimizer.load_state_dict(st["optimizer"])
        scheduler.load_state_dict(st["scheduler"])
        order[:] = [int(i) for i in st["order"]]
        order_rng.setstate(_py_rng_from(st["order_rng"]))
        random.setstate(_py_rng_from(st["py_rng"]))
        np.random.set_state(_np_rng_from(st["np_rng"]))
        torch.set_rng_state(st["torch_rng"])
        start_step = int(st["step"]) + 1
        if "token_probs" in st:
            token_probs.load_state_dict(st["token_probs"])
        for s_, m_ in st["pending"]:
            if s_ > logged_through:
                log_metrics(m_, s_)

    def save_state(step: int):
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "order": list(order), "order_rng": _py_rng_to(order_rng.getstate()), "py_rng": _py_rng_to(random.getstate()),
                    "np_rng": _np_rng_to(np.random.get_state()), "torch_rng": torch.get_rng_state(), "step": step,
                    "pending": pending, "token_probs": token_probs.state_dict()}, tmp)
        os.replace(tmp, state_path)  # atomic: a kill mid-save leaves the previous state intact

    def next_rows():
        rows = []
        for _ in range(n_prompts):
            if not order:
                order.extend(range(len(prompts)))
                order_rng.shuffle(order)
            rows.append(prompts[order.pop()])
        return rows

    # ---- the rollout sampler (train.rollout.sampler: hf on the policy itself, or vLLM's engine holding its weights)
    rollout, ro = _open_rollout(cfg, model, tokenizer, device, n_steps - start_step, run_dir)
    correction, cap = str(ro.get("correction", "none")), float(ro.get("correction_cap", 2.0))

    def rollout_step(step: int):
        """One step's generation, scoring and advantages: G responses per prompt from the current (old) policy, with
        old log-probs; rewards from the verifier (+ DAPO's overlong shaping); with dynamic sampling, groups that are
        all correct or all wrong are dropped and new prompts sampled, for at most max_num_gen_batches rounds. Changes
        no weight, so a stop request may end it at once (core.lifecycle.abortable)."""
        t0 = time.perf_counter()
        kept, sampled, n_kept, rounds, phases = [], [], 0, 0, {}
        while True:
            batch, _texts = collect_rollouts(
                model, tokenizer, next_rows(), G, temperature, float(t_cfg.top_p), int(t_cfg.max_new_tokens),
                seed=seed * 1_000_003 + step * 1_009 + rounds, chat_template=chat, ref_model=ref_model, bf16=bf16,
                timings=phases, old_logprobs=not defer_old, tools=tools, tools_cfg=cfg.get("tools"), rollout=rollout,
            )
            rounds += 1
            if overlong.get("enabled", False):
                batch.rewards = batch.rewards + overlong_penalty(
                    batch.response_lengths, int(t_cfg.max_new_tokens),
                    overlong_buffer_length(overlong, int(t_cfg.max_new_tokens)), float(overlong.get("penalty_factor", 1.0)))
            sampled.append(batch)
            if not dyn.get("enabled", False):
                kept = [batch]
                break
            keep_rows = informative_rows(batch.correct, batch.group_index)   # 0 < #correct < G (DAPO eq. 11)
            if keep_rows.any():
                kept.append(batch.select(torch.nonzero(keep_rows).squeeze(-1)))
                n_kept += len(torch.unique(batch.group_index[keep_rows]))
            if n_kept >= n_prompts or rounds >= int(dyn.get("max_num_gen_batches", 1)):
                break
        if not kept:  # dynamic sampling found no informative group: nothing to learn from this step
            kept = [batch.select(torch.arange(0))]
        batch = concat_batches(kept, tokenizer.pad_token_id)
        if dyn.get("enabled", False) and batch.batch_size > n_prompts * G:
            batch = batch.select(torch.arange(n_prompts * G))
        batch = batch.to(device)
        phases["_rollout_s"] = time.perf_counter() - t0

        # ---- advantage (registered estimator; rewards come from the verifier in collect_rollouts)
        if batch.batch_size == 0:
            advantages, adv_metrics = torch.zeros(0, device=device), {}
        else:
            advantages, adv_metrics = adv_fn(batch, **adv_params)
            advantages = advantages.to(device)

        return batch, sampled, rounds, phases, advantages, adv_metrics

    lines = LineProgress(f"train {algo.name}", n_steps, start_step)
    for step in trange(start_step, n_steps, initial=start_step, total=n_steps, desc=f"train {algo.name}", unit="step",
                       disable=None):
        t_step = time.perf_counter()
        # what a stop during this step's generation rolls back to: the prompt order and the random states at its start
        at_start = (list(order), order_rng.getstate(), random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            with abortable():  # a stop request ends generation and scoring at once
                batch, sampled, rounds, phases, advantages, adv_metrics = rollout_step(step)
        except StepAborted:
            # the weights, optimiser and scheduler are still the last completed step's: the resumed run redoes this
            # step from the same prompts and random states
            order[:] = at_start[0]
            order_rng.setstate(at_start[1])
            random.setstate(at_start[2])
            np.random.set_state(at_start[3])
            torch.set_rng_state(at_start[4])
            save_state(step - 1)
            for s_, m_ in pending:
                log_metrics(m_, s_)
            pending.clear()
            raise Preempted(f"stopped during step {step}'s generation on request; the state after step {step - 1} "
                            f"saved to {state_path}") from None
        t_rollout = phases.pop("_rollout_s")

        # ---- K inner epochs of minibatch updates
        t_update = time.perf_counter()
        rollout.sleep()  # on a GPU the vLLM engine's memory goes back to the trainer during the update
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        update_metrics = update_policy(
            model, optimizer, batch, advantages, loss_fn, loss_params, ppo_epochs=int(t_cfg.ppo_epochs),
            minibatch_size=t_cfg.get("minibatch_size"), max_grad_norm=float(t_cfg.max_grad_norm), beta=beta,
            temperature=temperature, bf16=bf16, generator=gen, entropy_coef=entropy_coef, deferred_old=defer_old,
            correction=correction, correction_cap=cap,
        ) if batch.batch_size else []
        scheduler.step()
        sync_s = rollout.sync(model)  # the sampler takes the new weights (vLLM: in place, from memory)
        t_old = sum(m.pop("update_old_logprob_time_s", 0.0) for m in update_metrics)
        t_update = time.perf_counter() - t_update - t_old - sync_s  # the old-log-prob pass counts as log-prob time
        phases["logprob_s"] = phases.get("logprob_s", 0.0) + t_old

        # ---- metrics
        step_time = time.perf_counter() - t_step
        # what the policy did: every sampled response (with dynamic sampling, also the dropped groups)
        # (deferred old log-probs: the entropies were filled in the batch the update saw, which is every sample)
        seen = batch if defer_old else concat_batches(sampled, tokenizer.pad_token_id)
        n_tokens = int(seen.response_mask.sum()) + int(seen.prompt_mask.sum())
        metrics = {
            "reward_mean": float(seen.rewards.mean()),
            "accuracy": float(seen.correct.float().mean()),
            "entropy": float(masked_mean(seen.extras["entropy"], seen.response_mask)),
            "response_length_mean": float(seen.response_lengths.float().mean()),
            "response_length_max": float(seen.response_lengths.max()),
            "truncated_share": float((~seen.extras["finished"]).float().mean()),
            **({"tool_calls_mean": float(seen.extras["tool_calls"].float().mean()),
                "no_answer_share": float((~seen.extras["answered"].bool()).float().mean()),
                "tool_token_share": float(seen.extras["tool_tokens"].sum() / max(1, int(seen.extras["tool_tokens"].sum()
                                                                                         + seen.response_mask.sum())))}
               if "tool_calls" in seen.extras else {}),
            "advantage_mean": float(advantages.mean()) if batch.batch_size else None,
            "advantage_abs_mean": float(advantages.abs().mean()) if batch.batch_size else None,
            "batch_responses": batch.batch_size,
            **({"dynamic_sampling_rounds": rounds, "dynamic_sampling_sampled": seen.batch_size}
               if dyn.get("enabled", False) else {}),
            "lr": float(scheduler.get_last_lr()[0]),
            "step_time_s": step_time,
            "rollout_time_s": t_rollout,
            "update_time_s": t_update,
            **({"weight_sync_time_s": sync_s} if rollout.name != "hf" else {}),
            # over every sampled response whose old log-probs the trainer computed (all of them unless deferred)
            **(mismatch_metrics(seen.old_logprobs, seen.extras["rollout_logprobs"], seen.response_mask)
               if "rollout_logprobs" in seen.extras and seen.batch_size else {}),
            **{f"{k[:-2]}_time_s": v for k, v in phases.items()},  # generate, reward, logprob (rollout's split)
            "tokens_per_s": n_tokens / max(step_time, 1e-9),
            "samples_per_s": seen.batch_size / max(step_time, 1e-9),
            "peak_memory_gb": peak_memory_gb(device),
            "gpus": 1.0 if torch.device(device).type == "cuda" else 0.0,
            **({"peak_reserved_gb": torch.cuda.max_memory_reserved(device) / 2**30}
               if torch.device(device).type == "cuda" else {}),
            **{k: float(v) for k, v in adv_metrics.items()},
            **_mean_metrics(update_metrics),
            **{k: float(sum(m[k] for m in update_metrics))  # the step's totals, not the per-minibatch mean
               for k in ("update_forward_time_s", "update_backward_time_s") if update_metrics},
        }
        if seen.batch_size:
            token_probs.update(seen.response_ids, seen.old_logprobs, seen.response_mask)
        lines.update(step + 1, reward=metrics["reward_mean"], accuracy=metrics["accuracy"],
                     step_s=round(step_time, 1))
        pending.append((step, {f"train/{k}": v for k, v in metrics.items() if v is not None and math.isfinite(v)}))
        if save_every and (step + 1) % save_every == 0 and step + 1 < n_steps:  # a trajectory point (the last is final),
            save_atomically(step_checkpoint_dir(run_dir, step + 1), save_hf)  # kept before the state that skips it
        stop = STOP_REQUESTED.is_set()
        saved = stop or (every and ((step + 1) % every == 0 or step == n_steps - 1))
        if saved:
            save_state(step)  # first the state (with these metrics), then the tracker: exactly-once on resume
        if saved or not every:  # with checkpointing, metrics reach the tracker only together with a saved state
            for s_, m_ in pending:
                log_metrics(m_, s_)
            pending.clear()
        if stop:
            raise Preempted(f"stopped after step {step} on request; state saved to {state_path}")

    rollout.close()  # the shared vLLM engine stays up, holding the final policy, for the run's evaluation
    token_probs.write(run_dir / TOKEN_PROBS, tokenizer)
    return save_atomically(final_checkpoint_dir(run_dir), save_hf)
