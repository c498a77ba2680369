"""A plug-in policy loss with a slow update on request: GRPO's clipped surrogate; with ``TOY_SLOW_LOSS_S`` set, each
pass with gradients sleeps that many seconds (a long update, as at paper scale), the first printing
``toy_slow: update running``; ``STOP_AT["pass"] = n`` requests a stop (as SIGTERM does) in the n-th such pass (an
in-process test). Used by tests/orchestrator/test_faults.py and tests/training/test_update_stop.py."""
import os
import sys
import time

import torch

from training.algorithms import get_policy_loss_fn, register_policy_loss

STOP_AT = {"pass": None, "seen": 0}


@register_policy_loss("toy_slow")
def toy_slow(logprobs, batch, advantages, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2,
             loss_agg_mode: str = "seq-mean-token-mean"):
    """GRPO's loss (:func:`training.algorithms.clipped.clipped_surrogate_loss`), slow or stopping on request.
    ``logprobs`` (B, L); returns (loss, metrics)."""
    if torch.is_grad_enabled():
        STOP_AT["seen"] += 1
        if STOP_AT["pass"] is not None and STOP_AT["seen"] == STOP_AT["pass"]:
            from core.lifecycle import request_stop

            request_stop()
        slow = float(os.environ.get("TOY_SLOW_LOSS_S", "0") or 0)
        if slow:
            if STOP_AT["seen"] == 1:
                print("toy_slow: update running", file=sys.stderr, flush=True)
            time.sleep(slow)
    return get_policy_loss_fn("grpo")(logprobs, batch, advantages, clip_ratio_low=clip_ratio_low,
                                      clip_ratio_high=clip_ratio_high, loss_agg_mode=loss_agg_mode)
