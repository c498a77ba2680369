"""All evaluation tables as pure functions of ``samples.parquet`` (plus a base model's samples), each a registered
:class:`~evaluation.metrics.table_registry.MetricTable` of :data:`TABLES`.

``compute_tables(samples, ks, ...)`` loops over :data:`TABLES` and returns pandas tables as the papers show them and
the flat MLflow metrics (``eval/<benchmark>/<metric>``, ``eval/mean/<metric>`` = unweighted mean over benchmarks).
``python -m evaluation.recompute`` calls it on saved samples. A new table is one plug-in module calling
:func:`register_table` (docs/extending.md has an example).

The built-in tables are this package's modules, one per table (``diversity.py``: ``ucc`` and ``similarity``), each
registering its table when imported; :data:`TABLES` names the package, so the registry's folder scan finds them as it
finds tasks, algorithms, engines and samplers. The re-exports below import them in the order of :data:`TABLES` (the
order the tables are computed in, their metrics logged and the report shows them): ``passk``, ``ucc``,
``similarity``, ``entropy``, ``modes``, ``subsets``, ``verifier``, ``tools``, ``kinds``, ``flip_rates``, then
plug-ins; the scan, which imports alphabetically, finds them registered already. ``frames.py`` (what the tables
share) and ``comparability.py`` (:func:`protocol_differences`) register none.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from ..metrics.table_registry import (  # noqa: F401
    TABLES,
    MetricName,
    MetricTable,
    TableSettings,
    find_table,
    knob_values,
    metric_key,
    register_table,
)
from .frames import with_mean

log = logging.getLogger("rlvr.tables")
# the built-in tables, imported (so registered) in the order of TABLES: a new one goes where it is to appear (an
# order, not an alphabet: the import sorter leaves the block alone)
# isort: off
from .pass_rates import per_prompt_values  # noqa: F401  (registers passk)
from .solution_diversity import similarity_table, ucc_table  # noqa: F401  (registers ucc, similarity)
from .entropy import entropy_table  # noqa: F401
from .answer_modes import modes_table  # noqa: F401
from .subsets import subset_table  # noqa: F401
from .verifier import VERIFIER_COLUMNS, verifier_tables  # noqa: F401  (registers verifier)
from .tool_use import tool_table  # noqa: F401
from .kinds import kind_table  # noqa: F401
from .flip_rates import flip_metrics  # noqa: F401
from .comparability import protocol_differences  # noqa: F401  (registers nothing)
# isort: on


def compute_tables(samples: pd.DataFrame, ks, base_samples: pd.DataFrame | None = None, kinds: dict | None = None,
                   same_answer: dict | None = None, eval_cfg=None) -> tuple[dict, dict]:
    """Every registered metric table (:data:`TABLES`: the built-ins and plug-ins) and its flat MLflow metrics.

    Args:
        samples: the samples table (see evaluation.pipeline.SAMPLE_COLUMNS).
        ks: pass@k values (each <= the smallest n per prompt), or ``{benchmark: ks}`` when benchmarks have their
            own budgets (per-benchmark decoding, ``eval.decoding``): each group of benchmarks with the same ks and
            n is tabled on its own, the tables joined, and every ``mean`` row recomputed over the benchmarks that
            have the column (unweighted); :func:`budget_metrics` then gives the suite mean at each benchmark's own k.
        base_samples: the base model's samples on the same prompts, for flip rates.
        kinds: {benchmark: task kind}; adds the ``kinds`` table (``eval/kind/<kind>/<metric>``).
        same_answer: {benchmark: same(a, b)}, the tasks' answer equivalences for the modes table.
        eval_cfg: the ``eval`` config node (DictConfig or dict): every registered table's knobs (``eval.<key>``:
            ``ucc_ks``, ``similarity_metric``, ``ucc_threshold``, ``flip_k``, ``length_unit``, a plug-in's keys) are
            read from it, the one way knobs arrive; a knob it does not set takes the knob's default.
    Tables ``verifier`` (``eval/<benchmark>/verifier_disagreement``...) and ``verifier_disagreements`` (the
    samples) appear when samples carry plain math-verify's verdict (:func:`verifier_tables`); a table whose
    ``compute`` returns None is left out.
    Returns:
        (tables {name: DataFrame}, metrics {"eval/<row>/<metric>": float}); each table's metric names as its
        entry's ``rows`` and ``columns`` say (:meth:`MetricTable.flatten`).
    Raises:
        ValueError: a k larger than a prompt's number of samples (coverage@k), a flip_k larger than n, or a
            table's value that is not a number.
    """
    knobs = knob_values(eval_cfg)
    entries = TABLES.values()
    n_of = samples.groupby(["benchmark", "prompt_id"]).size().groupby(level=0).min()
    common = dict(knobs=knobs, base_samples=base_samples, kinds=kinds, same_answer=same_answer)
    if isinstance(ks, dict):
        groups: dict = {}
        for bench in sorted(set(samples["benchmark"])):
            key = (tuple(int(k) for k in ks[bench]), int(n_of[bench]))
            groups.setdefault(key, []).append(bench)
        parts = [_group_tables(samples[samples["benchmark"].isin(benches)], list(key[0]), common)
                 for key, benches in groups.items()]
        all_ks = sorted({int(k) for v in ks.values() for k in v})
    else:
        parts = [_group_tables(samples, ks, common)]
        all_ks = [int(k) for k in ks]
    owner = {t: e for p in parts for e, got in p.items() for t in got}
    flat = [{t: df for got in p.values() for t, df in got.items()} for p in parts]
    tables = _join(flat, entries) if len(parts) > 1 else flat[0]
    settings = TableSettings(ks=tuple(all_ks), n=int(n_of.min()) if len(n_of) else 0, tables=tables, **common)
    for e in entries:
        if not e.per_group:
            got = e.as_dict(e.compute(samples, settings))
            owner.update(dict.fromkeys(got, e.name))
            tables.update(got)
    metrics = {}
    for name, table in tables.items():  # in the tables' order
        metrics.update(TABLES[owner[name]].flatten({name: table}))
    return tables, metrics


def _group_tables(samples, ks, common: dict) -> dict[str, dict[str, pd.DataFrame]]:
    """{entry name: its tables} of every registered table with ``per_group``, in registration order, for one group
    of benchmarks sharing ``ks`` and n."""
    ks = [int(k) for k in ks]
    n = int(samples.groupby(["benchmark", "prompt_id"]).size().min())
    out: dict = {}
    done: dict = {}
    for e in TABLES.values():
        if e.per_group:
            t0 = time.perf_counter()
            got = e.as_dict(e.compute(samples, TableSettings(ks=tuple(ks), n=n, tables=dict(done), **common)))
            log.debug("table %s: %.1f s", e.name, time.perf_counter() - t0)  # python -m evaluation.recompute shows it
            if got:
                out[e.name] = got
                done.update(got)
    return out


def _join(parts: list[dict], entries) -> dict:
    """One table per name from per-group tables: rows stacked, ``mean`` rows recomputed over all benchmarks;
    sample listings (an entry's ``listings``) stacked with a fresh index."""
    listings = {n for e in entries for n in e.listings}
    out = {}
    for name in dict.fromkeys(n for p in parts for n in p):
        frames = [p[name] for p in parts if name in p]
        if name in listings:
            out[name] = pd.concat(frames, ignore_index=True)
            continue
        if not any(len(f) for f in frames):
            out[name] = frames[0]
            continue
        had_mean = any("mean" in f.index for f in frames)
        table = pd.concat([f.drop(index="mean", errors="ignore") for f in frames if len(f)])
        out[name] = with_mean(table) if had_mean else table
        out[name].index.name = frames[0].index.name
    return out


def budget_metrics(tables: dict, budgets: dict) -> dict:
    """Each benchmark's pass@k and ExPPO's observed coverage@k at its own budget k (``budgets`` {benchmark: k}),
    and their unweighted suite means: ``eval/<bench>/pass_at_budget``, ``eval/<bench>/coverage_at_budget``,
    ``eval/mean/pass_at_budget``, ``eval/mean/coverage_at_budget`` (ExPPO's in-domain suite: AIME24/25 at
    k = 16, Minerva at 8, OlympiadBench at 4, means unweighted over the four)."""
    out = {}
    for metric, table, col in (("pass_at_budget", "passk", "pass@{}"), ("coverage_at_budget", "modes", "coverage@{}")):
        values = []
        for bench, k in budgets.items():
            t = tables.get(table)
            if t is not None and bench in t.index and col.format(k) in t.columns and pd.notna(t.loc[bench, col.format(k)]):
                v = float(t.loc[bench, col.format(k)])
                out[f"eval/{bench}/{metric}"] = v
                values.append(v)
        if values:
            out[f"eval/mean/{metric}"] = float(np.mean(values))
    return out
