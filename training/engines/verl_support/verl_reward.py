"""verl reward function for engine=verl (``reward.custom_reward_function.path=pkg://training.engines.verl_support.verl_reward``).

The same checker as the local engine: the prompt row travels in ``extra_info["row"]`` (written by
:func:`training.engines.verl.write_parquet`) and is scored by its registered task (:mod:`core.tasks`); rows
written without it fall back to the task named by ``data_source`` (``rlvr/<task>``) with the ground truth as gold.
"""
from __future__ import annotations

import json
import threading

# verl scores a batch's responses from a thread pool; the verifier's worker pool is used by one caller
# at a time (its per-item time limit would otherwise count time spent waiting for other threads)
_LOCK = threading.Lock()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` -> the task's verdict.

    Returns:
        ``{"score": reward, "acc": 1.0 or 0.0, "row_index": the row's place in its parquet or -1}``: verl uses
        ``score`` as the reward and keeps the others as reward extra info: ``acc`` for its group filter (DAPO's
        dynamic sampling, ``algorithm.filter_groups.metric=acc``), so groups are filtered on correctness, not on the
        reward; ``row_index`` in its validation dumps, so the suite's validation knows each sample's prompt
        (:mod:`training.engines.verl.verl_validation`; every call returns the same keys, as verl requires).
    Never raises on model output: any checker failure scores 0.0 and acc 0.0.
    """
    from training.rewards import row_rewards

    info = extra_info if isinstance(extra_info, dict) else {}
    try:
        index = float(int(info.get("index", -1)))
    except (TypeError, ValueError):
        index = -1.0
    try:
        raw = info.get("row")
        row = json.loads(raw) if raw else {"gold": str(ground_truth), "task": str(data_source).rsplit("/", 1)[-1]}
        with _LOCK:
            rewards, correct = row_rewards([str(solution_str)], [row])
        return {"score": float(rewards[0]), "acc": float(bool(correct[0])), "row_index": index}
    except Exception:  # a bad model output gets reward 0, never a crash
        return {"score": 0.0, "acc": 0.0, "row_index": index}


def _overlong_manager():
    """``RlvrDAPORewardManager``: verl's own ``DAPORewardManager`` (its overlong penalty on the valid response length,
    eq. 13 of DAPO) with the buffer of this run's spec (``overlong`` in the ``RLVR_VERL_ALGO`` JSON: ``len``,
    ``penalty_factor``, ``max_resp_len``) instead of ``reward.reward_kwargs``, which verl's reward schema does not
    carry. verl loads it with ``reward.reward_manager.source=importlib``."""
    import os
    from types import SimpleNamespace

    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    class RlvrDAPORewardManager(DAPORewardManager):
        def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
            super().__init__(config, tokenizer, compute_score, reward_router_address, reward_model_tokenizer)
            spec = json.loads(os.environ.get("RLVR_VERL_ALGO") or "{}").get("overlong")
            if not spec:
                raise RuntimeError("RlvrDAPORewardManager: the run's spec has no overlong buffer (RLVR_VERL_ALGO)")
            self.overlong_buffer_cfg = SimpleNamespace(enable=True, len=int(spec["len"]),
                                                       penalty_factor=float(spec["penalty_factor"]), log=True)
            self.max_resp_len = int(spec["max_resp_len"])

    return RlvrDAPORewardManager


def __getattr__(name):
    if name == "RlvrDAPORewardManager":   # built on first use: verl is imported only where it runs
        return _overlong_manager()
    raise AttributeError(name)
