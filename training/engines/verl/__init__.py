"""verl engine: the same registered algorithms, trained on multi-GPU / multi-node by verl (FSDP + vLLM + Ray), as a
package of parts.

Data flow of ``engine=verl`` for one sweep point (:func:`train`, which builds the run's settings once,
:class:`~.verl_keys.VerlSettings`, and hands them to every part; below it no function receives the config):

1. :mod:`.verl_checks`: settings verl cannot honour are refused before anything starts;
2. :mod:`.verl_launch`: the policy is written as a Hugging Face folder and the training prompts as verl's parquet
   layout;
3. :mod:`.verl_translate`: the settings become verl's Hydra overrides, by concern; verl's own ``ppo_trainer`` schema
   composes them in a child process (``python -m training.engines.verl_support.verl_main``), which calls verl's
   ``run_ppo``;
4. :mod:`.verl_adapters`: the algorithm enters verl only through two registry entries named ``rlvr``, an advantage
   estimator (``algorithm.adv_estimator=rlvr``) and a policy loss (``actor.policy_loss.loss_mode=rlvr``), thin
   adapters around the functions in ``training.algorithms`` -- no algorithm is written twice. The algorithm and its
   parameters travel as JSON in the environment variable :data:`SPEC_ENV`, and Ray's ``worker_process_setup_hook``
   runs :func:`register_from_env` in every Ray worker process;
5. verl's ``file`` logger writes per-step metrics as JSONL; a thread streams them into this run's MLflow run with
   sanitised names (:mod:`training.engines.verl_support.verl_metrics`) and the step's ``train/flops``; with
   ``train.validate_every`` verl's own validation dumps each point's samples, which the suite grades
   (:mod:`.verl_validation`);
6. verl saves the actor in Hugging Face format (``checkpoint.save_contents`` includes ``hf_model``); the export hands
   it to the evaluation stage (:mod:`training.engines.verl_support.verl_checkpoint`).

Estimators that read the rollout's old log-probs (ExPPO, GRPO-UR, as declared at their registration) get them through
the one wrapper around verl's ``compute_advantage``; losses that read the reference log-probs (TR-GRPO's weighted KL)
through the one wrapper around verl's ``ppo_loss``. DAPO's dynamic sampling maps to verl's own group filter
(``algorithm.filter_groups`` on the reward function's ``acc``, i.e. on correctness; verl refills evicted groups until
the batch is full, where the local engine stops after ``max_num_gen_batches`` rounds); its overlong shaping is verl's
DAPO reward manager, configured from the spec (:mod:`training.engines.verl_support.verl_reward`).

What runs inside verl's processes lives beside this package in ``verl_support/`` (its platform on the CPU, its reward
functions, its entry point, its metrics and checkpoints), so that those processes import nothing of the engine's own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from core.config_keys import DEVICE, B, F, I, L, S
from training.engines import register_engine
from training.engines.verl.verl_adapters import (  # noqa: F401
    SETUP_HOOK,
    SPEC_ENV,
    VERL_NAME,
    install_advantage_context,
    install_loss_context,
    install_metrics_context,
    register_from_env,
    register_with_verl,
    verl_advantage,
    verl_policy_loss,
)
from training.engines.verl.verl_checks import DEVICES, SUPPLIED, SUPPLIED_TO_ESTIMATORS  # noqa: F401
from training.engines.verl.verl_keys import VerlSettings
from training.engines.verl.verl_launch import (  # noqa: F401
    hand_over,
    materialize_model,
    plugin_roots,
    worker_runtime_env,
    write_parquet,
)
from training.engines.verl.verl_translate import (  # noqa: F401
    OVERLONG_MANAGER,
    RAW_TEMPLATE,
    REWARD_FN,
    SEARCH_TOOL_FILE,
    VERL_CORRECTIONS,
    compose_verl_config,
    cpu_overrides,
    verl_config_dir,
)

register_engine("verl")
CONFIG = {  # the engine.* keys this engine reads (sweeps/engine/verl.yaml has the defaults and a line on each)
    "engine.dataloader_num_workers": I(0), "engine.device": S(pattern=DEVICE),
    "engine.extra_overrides": L(S()), "engine.gradient_checkpointing": B(), "engine.keep_checkpoints": I(1),
    "engine.max_prompt_length": I(1), "engine.micro_batch_size_per_gpu": I(1), "engine.n_gpus_per_node": I(1),
    "engine.nnodes": I(1), "engine.optimizer_offload": B(), "engine.param_offload": B(),
    "engine.rollout.gpu_memory_utilization": F(0, 1, lo_open=True), "engine.rollout.max_num_batched_tokens": I(1),
    "engine.rollout.name": S(("vllm", "sglang", "hf")), "engine.rollout.tensor_model_parallel_size": I(1),
    "engine.strategy": S(("auto", "fsdp", "fsdp2", "megatron")), "engine.use_remove_padding": B(),
    "engine.attn_implementation": S(("auto", "flash_attention_2", "flash_attention_3", "sdpa", "eager")),
}


def train(cfg, run_dir, log_metrics: Callable[[dict, int], None] = lambda m, s: None, logged_through: int = -1,
          validator=None) -> Path:
    """Train ``cfg.algo`` with verl and return the Hugging Face checkpoint directory (:func:`.verl_launch.run` with the
    run's settings).

    Runs ``python -m training.engines.verl_support.verl_main`` (verl's trainer with this suite's adapters) as a child
    process inside the current allocation: all GPUs of one node, or a Ray cluster spanning the nodes
    of a SLURM allocation when ``RAY_ADDRESS`` points at one (``scripts/slurm/verl_ray_cluster.sh``).
    verl's console output goes to ``run_dir/verl.log``; per-step metrics stream to ``log_metrics``.
    Resumable: verl checkpoints every ``train.checkpoint_every`` steps to ``run_dir/verl_checkpoints`` and
    a rerun with the same ``run_dir`` resumes there (``resume_mode=auto``); one whose last checkpoint holds every
    step only exports it. Tasks whose episodes call tools get them as with the local engine
    (:func:`core.tools.open_tools_for`: ``tools.search.url``, or a retrieval server started for the run and stopped
    after it), passed to verl's tool workers by URL. With ``validator`` (``train.validate_every``, a
    :class:`training.engines.LoopValidation`) verl's own periodic validation samples the validation split before
    training, every N steps and at the last, and the suite grades each point and logs it at its step
    (:mod:`.verl_validation`).

    Raises:
        ValueError: settings verl cannot honour (:func:`check_verl_config`).
        Preempted: a stop was requested (SIGUSR2); verl was stopped and a rerun resumes from its last
            checkpoint (with the default ``train.checkpoint_every=0`` verl saves only at the end, so a
            stopped run starts over: set ``checkpoint_every`` for long runs).
        RuntimeError: verl exited with an error (the tail of ``verl.log`` is in the message).
    """
    from training.engines.verl.verl_launch import run

    return run(VerlSettings.of(cfg), run_dir, log_metrics, logged_through, validator)


def validate(cfg) -> list[str]:
    """The engine's pre-flight check (see :mod:`training.engines`): engine sizes, then :func:`check_verl_config`.

    Raises:
        ValueError: naming the key and value.
    """
    from training.engines.verl.verl_checks import EngineKeys, check_sizes

    check_sizes(EngineKeys.of(cfg.engine))
    return check_verl_config(cfg)


def check_verl_config(cfg) -> list[str]:
    """Refuse settings the verl engine cannot honour, before anything starts (:func:`.verl_checks.check`).

    Raises:
        ValueError: naming the key and value.
    """
    from training.engines.verl.verl_checks import check

    return check(VerlSettings.of(cfg))


def verl_overrides(cfg, model_path: str, data_dir: Path, run_dir: Path) -> list[str]:
    """A run config's verl ``ppo_trainer`` overrides (:func:`.verl_translate.verl_overrides`)."""
    from training.engines.verl import verl_translate

    return verl_translate.verl_overrides(VerlSettings.of(cfg), model_path, Path(data_dir), Path(run_dir))


def algo_spec(cfg) -> dict:
    """A run config's algorithm spec, as verl's workers receive it (:func:`.verl_adapters.algo_spec`)."""
    from training.engines.verl import verl_adapters

    return verl_adapters.algo_spec(VerlSettings.of(cfg))


def verl_environment(cfg) -> dict[str, str]:
    """The environment variables verl's processes need for a run config (:func:`.verl_launch.verl_environment`)."""
    from training.engines.verl import verl_launch

    return verl_launch.verl_environment(VerlSettings.of(cfg))


def has_state(run_dir) -> bool:
    """Whether verl left a checkpoint in ``run_dir/verl_checkpoints`` to resume from (``resume_mode=auto``)."""
    return (Path(run_dir) / "verl_checkpoints" / "latest_checkpointed_iteration.txt").is_file()


def state_paths(run_dir) -> list[Path]:
    """The training state verl keeps in ``run_dir`` (``verl_checkpoints``: what ``resume_mode=auto`` reads; the
    final Hugging Face checkpoint is elsewhere)."""
    return [Path(run_dir) / "verl_checkpoints"]
