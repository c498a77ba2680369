"""The ``ucc`` and ``similarity`` tables: distinct correct solutions (UCC@k, UCR) and the similarity among a prompt's
correct responses, per benchmark."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.config_keys import F, I, L, S

from ..metrics.diversity import METRICS, mean_pairwise_similarity, ucc_at_k
from ..metrics.table_registry import MetricTable, TableSettings, register_table
from .frames import by_prompt, with_mean


def ucc_table(samples: pd.DataFrame, ks, metric="rouge_l", threshold=0.7) -> pd.DataFrame:
    """Mean UCC@k per benchmark (k <= every prompt's n) and UCR = distinct correct / n."""
    rows = {}
    for bench, _pid, grp in by_prompt(samples):
        texts, correct = grp["response"].tolist(), grp["correct"].tolist()
        n = len(texts)
        r = rows.setdefault(bench, {f"ucc@{k}": [] for k in ks} | {"ucr": []})
        for k in ks:
            r[f"ucc@{k}"].append(ucc_at_k(texts, correct, k, metric, threshold))
        r["ucr"].append(ucc_at_k(texts, correct, n, metric, threshold) / n)
    return with_mean(pd.DataFrame({b: {m: float(np.mean(v)) for m, v in r.items()} for b, r in rows.items()}).T)


def similarity_table(samples: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """Mean pairwise similarity among each prompt's correct responses (prompts with >= 2), per benchmark."""
    rows = {}
    for bench, _pid, grp in by_prompt(samples):
        texts = grp.loc[grp["correct"], "response"].tolist()
        r = rows.setdefault(bench, {m: [] for m in metrics})
        if len(texts) >= 2:
            for m in metrics:
                r[m].append(mean_pairwise_similarity(texts, m))
    table = pd.DataFrame({b: {f"{m}_mean": (float(np.mean(v)) if v else np.nan) for m, v in r.items()} for b, r in rows.items()}).T
    return with_mean(table)


def _ucc_ks(s: TableSettings) -> list[int]:
    return [int(k) for k in (s["eval.ucc_ks"] or [k for k in s.ks if k >= 8] or [max(s.ks)])]


register_table(MetricTable(
    "ucc", lambda samples, s: ucc_table(samples, [k for k in _ucc_ks(s) if k <= s.n], s["eval.similarity_metric"],
                                        float(s["eval.ucc_threshold"])),
    section="Distinct correct solutions (UCC@k) and similarity among correct answers", columns=("ucc@{k}", "ucr"),
    summary=("ucc@{k}", "ucr"),
    knobs={"eval.ucc_ks": L(I(1), null=True, default=None, doc="UCC@k values (null: the ks >= 8, else the largest k)"),
           "eval.ucc_threshold": F(0, 1, default=0.7, doc="two correct responses are one solution at similarity >= this"),
           "eval.similarity_metric": S(METRICS, default="rouge_l", doc="the similarity UCC@k clusters by")},
    doc="UCC@k: distinct correct solutions among k responses; UCR: distinct correct solutions / n."))


register_table(MetricTable("similarity", lambda samples, s: similarity_table(samples),
               section="Distinct correct solutions (UCC@k) and similarity among correct answers",
               columns=tuple(f"{m}_mean" for m in METRICS), summary=("rouge_l_mean",),
               doc="Mean pairwise similarity among each prompt's correct responses (prompts with >= 2)."))
