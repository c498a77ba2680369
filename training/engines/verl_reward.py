"""verl reward function for engine=verl (``reward.custom_reward_function.path=pkg://training.engines.verl_reward``).

The same verifier as the local engine (math-verify through :func:`evaluation.verify.check_answer`):
1.0 when the response's final answer equals the gold answer, else 0.0; a malformed response scores 0.
For the Knights-and-Knaves data (``data_source`` ``rlvr/kk``) the K&K reward of :mod:`training.data.knights_knaves`.
"""
from __future__ import annotations

import threading

# verl scores a batch's responses from a thread pool; the verifier's worker pool is used by one caller
# at a time (its per-item time limit would otherwise count time spent waiting for other threads)
_LOCK = threading.Lock()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` -> 0/1 reward.

    Never raises on model output: any verifier failure scores 0.0.
    """
    from training.rewards import row_rewards

    checker = "kk" if str(data_source).endswith("/kk") else "math"
    try:
        with _LOCK:
            rewards, _ = row_rewards([str(solution_str)], [{"gold": str(ground_truth), "checker": checker}])
        return float(rewards[0])
    except Exception:  # a bad model output gets reward 0, never a crash
        return 0.0
