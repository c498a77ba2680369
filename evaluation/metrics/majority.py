"""maj@k: the share of prompts a majority vote over k samples answers correctly, as an exact expectation over the
k-subsets of a prompt's n samples (the unbiased counterpart of pass@k's estimator, Chen et al. 2021, Eq. 1).

Majority voting ("self-consistency", Wang et al. 2023; the ``maj@k`` / ``cons@k`` that RLVR papers report beside
pass@k, e.g. DeepSeek-R1's cons@64) draws k samples, groups their final answers by the task's answer equivalence and
takes the largest group's answer. The readings chosen here (docs/evaluation.md):

- **Votes**: a sample votes when its answer is in the form the prompt asks for (``answer_status`` ``stated``, or an
  extracted answer for tasks without an answer form); the others (no answer, a restatement of the question, an
  unevaluated expression) abstain. A draw in which every sample abstains answers nothing: 0.
- **Groups**: the correct samples are one group (each was judged equal to the gold answer); the other voting samples
  are grouped by the task's ``same_answer`` (:func:`evaluation.metrics.modes.mode_counts`).
- **Ties**: broken uniformly at random, so a draw where the correct group ties t other groups at the top counts
  1 / (t + 1).
- **k-subsets**: every k-subset of the n samples is equally likely (sampling without replacement, as pass@k's
  estimator); with k = n this is the vote over all samples.

The expectation is exact: for each count x of correct samples in the subset, the ways the other groups can fall
below x (or tie at x) are counted with a generating function in z (samples drawn) and u (groups tied at x), the
abstaining samples and the groups smaller than x contributing (1 + z)^m as a whole.
"""
from __future__ import annotations

from math import comb
from typing import Sequence

import numpy as np


def maj_at_k(correct: int, others: Sequence[int], abstain: int, k: int) -> float:
    """Expected majority-vote accuracy over the k-subsets of one prompt's samples.

    Args:
        correct: samples whose answer is correct (one group).
        others: sizes of the groups of wrong answers (each >= 1).
        abstain: samples without an answer in the asked form.
        k: samples per vote, 1 <= k <= n = correct + sum(others) + abstain.
    Returns:
        float in [0, 1]: sum over k-subsets of [1 / (1 + t) if the correct group leads, tied with t others] / C(n, k).
    Raises:
        ValueError: k outside [1, n] or a negative count.
    """
    others = [int(m) for m in others if int(m) > 0]
    n = int(correct) + sum(others) + int(abstain)
    if min([int(correct), int(abstain), *others]) < 0:
        raise ValueError(f"maj@k needs non-negative counts, got correct={correct}, others={others}, abstain={abstain}")
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k} with n={n} samples")
    total = 0.0
    for x in range(1, min(correct, k) + 1):
        rivals = [m for m in others if m >= x]  # the groups that can reach x
        free = int(abstain) + sum(m for m in others if m < x)  # never at x: any number of them
        # poly[s, t]: ways to draw s samples from the rivals with t of them at exactly x, the rest below x
        poly = np.zeros((k - x + 1, len(rivals) + 1))
        poly[0, 0] = 1.0
        for m in rivals:
            below = np.array([comb(m, y) for y in range(min(x, k - x + 1))], dtype=float)
            new = np.zeros_like(poly)
            for y, w in enumerate(below):
                new[y:, :] += w * poly[: poly.shape[0] - y, :]
            if x <= k - x:
                new[x:, 1:] += comb(m, x) * poly[: poly.shape[0] - x, :-1]
            poly = new
        rest = k - x  # drawn from rivals and free together
        free_ways = np.array([comb(free, rest - s) if rest - s <= free else 0 for s in range(rest + 1)], dtype=float)
        ties = 1.0 / (1.0 + np.arange(len(rivals) + 1))
        total += comb(correct, x) * float(free_ways @ poly[: rest + 1, :] @ ties)
    return total / comb(n, k)


def vote_groups(correct: Sequence[bool], answers: Sequence, votes: Sequence[bool], same=None) -> tuple[int, list[int], int]:
    """(correct count, sizes of the wrong answers' groups, abstentions) of one prompt's samples.

    Args:
        correct: per sample, whether it was graded correct (a correct sample always votes).
        answers: per sample, the extracted answer (grouping key of the wrong ones).
        votes: per sample, whether its answer is in the asked form (the others abstain unless correct).
        same: the task's answer equivalence ``same(a, b)``, or None (normalised strings).
    """
    from .modes import mode_counts

    c = sum(bool(x) for x in correct)
    wrong = [a for ok, a, v in zip(correct, answers, votes) if not ok and v and a is not None]
    return c, mode_counts(wrong, same) if wrong else [], len(list(correct)) - c - len(wrong)



def majority_table(samples, ks, same_answer: dict | None = None):
    """maj@k per benchmark (mean over prompts of :func:`maj_at_k`), with no ``mean`` row (the caller's table has one).

    Args:
        samples: rows with ``benchmark``, ``prompt_id``, ``correct``, ``extracted_answer`` and, when the tasks have
            answer forms, ``answer_status`` (only ``stated`` answers vote; without the column, any extracted answer).
        ks: the k values (each <= every prompt's n).
        same_answer: {benchmark: same(a, b)}, the tasks' answer equivalences (default: normalised strings).
    Returns:
        DataFrame indexed by benchmark with columns ``maj@k``.
    Raises:
        ValueError: a k above some prompt's number of samples.
    """
    import pandas as pd

    same_answer = same_answer or {}
    rows: dict = {}
    status = samples["answer_status"] if "answer_status" in samples.columns else pd.Series(None, index=samples.index)
    votes_all = status.isna() | (status == "stated")
    for (bench, _pid), grp in samples.groupby(["benchmark", "prompt_id"], sort=True):
        c, others, abstain = vote_groups(grp["correct"].astype(bool).tolist(), grp["extracted_answer"].tolist(),
                                         votes_all.loc[grp.index].tolist(), same_answer.get(bench))
        r = rows.setdefault(bench, {f"maj@{k}": [] for k in ks})
        for k in ks:
            r[f"maj@{k}"].append(maj_at_k(c, others, abstain, int(k)))
    return pd.DataFrame({b: {m: float(np.mean(v)) for m, v in r.items()} for b, r in rows.items()}).T
