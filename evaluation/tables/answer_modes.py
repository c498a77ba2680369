"""The ``modes`` table: ExPPO's answer-mode metrics per benchmark (coverage@k, accuracy, yields, disagreement D)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..metrics.modes import prompt_mode_stats
from ..metrics.table_registry import MetricTable, register_table
from .frames import by_prompt, with_mean


def modes_table(samples: pd.DataFrame, ks, same_answer: dict | None = None) -> pd.DataFrame:
    """ExPPO's metrics per benchmark: coverage@k as ExPPO computes it (the share of prompts with a correct answer
    among their *first k* responses by ``sample_idx``: observed, seed-dependent; its expectation over draws is the
    unbiased pass@k of the ``passk`` table, reported beside it), response accuracy, observed and
    effective yield, correct-pair disagreement D (prompts with >= 2 correct); modes are classes of answers
    the benchmark's task calls equal (``same_answer`` {benchmark: same(a, b)}; default: normalised strings).
    Source: ExPPO (coverage@k, yields, D); docs/algorithms.md, ExPPO's metrics."""
    rows = {}
    same_answer = same_answer or {}
    for bench, _pid, grp in by_prompt(samples):
        r = rows.setdefault(bench, {"accuracy": [], "observed_yield": [], "effective_yield": [], "disagreement": [],
                                    **{f"coverage@{k}": [] for k in ks}})
        n, c = len(grp), int(grp["correct"].sum())
        st = prompt_mode_stats(grp.loc[grp["correct"], "extracted_answer"].tolist(), same_answer.get(bench))
        r["accuracy"].append(c / n)
        r["observed_yield"].append(st["observed_yield"])
        r["effective_yield"].append(st["effective_yield"])
        if st["disagreement"] is not None:
            r["disagreement"].append(st["disagreement"])
        first = grp["correct"].to_numpy(dtype=bool)  # sorted by sample_idx
        for k in ks:
            if k > n:
                raise ValueError(f"coverage@{k} needs k <= n, got n={n} samples for a prompt of {bench!r}")
            r[f"coverage@{k}"].append(float(first[:k].any()))
    table = pd.DataFrame({b: {m: (float(np.mean(v)) if v else np.nan) for m, v in r.items()} for b, r in rows.items()}).T
    return with_mean(table)


register_table(MetricTable("modes", lambda samples, s: modes_table(samples, list(s.ks), s.same_answer),
               section="Answer modes (ExPPO's metrics)",
               columns=("accuracy", "observed_yield", "effective_yield", "disagreement", "coverage@{k}"),
               doc="ExPPO's coverage@k, accuracy, observed and effective yield, correct-pair disagreement D."))
