"""Algorithm core: pure-torch advantage estimators and policy losses, registered by config name.

The modules of this folder register themselves (found by a folder scan on the first look-up); look them up with
:func:`get_advantage_fn`
and :func:`get_policy_loss_fn`.
"""

from .aggregation import LOSS_AGG_MODES, agg_loss, masked_mean
from .kl import kl_k3
from .registry import (
    AlgorithmSpec,
    BoundLoss,
    check_algorithm,
    couples_rows,
    get_advantage_fn,
    get_policy_loss_fn,
    need_param,
    needs_of,
    panel_metrics,
    register_advantage,
    register_policy_loss,
    registered_advantages,
    registered_policy_losses,
    spec_of,
    validate_params,
)

__all__ = [
    "LOSS_AGG_MODES", "agg_loss", "masked_mean", "kl_k3",
    "AlgorithmSpec", "BoundLoss", "spec_of", "check_algorithm", "couples_rows", "get_advantage_fn", "get_policy_loss_fn", "need_param", "needs_of", "panel_metrics", "register_advantage", "register_policy_loss",
    "registered_advantages", "registered_policy_losses", "validate_params",
]
