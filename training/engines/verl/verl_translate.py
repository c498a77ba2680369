"""The verl engine's translation of a run's settings into verl ``ppo_trainer`` overrides (Hydra override strings), by
concern (:func:`verl_overrides`): the algorithm entries, the data, the model, the actor and its optimiser, the rollout,
the rewards (DAPO's group filter and overlong shaping), the trainer (steps, checkpoints, logging), the rollout
correction, LoRA, the chat template, tool calls, the CPU platform, and the user's ``engine.extra_overrides`` last; and
verl's own schema composing them (:func:`compose_verl_config`)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

from training.engines.verl.verl_adapters import VERL_NAME
from training.engines.verl.verl_keys import VerlSettings, resolved, tool_task

REWARD_FN = "pkg://training.engines.verl_support.verl_reward"
OVERLONG_MANAGER = "RlvrDAPORewardManager"   # verl's DAPO reward manager with the suite's overlong buffer
SEARCH_TOOL_FILE = str(Path(__file__).resolve().parents[1] / "verl_support" / "verl_search_tool.py")
RAW_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"


def q(v) -> str:
    """``v`` quoted for Hydra (which accepts JSON-style quoting of strings and lists)."""
    return json.dumps(v)


def verl_config_dir() -> Path:
    """verl's own Hydra config folder (``verl/trainer/config``).

    Raises:
        ImportError: verl is not installed.
    """
    import verl

    return Path(verl.__file__).parent / "trainer" / "config"


#: ``train.rollout.correction`` -> verl's own ``algorithm.rollout_correction`` (decoupled mode: verl recomputes the
#: proximal old log-probs, its rollout's are b), as (C, lower) -> settings; each pair is the one
#: tests/training/test_corrections.py checks against the suite's registry (training/corrections.py) on the same
#: tensors. verl's rejection (``rollout_rs``) also drops the rejected tokens from its response mask, hence from the
#: loss's denominators (the registry keeps them: its module docstring)
VERL_CORRECTIONS: dict[str, Callable[[float, float], dict]] = {
    "none": lambda c, lo: {},
    "token_tis": lambda c, lo: {"rollout_is": "token", "rollout_is_threshold": c},
    "sequence_tis": lambda c, lo: {"rollout_is": "sequence", "rollout_is_threshold": c},
    "token_mis": lambda c, lo: {"rollout_is": "token", "rollout_is_threshold": c, "rollout_rs": "token_k1",
                                "rollout_rs_threshold": f"{1 / c!r}_inf"},
    "sequence_mis": lambda c, lo: {"rollout_is": "sequence", "rollout_is_threshold": c, "rollout_rs": "seq_sum_k1",
                                   "rollout_rs_threshold": f"{1 / c!r}_inf"},
    "icepop": lambda c, lo: {"rollout_is": "token", "rollout_is_threshold": f"{lo!r}_{c!r}"},
    "geo_rs": lambda c, lo: {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": f"{1 / c!r}_{1 / lo!r}"},
}


def verl_correction(v: VerlSettings) -> list[str]:
    """verl's ``algorithm.rollout_correction`` overrides for the run's ``train.rollout.correction`` (none: [])."""
    roll = v.run.rollout
    cap = float(roll.correction_cap)
    lower = 1.0 / cap if roll.correction_lower is None else float(roll.correction_lower)
    settings = VERL_CORRECTIONS[str(roll.correction)](cap, lower)
    return [f"algorithm.rollout_correction.{k}={json.dumps(val)}" for k, val in settings.items()]


def verl_overrides(v: VerlSettings, model_path: str, data_dir: Path, run_dir: Path) -> list[str]:
    """Translate a run's settings into verl ``ppo_trainer`` overrides (Hydra override strings), by concern.

    Mapping: ``train.prompts_per_step`` -> ``data.train_batch_size``; ``train.group_size`` -> ``rollout.n``;
    ``train.minibatch_size`` (responses) -> ``actor.ppo_mini_batch_size`` (prompts); ``train.ppo_epochs``,
    ``lr``, ``betas``, ``weight_decay``, ``warmup_steps``, ``max_grad_norm``; ``algo.kl_beta`` -> k3
    (``low_var_kl``) KL loss; ``algo.entropy_coef`` -> ``entropy_coeff``; the loss's ``loss_agg_mode`` (and
    ``norm_constant`` -> ``loss_scale_factor``); ``train.max_new_tokens``, ``temperature``, ``top_p``; the vLLM
    rollout settings of ``engine.rollout``; ``seed``; ``train.steps`` -> ``total_training_steps``;
    ``train.checkpoint_every`` and ``train.save_every`` -> ``save_freq`` (their gcd when both are set;
    resume_mode auto; with ``save_every`` every checkpoint is kept, so each can be exported for evaluation).
    ``train.lora`` -> ``model.lora_rank``, ``lora_alpha``, ``target_modules``, ``model.lora.merge=true`` (the
    rollout takes merged weights) and the adapters' learning rate. ``engine.extra_overrides`` go last.
    """
    s, e = v.run, v.engine
    ov = [*_algorithm(), *_data(v, data_dir), *_model(model_path, e), *_actor(v), *_rollout(v), *_rewards(v),
          *_trainer(v, run_dir), *verl_correction(v)]
    norm = s.algo.policy_loss_params.get("norm_constant")
    if norm is not None:
        ov.append(f"{A}.loss_scale_factor={int(norm)}")
    ov += _lora(s.lora)
    if not s.chat_template:  # raw prompt text, as the local engine feeds a model without a chat template
        ov.append(f"{M}.custom_chat_template={q(RAW_TEMPLATE)}")
    if tool_task(v):  # search QA: verl's tool agent loop, the search function tool, the run's turn limits
        ov += _tools(s.tools or {})
    if str(e.device) == "cpu":
        ov += cpu_overrides()
    return ov + list(e.extra_overrides)


def _algorithm() -> list[str]:
    """The suite's estimator as verl's ``rlvr`` entry; no KL in the reward."""
    return [f"algorithm.adv_estimator={VERL_NAME}", "algorithm.use_kl_in_reward=false"]


def _data(v: VerlSettings, data_dir: Path) -> list[str]:
    """The prompts' parquet files, the batch, the lengths, the data's seed and loader."""
    s, e = v.run, v.engine
    return [
        f"data.train_files={q(str(data_dir / 'train.parquet'))}",
        f"data.val_files={q(str(data_dir / 'val.parquet'))}",
        f"data.train_batch_size={s.prompts_per_step}",
        f"data.max_prompt_length={int(e.max_prompt_length)}",
        f"data.max_response_length={s.max_new_tokens}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"data.seed={s.seed}",
        f"data.dataloader_num_workers={int(e.dataloader_num_workers)}",
    ]


def _model(model_path: str, e) -> list[str]:
    """The policy's folder, activation checkpointing, padding removal."""
    return [
        f"{M}.path={q(str(model_path))}",
        f"{M}.enable_gradient_checkpointing={str(bool(e.gradient_checkpointing)).lower()}",
        f"{M}.use_remove_padding={str(bool(e.use_remove_padding)).lower()}",
    ]


