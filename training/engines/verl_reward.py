"""verl reward function for engine=verl (``reward.custom_reward_function.path=pkg://training.engines.verl_reward``).

The same verifier as the local engine (math-verify through :func:`evaluation.verify.check_answer`):
1.0 when the response's final answer equals the gold answer, else 0.0; a malformed response scores 0.
"""
from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info)`` -> 0/1 reward.

    Never raises on model output: any verifier failure scores 0.0.
    """
    from training.rewards import math_rewards

    try:
        rewards, _ = math_rewards([str(solution_str)], [str(ground_truth)])
        return float(rewards[0])
    except Exception:  # a bad model output gets reward 0, never a crash
        return 0.0
