"""verl reward function for engine=verl (``reward.custom_reward_function.path=pkg://training.engines.verl_reward``).

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
        ``{"score": reward, "acc": 1.0 or 0.0}``: verl uses ``score`` as the reward and keeps ``acc`` as reward
        extra info, which its group filter (DAPO's dynamic sampling, ``algorithm.filter_groups.metric=acc``)
        reads, so groups are filtered on correctness, not on the reward.
    Never raises on model output: any checker failure scores 0.0 and acc 0.0.
    """
    from training.rewards import row_rewards

    try:
        raw = (extra_info or {}).get("row") if isinstance(extra_info, dict) else None
        row = json.loads(raw) if raw else {"gold": str(ground_truth), "task": str(data_source).rsplit("/", 1)[-1]}
        with _LOCK:
            rewards, correct = row_rewards([str(solution_str)], [row])
        return {"score": float(rewards[0]), "acc": float(bool(correct[0]))}
    except Exception:  # a bad model output gets reward 0, never a crash
        return {"score": 0.0, "acc": 0.0}