def _actor(v: VerlSettings) -> list[str]:
    """The actor's strategy and attention, its optimiser, mini-batches, epochs, the ``rlvr`` loss and its
    aggregation, the KL loss and entropy terms, offloading, what a checkpoint holds."""
    s, e = v.run, v.engine
    G, P = s.group_size, s.prompts_per_step
    lora, beta = s.lora, float(s.terms.kl_beta or 0.0)
    return [
        f"{A}.strategy={resolved(e, 'strategy')}",
        f"++{M}.override_config.attn_implementation={resolved(e, 'attn_implementation')}",
        f"{A}.optim.lr={lora.learning_rate(s.lr) if lora.on else float(s.lr)}",
        f"{A}.optim.betas={q([float(b) for b in s.betas])}",
        f"{A}.optim.weight_decay={float(s.weight_decay)}",
        f"{A}.optim.lr_warmup_steps={int(s.warmup_steps) or -1}",
        f"{A}.optim.clip_grad={float(s.max_grad_norm)}",
        f"{A}.ppo_mini_batch_size={int(s.minibatch_size or G * P) // G}",
        f"{A}.ppo_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"{A}.ppo_epochs={s.ppo_epochs}",
        f"{A}.shuffle=true",
        f"{A}.policy_loss.loss_mode={VERL_NAME}",
        f"{A}.loss_agg_mode={s.algo.loss_agg_mode}",
        # a loss that reads the reference log-probs itself (TR-GRPO's weighted KL) needs verl to compute them:
        # verl does when its KL loss is on, so it is switched on with coefficient 0 (beta stays 0)
        f"{A}.use_kl_loss={str(s.needs.reference).lower()}",
        f"{A}.kl_loss_coef={beta}",
        f"{A}.kl_loss_type=low_var_kl",
        f"{A}.entropy_coeff={float(s.terms.entropy_coef or 0.0)}",
        f"{A}.fsdp_config.param_offload={str(bool(e.param_offload)).lower()}",
        f"{A}.fsdp_config.optimizer_offload={str(bool(e.optimizer_offload)).lower()}",
        f"{A}.checkpoint.save_contents={q(['model', 'optimizer', 'extra', 'hf_model'])}",
    ]


def _rollout(v: VerlSettings) -> list[str]:
    """The rollout server (``engine.rollout``), the group size, the sampling settings, the log-prob passes' batch and
    the rollout's seed."""
    s, e = v.run, v.engine
    r = e.rollout
    return [
        f"{R}.name={r.name}",
        f"{R}.n={s.group_size}",
        f"{R}.temperature={float(s.temperature)}",
        f"{R}.top_p={float(s.top_p)}",
        f"{R}.tensor_model_parallel_size={int(r.tensor_model_parallel_size)}",
        f"{R}.gpu_memory_utilization={float(r.gpu_memory_utilization)}",
        f"{R}.max_num_batched_tokens={int(r.max_num_batched_tokens)}",
        f"{R}.log_prob_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"{R}.seed={s.seed}",
    ]


