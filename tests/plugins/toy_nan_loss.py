"""A plug-in policy loss that turns NaN on request: GRPO's clipped surrogate, times NaN while ``POISON["on"]`` (a
test sets it between steps, in-process). Used by tests/training/test_numeric_faults.py."""
from training.algorithms import get_policy_loss_fn, register_policy_loss

POISON = {"on": False}


@register_policy_loss("toy_nan")
def toy_nan(logprobs, batch, advantages, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
            loss_agg_mode: str = "seq-mean-token-mean"):
    """GRPO's loss (:func:`training.algorithms.clipped.clipped_surrogate_loss`), NaN while ``POISON["on"]``.
    ``logprobs`` (B, L); returns (loss, metrics)."""
    loss, m = get_policy_loss_fn("grpo")(logprobs, batch, advantages, clip_ratio_low=clip_ratio_low,
                                         clip_ratio_high=clip_ratio_high, loss_agg_mode=loss_agg_mode)
    return (loss * float("nan") if POISON["on"] else loss), m
