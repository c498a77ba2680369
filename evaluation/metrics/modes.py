"""ExPPO's answer-mode metrics, its Shared-set disagreement and a paired prompt-bootstrap CI.

A *mode* is an equivalence class of a prompt's correct final answers: two answers are one mode when the
task's ``same_answer`` says so (math: math-verify reads them as equal, so ``\\frac{1}{2}`` and
``x=\\frac{1}{2}`` are one mode), not when their strings differ (ExPPO paper, Sec. 3: yield counts distinct
*answers*).
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


def mode_counts(answers, same=None) -> list[int]:
    """Sizes of the modes among ``answers``: answers are first grouped by :func:`normalize_answer`, then groups
    whose representatives ``same(a, b)`` calls equal are merged (each new group is compared with the first
    answer of every mode found so far; ``same=None``: the normalised strings alone).

    Args:
        answers: extracted answers (strings or None).
        same: ``same(a, b) -> bool``, an equivalence (a task's ``same_answer``).
    Returns:
        Mode sizes, in order of first appearance; they sum to ``len(answers)``.
    """
    groups = Counter(normalize_answer(a) for a in answers)
    first = {}
    for a in answers:
        first.setdefault(normalize_answer(a), a)
    modes: list[list] = []      # [representative answer, count]
    for key, count in groups.items():
        for mode in modes:
            if same is not None and same(mode[0], first[key]):
                mode[1] += count
                break
        else:
            modes.append([first[key], count])
    return [count for _, count in modes]


def prompt_mode_stats(correct_answers, same=None) -> dict:
    """Per-prompt mode statistics from the extracted answers of its *correct* samples.

    Args:
        correct_answers: the extracted answers of the prompt's correct samples.
        same: the task's answer equivalence (see :func:`mode_counts`); None compares normalised strings.
    Returns:
        ``observed_yield`` (number of distinct modes), ``effective_yield`` (exp of the entropy of the
        mode distribution; 0 when nothing is correct), ``disagreement`` D = 1 - sum_m n_m (n_m - 1) /
        (C (C - 1)) (None when C < 2), with C the number of correct samples (ExPPO, Sec. 3).
    """
    counts = dict(enumerate(mode_counts(list(correct_answers), same)))
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


def paired_bootstrap_ci_over_seeds(a, b, n_boot: int = 10_000, alpha: float = 0.05, seed: int = 0) -> dict:
    """Paired prompt-bootstrap CI for the difference of two methods each trained with several seeds, pooled over
    the seeds: mean over (seeds, prompts) of ``a`` minus that of ``b``.

    Each replicate resamples prompt indices with replacement, the *same* for both methods (the pairing, as in
    :func:`paired_bootstrap_ci`), and, independently for each method, its training seeds with replacement (so
    the interval carries the seed-to-seed variance, not only the prompt-to-prompt one; a two-stage bootstrap,
    Davison & Hinkley 1997, sec. 3.8). With one seed per method it is :func:`paired_bootstrap_ci` on the same
    random draws (tested).

    Args:
        a, b: (S_a, P) and (S_b, P) per-prompt values, one row per training seed, columns aligned by prompt.
    Returns:
        {"diff", "ci_low", "ci_high", "n_prompts", "n_seeds_a", "n_seeds_b", "p_value"} (p_value:
        :func:`bootstrap_p_value` of the replicates).
    Raises:
        ValueError: not two 2-D arrays with the same prompts, or no prompts or seeds.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or 0 in a.shape or 0 in b.shape:
        raise ValueError(f"the seed-pooled bootstrap needs (seeds, prompts) arrays over the same non-empty prompts, "
                         f"got shapes {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    P = a.shape[1]
    idx = rng.integers(0, P, size=(n_boot, P))  # drawn first: with one seed each, the draws of paired_bootstrap_ci
    sa = rng.integers(0, a.shape[0], size=(n_boot, a.shape[0]))
    sb = rng.integers(0, b.shape[0], size=(n_boot, b.shape[0]))
    # replicate r: the mean over its resampled seeds and its resampled prompts, (n_boot, S, P) gathered at once
    ma = a[sa[:, :, None], idx[:, None, :]].mean(axis=(1, 2))
    mb = b[sb[:, :, None], idx[:, None, :]].mean(axis=(1, 2))
    lo, hi = np.quantile(ma - mb, [alpha / 2, 1 - alpha / 2])
    return {"diff": float(a.mean() - b.mean()), "ci_low": float(lo), "ci_high": float(hi), "n_prompts": int(P),
            "n_seeds_a": int(a.shape[0]), "n_seeds_b": int(b.shape[0]), "p_value": bootstrap_p_value(ma - mb)}


def bootstrap_p_value(replicates) -> float:
    """Two-sided bootstrap p-value of "no difference" from the replicates of a difference: 2 min(share <= 0,
    share >= 0), at most 1 (the smallest alpha whose percentile interval excludes 0, up to the quantiles'
    interpolation; Efron & Tibshirani 1993, sec. 16.4). With B replicates it is no smaller than about 2 / B."""
    d = np.asarray(replicates, dtype=np.float64)
    return float(min(1.0, 2.0 * min((d <= 0).mean(), (d >= 0).mean())))


def holm(p_values, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm-Bonferroni step-down correction over one family of m tests (Holm 1979): sort the p-values
    p_(1) <= ... <= p_(m); the adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j)); reject where it is < alpha.
    Controls the family-wise error rate at alpha under any dependence.

    Args:
        p_values: (m,) p-values (NaN: not a test of the family; kept NaN, not counted in m).
    Returns:
        (adjusted p-values, rejected) as arrays of the input's shape.
    """
    p = np.asarray(p_values, dtype=np.float64)
    adj = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    order = ok[np.argsort(p[ok], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[j]))
        adj[j] = running
    return adj, np.where(np.isnan(adj), False, adj < alpha)


def shared_set_disagreement(samples_by_run: dict, baseline: str, same_by_benchmark: dict | None = None,
                            n_boot: int = 10_000, seed: int = 0):
    """ExPPO's Table 2B: disagreement D on the Shared set and Delta-D against a baseline, with a paired
    prompt-bootstrap 95% CI.

    The Shared set is the (benchmark, prompt) pairs where *every* compared run has at least 2 correct samples
    (D is defined only there); each run's D is averaged over that same set, so the differences are paired.

    Args:
        samples_by_run: {run label: samples DataFrame} (``benchmark``, ``prompt_id``, ``correct``,
            ``extracted_answer``).
        baseline: the label Delta-D is taken against (must be a key of ``samples_by_run``).
        same_by_benchmark: {benchmark: same(a, b)} answer equivalences (default: normalised strings).
        n_boot, seed: bootstrap replicates and seed (:func:`paired_bootstrap_ci`).
    Returns:
        DataFrame indexed by run: ``n_shared``, ``D`` (mean over the Shared set), ``delta_D`` (D - D of the
        baseline), ``ci_low``, ``ci_high`` (0 for the baseline itself). Empty when the Shared set is empty.
    Raises:
        KeyError: ``baseline`` is not one of the runs.
    """
    import pandas as pd

    if baseline not in samples_by_run:
        raise KeyError(f"baseline {baseline!r} is not one of the runs {sorted(samples_by_run)}")
    same_by_benchmark = same_by_benchmark or {}
    per_run = {}
    for label, samples in samples_by_run.items():
        d = {}
        for (bench, pid), grp in samples.groupby(["benchmark", "prompt_id"], sort=True):
            answers = grp.loc[grp["correct"].astype(bool), "extracted_answer"].tolist()
            if len(answers) >= 2:
                d[(bench, pid)] = prompt_mode_stats(answers, same_by_benchmark.get(bench))["disagreement"]
        per_run[label] = d
    shared = sorted(set.intersection(*(set(d) for d in per_run.values())))
    if not shared:
        return pd.DataFrame(columns=["n_shared", "D", "delta_D", "ci_low", "ci_high"])
    base = np.array([per_run[baseline][k] for k in shared])
    rows = {}
    for label, d in per_run.items():
        vals = np.array([d[k] for k in shared])
        ci = paired_bootstrap_ci(vals, base, n_boot=n_boot, seed=seed)
        rows[label] = {"n_shared": len(shared), "D": float(vals.mean()), "delta_D": ci["diff"],
                       "ci_low": ci["ci_low"], "ci_high": ci["ci_high"]}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    return table