def _rewards(v: VerlSettings) -> list[str]:
    """The suite's reward function, DAPO's dynamic sampling (verl's group filter) and overlong shaping (verl's DAPO
    reward manager, configured from the spec: verl_reward.py)."""
    s = v.run
    return [
        # DAPO's dynamic sampling through verl's own group filter: groups whose samples all share one value of
        # the reward function's "acc" (1.0 correct, 0.0 wrong) are evicted and refilled: 0 < #correct < G
        f"algorithm.filter_groups.enable={str(bool(s.dynamic.enabled)).lower()}",
        "algorithm.filter_groups.metric=acc",
        f"reward.custom_reward_function.path={q(REWARD_FN)}",
        *(["reward.reward_manager.source=importlib", f"reward.reward_manager.name={OVERLONG_MANAGER}",
           f"reward.reward_manager.module.path={q(REWARD_FN)}"] if s.overlong.enabled else []),
        "reward.custom_reward_function.name=compute_score",
    ]


def _trainer(v: VerlSettings, run_dir: Path) -> list[str]:
    """The trainer: names, logging, the cluster, the steps, checkpoints (``save_freq``: the gcd of
    ``train.checkpoint_every`` and ``train.save_every``; all kept with ``save_every``), no validation, the device."""
    s, e = v.run, v.engine
    every, save_every, steps = s.checkpoint_every, s.save_every, s.steps
    save_freq = math.gcd(every, save_every) or steps  # gcd(0, x) = x; both 0: only the end
    return [
        f"trainer.project_name={q(s.experiment)}",
        f"trainer.experiment_name={q(Path(run_dir).name)}",
        f"trainer.logger={q(['console', 'file'])}",
        f"trainer.nnodes={int(e.nnodes)}",
        f"trainer.n_gpus_per_node={int(e.n_gpus_per_node)}",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000000",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"trainer.save_freq={save_freq}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={q(str(Path(run_dir) / 'verl_checkpoints'))}",
        f"trainer.max_actor_ckpt_to_keep={'null' if save_every else int(e.keep_checkpoints)}",
        f"trainer.device={e.device}",
    ]


def _lora(lora) -> list[str]:
    """verl's own LoRA (FSDP, peft): its reference is the actor with the adapters off (ref_in_actor), and its rollout
    takes the merged weights after each step (lora.merge), as the local engine's vLLM does."""
    if not lora.on:
        return []
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return [f"{M}.lora_rank={lora.rank}", f"{M}.lora_alpha={int(lora.alpha)}", f"{M}.target_modules={q(targets)}",
            f"++{M}.lora.merge=true"]


def _tools(tools) -> list[str]:
    """verl's tool agent loop with the suite's search function tool and the run's turn and observation limits."""
    return [f"{R}.multi_turn.enable=true", f"{R}.multi_turn.function_tool_path={q(SEARCH_TOOL_FILE)}",
            f"{R}.multi_turn.max_assistant_turns={int(tools.get('max_turns', 4)) + 1}",
            f"{R}.multi_turn.max_tool_response_length={int(tools.get('max_obs_tokens', 256))}",
            f"{R}.agent.default_agent_loop=tool_agent"]


def cpu_overrides() -> list[str]:
    """verl overrides for ``engine.device=cpu``, besides :func:`verl_overrides`' own (seen working on a 2-core machine,
    docs/verl.md): vLLM's CPU build in eager mode without chunked prefill (its seeded CPU
    generators cannot rewind), prefix caching, sleep mode or freeing its cache between steps; few concurrent
    sequences, one agent-loop worker, one reward worker, one storage unit, a small weight-sync bucket; Ray with one
    logical GPU (verl's resource pools ask for GPUs whatever the platform) and enough logical CPUs for verl's
    actors to be placed (with 6 the run waits forever), no dashboard."""
    R = "actor_rollout_ref.rollout"
    return [
        f"{R}.enforce_eager=true", f"{R}.enable_chunked_prefill=false", f"{R}.enable_prefix_caching=false",
        f"{R}.free_cache_engine=false", f"++{R}.enable_sleep_mode=false", f"{R}.max_num_seqs=8",
        f"{R}.agent.num_workers=1", f"{R}.checkpoint_engine.update_weights_bucket_megabytes=64",
        "reward.num_workers=1", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "ray_kwargs.ray_init.num_cpus=16", "++ray_kwargs.ray_init.num_gpus=1", "++ray_kwargs.ray_init.include_dashboard=false",
    ]


def compose_verl_config(overrides: list[str]):
    """Compose verl's ``ppo_trainer`` config with ``overrides`` (verl's own schema, defaults and
    interpolations) and resolve it. Must run where no other Hydra app is initialised (a child process
    or a test).

    Raises:
        hydra.errors.HydraException: an override verl's schema does not accept (named in the message;
            omegaconf's errors likewise).
    """
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=list(overrides))
    return config


