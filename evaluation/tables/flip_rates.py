"""The ``flip_rates`` table: per difficulty bucket of the base model, the prompts a trained model flipped to solved,
improved or regressed, and their MLflow metrics (:func:`flip_metrics`)."""
from __future__ import annotations

import pandas as pd

from core.config_keys import I

from ..metrics.difficulty import flip_rates
from ..metrics.table_registry import TABLES, MetricTable, register_table


def flip_metrics(base_samples: pd.DataFrame, samples: pd.DataFrame, k: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Flip-rate table (see :func:`evaluation.metrics.difficulty.flip_rates`) and its MLflow metrics
    ``eval/<benchmark>/flip/<bucket>/<measure>`` (benchmark ``all``: every prompt pooled), named by the registered
    ``flip_rates`` table."""
    table = flip_rates(base_samples, samples, k)
    return table, TABLES["flip_rates"].flatten({"flip_rates": table})


def _check_flip(eval_cfg, n: int) -> None:
    k = (eval_cfg or {}).get("flip_k")
    if k is not None and int(k) > n:
        raise ValueError(f"eval.flip_k={k}: larger than eval.n={n} (a prompt has only n samples)")


register_table(MetricTable("flip_rates", lambda samples, s: None if s.base_samples is None else
               flip_rates(s.base_samples, samples, None if s["eval.flip_k"] is None else int(s["eval.flip_k"])),
               section="Flip rates against the base model",
               columns=("n_prompts", "solved_from_unsolved", "improved", "regressed"), rows="{benchmark}/flip/{bucket}",
               per_group=False, checks=_check_flip,
               knobs={"eval.flip_k": I(1, null=True, default=None,
                                       doc="null: literal flip rule (no correct sample among all n); k: budget-k reading")},
               doc="Per difficulty bucket of the base model: prompts flipped to solved, improved, regressed."))
