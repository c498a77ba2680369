"""Parameter checks shared by the algorithm validators."""
from __future__ import annotations

import math

from .aggregation import check_loss_agg_mode


def check_number(name: str, value, low=None, high=None, low_open=False, allow_none=False) -> None:
    """Raise ValueError naming ``name=value`` unless it is a finite number within the bounds."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r}: expected a finite number")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name}={value!r}: must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value!r}: must be <= {high}")


def check_clip_loss(clip_ratio_low=None, clip_ratio_high=None, loss_agg_mode="token-mean", norm_constant=None, **_) -> list[str]:
    """Clip bounds >= 0 (low < 1), a known aggregation mode, a positive normaliser."""
    check_number("clip_ratio_low", clip_ratio_low, 0, 1, allow_none=True)
    if clip_ratio_low is not None and clip_ratio_low >= 1:
        raise ValueError(f"clip_ratio_low={clip_ratio_low!r}: must be < 1 (the ratio is clipped at 1 - clip_ratio_low)")
    check_number("clip_ratio_high", clip_ratio_high, 0, allow_none=True)
    check_loss_agg_mode(loss_agg_mode)
    check_number("norm_constant", norm_constant, 0, low_open=True, allow_none=True)
    return []
