"""Runs grouped by seed, as :mod:`reports.data`'s tables are: the training ``seed`` (the papers report three-seed
results) or the decoding seed ``eval.seed``. Mean +- std over a group's runs, the study's methods (a method: the runs
that differ only by their seed) and its baseline, the spread of a training metric over a method's seeds, and the
note naming the decoding seeds when the runs compared differ in it (pure functions of what :mod:`reports.load` read,
tested).
"""
from __future__ import annotations

import re

import pandas as pd


def seed_group(label: str, key: str = "seed") -> str:
    """The label without its ``<key>=N`` part: runs that differ only by that seed share it. ``key="seed"`` is the
    training seed (``eval.seed=N`` is left alone), ``key="eval.seed"`` the decoding seed."""
    return re.sub(rf"\s*(?<![\w.]){re.escape(key)}=\S+", "", label).strip()


def seed_aggregate(table: pd.DataFrame, digits: int = 4, key: str = "seed") -> pd.DataFrame:
    """Mean +- std (sample std, n - 1) over runs that differ only by ``key``: the training ``seed``, as the papers
    report three-seed results, or the decoding seed ``eval.seed`` (one checkpoint evaluated with several seeds,
    ExPPO's Table 3). ``table`` is indexed by run label (or (run, ...) with the run first); the result is indexed
    by the seed group (and the remaining levels), with a ``seeds`` column. Empty when no two runs share a group."""
    if table.empty:
        return pd.DataFrame()
    runs = table.index.get_level_values(0)
    groups = [seed_group(r, key) for r in runs]
    if len(set(groups)) == len(set(runs)):
        return pd.DataFrame()
    df = table.copy()
    rest = list(df.index.names[1:]) if df.index.nlevels > 1 else []
    df.index = pd.MultiIndex.from_arrays([groups, *[df.index.get_level_values(n) for n in rest]], names=["run", *rest]) \
        if rest else pd.Index(groups, name="run")
    grouped = df.groupby(level=list(range(df.index.nlevels)), sort=False)
    mean, std, count = grouped.mean(numeric_only=True), grouped.std(numeric_only=True), grouped.size()
    out = mean.copy().astype(object)
    for col in mean.columns:
        out[col] = [("" if pd.isna(m) else f"{m:.{digits}f}" + ("" if pd.isna(s) else f" ± {s:.{digits}f}"))
                    for m, s in zip(mean[col], std[col])]
    out["seeds"] = count
    return out


def study_methods(trained: pd.DataFrame, samples: dict, key: str = "seed") -> dict:
    """{method: [run labels]}: the finished trained runs with samples, grouped by :func:`seed_group` (runs that
    differ only by the training ``seed``), in run order; ``{}`` when no method has two seeds (no study)."""
    methods: dict = {}
    for label in trained["label"] if len(trained) else []:
        if label in samples:
            methods.setdefault(seed_group(label, key), []).append(label)
    return methods if any(len(v) > 1 for v in methods.values()) else {}


def study_baseline(methods: dict, trained: pd.DataFrame, baseline: str | None) -> str | None:
    """The method the study compares against: ``baseline`` itself when it is a method, else the method of the first
    run whose label or algorithm is ``baseline``; None without one."""
    if baseline is None or not methods:
        return None
    if baseline in methods:
        return baseline
    for _, r in trained.iterrows():
        if baseline in (r["label"], r["algo"]):
            for method, labels in methods.items():
                if r["label"] in labels:
                    return method
    return None


def eval_seed_note(runs: pd.DataFrame) -> str | None:
    """A note naming the evaluation (decoding) seeds when the runs compared were evaluated with more than one
    (``eval.seed``: not part of the protocol, so such runs are compared, each on its own draw); None when all share
    one (or none is recorded)."""
    seeds: dict = {}
    for lab, params in zip(runs["label"], runs["params"]) if len(runs) else []:
        seed = (params or {}).get("eval.seed")
        if seed is not None:
            seeds.setdefault(str(seed), []).append(str(lab))
    if len(seeds) < 2:
        return None
    parts = "; ".join(f"eval.seed={s}: {', '.join(labs)}" for s, labs in sorted(seeds.items()))
    return (f"The runs compared were evaluated with different decoding seeds ({parts}): their samples are different "
            "draws, so a difference between them includes the seed's.")


def seed_band(hist: dict, methods: dict, key: str) -> dict:
    """{method: (steps, mean, min, max)} of training metric ``key`` over each method's seeds, on the steps every
    seed logged (from :func:`histories`); methods without the metric left out."""
    out = {}
    for method, labels in methods.items():
        series = [pd.Series(hist[key][lab][1], index=hist[key][lab][0]) for lab in labels if lab in hist.get(key, {})]
        if not series:
            continue
        df = pd.concat(series, axis=1, join="inner").sort_index()
        out[method] = (df.index.to_numpy(), df.mean(axis=1).to_numpy(), df.min(axis=1).to_numpy(), df.max(axis=1).to_numpy())
    return out
