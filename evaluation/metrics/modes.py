"""ExPPO's answer-mode metrics and a paired prompt-bootstrap CI.

A *mode* is a distinct normalised final answer among a prompt's correct samples.
"""
from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np


def normalize_answer(ans) -> str:
    """Mode key of an extracted answer: whitespace removed, lowercased, ``\\left``/``\\right`` and ``$`` dropped."""
    s = "" if ans is None else str(ans)
    s = re.sub(r"\\left|\\right|\$|\s+", "", s)
    return s.lower()


def prompt_mode_stats(correct_answers) -> dict:
    """Per-prompt mode statistics from the extracted answers of its *correct* samples.

    Returns:
        ``observed_yield`` (number of distinct modes), ``effective_yield`` (exp of the entropy of the
        mode distribution; 0 when nothing is correct), ``disagreement`` D = 1 - sum_m n_m (n_m - 1) /
        (C (C - 1)) (None when C < 2), with C the number of correct samples.
    """
    counts = Counter(normalize_answer(a) for a in correct_answers)
    c = sum(counts.values())
    if c == 0:
        return {"observed_yield": 0, "effective_yield": 0.0, "disagreement": None}
    p = np.array(list(counts.values()), dtype=np.float64) / c
    eff = float(math.exp(-(p * np.log(p)).sum()))
    d = None if c < 2 else 1.0 - sum(m * (m - 1) for m in counts.values()) / (c * (c - 1))
    return {"observed_yield": len(counts), "effective_yield": eff, "disagreement": d}


def paired_bootstrap_ci(a, b, n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> dict:
    """Paired prompt-bootstrap CI for mean(a) - mean(b), a and b per-prompt values of two runs.

    Each replicate resamples prompt indices with replacement and uses the *same* indices for both
    runs (Efron & Tibshirani 1993, percentile interval).

    Args:
        a, b: (P,) per-prompt values, aligned by prompt.
    Returns:
        {"diff", "ci_low", "ci_high", "n_prompts"}.
    Raises:
        ValueError: different lengths or no prompts.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired bootstrap needs two aligned non-empty vectors, got shapes {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    diffs = a[idx].mean(1) - b[idx].mean(1)
    lo, hi = np.quantile(diffs, [alpha / 2, 1 - alpha / 2])
    return {"diff": float(a.mean() - b.mean()), "ci_low": float(lo), "ci_high": float(hi), "n_prompts": int(len(a))}
