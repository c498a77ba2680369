"""The verl engine's adapters: the suite's registered advantage estimator and policy loss as verl's ``rlvr`` registry
entries (:func:`verl_advantage`, :func:`verl_policy_loss`), the algorithm's spec they read (:func:`algo_spec`, handed
to every Ray worker in :data:`SPEC_ENV` and registered there by :func:`register_from_env`), and the three wrappers of
verl functions that hand the adapters what verl's interfaces leave out (:func:`install_advantage_context`,
:func:`install_loss_context`, :func:`install_metrics_context`), each installed once when its verl module is imported.

What verl hands to an adapter during one call reaches it through the module's three records (:data:`_ROLLOUT`,
:data:`_LOSS_DATA`, :data:`_ADV_METRICS`), set by the wrapper around that very call and cleared after it: verl's
interfaces offer no argument for them.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import torch

from training.algorithms import get_advantage_fn, get_policy_loss_fn, needs_of
from training.batch import RolloutBatch

VERL_NAME = "rlvr"                 # the name of both registry entries inside verl
SPEC_ENV = "RLVR_VERL_ALGO"        # JSON {"advantage": {name, params}, "policy_loss": {name, params}}
SETUP_HOOK = "training.engines.verl.register_from_env"

_SPEC: dict | None = None
_ROLLOUT: dict = {}                # the batch fields of the compute_advantage call in progress (driver process)
_LOSS_DATA: dict = {}              # the batch fields of the ppo_loss call in progress (actor worker processes)
_ADV_METRICS: dict = {}            # the estimator's metrics of the last compute_advantage call (TaskRunner process)


def algo_spec(v) -> dict:
    """The algorithm part of a verl run's settings (:class:`~training.engines.verl.verl_keys.VerlSettings`) as plain
    JSON-able data: which registered advantage estimator and policy loss, with which parameters; DAPO's overlong
    shaping for the reward manager; the run's seed when the estimator draws random numbers. This is what verl's
    workers receive."""
    s = v.run
    spec = {
        "plugins": list(s.plugins),  # task/algorithm modules the workers import
        "algo": s.algo.name,
        "advantage": {"name": s.algo.advantage, "params": dict(s.algo.advantage_params)},
        "policy_loss": {"name": s.algo.policy_loss, "params": dict(s.algo.policy_loss_params)},
    }
    if s.overlong.enabled:   # DAPO's overlong shaping, applied by the reward manager
        spec["overlong"] = {"len": s.overlong.buffer_length(s.max_new_tokens),
                            "penalty_factor": float(s.overlong.penalty_factor), "max_resp_len": s.max_new_tokens}
    if s.needs.estimator_random:  # the estimator's generator is seeded from it (:func:`batch_generator`)
        spec["seed"] = s.seed
    return spec


def batch_generator(seed: int, batch: RolloutBatch) -> torch.Generator:
    """The generator an estimator that draws random numbers gets inside verl: seeded by the run's seed and the batch's
    content (its rewards and response lengths), so the same batch draws the same numbers however the trainer was
    started or resumed, and never from torch's global generator."""
    content = int(torch.round(batch.rewards.double() * 1000).sum()) * 1_009 + int(batch.response_lengths.sum())
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + content) % (2**63 - 1))


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
    kwargs = dict(spec["params"])
    if "generator" in needs_of("advantage", spec["name"], spec["params"]):  # a seeded generator of its own
        kwargs["generator"] = batch_generator(_current_spec().get("seed", 0), batch)
    adv, adv_metrics = get_advantage_fn(spec["name"])(batch, **kwargs)
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


