"""All evaluation tables as pure functions of ``samples.parquet`` (plus a base model's samples), each a registered
:class:`~evaluation.metrics.table_registry.MetricTable` of :data:`TABLES`.

``compute_tables(samples, ks, ...)`` loops over :data:`TABLES` and returns pandas tables as the papers show them and
the flat MLflow metrics (``eval/<benchmark>/<metric>``, ``eval/mean/<metric>`` = unweighted mean over benchmarks).
``python -m evaluation.recompute`` calls it on saved samples. A new table is one plug-in module calling
:func:`register_table` (docs/extending.md has an example).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core.config_keys import F, I, L, S

from .metrics.difficulty import flip_rates
from .metrics.diversity import METRICS, mean_pairwise_similarity, ucc_at_k
from .metrics.modes import prompt_mode_stats
from .metrics.passk import pass_at_k, passk_table
from .metrics.table_registry import (TABLES, MetricName, MetricTable, TableSettings, find_table,  # noqa: F401
                                     knob_values, metric_key, register_table)


def _with_mean(table: pd.DataFrame) -> pd.DataFrame:
    if len(table):
        table = table.copy()
        table.loc["mean"] = table.mean(axis=0, numeric_only=True)
    table.index.name = "benchmark"
    return table


def _prompts(samples: pd.DataFrame):
    for (bench, pid), grp in samples.sort_values("sample_idx").groupby(["benchmark", "prompt_id"], sort=True):
        yield bench, pid, grp


def ucc_table(samples: pd.DataFrame, ks, metric="rouge_l", threshold=0.7) -> pd.DataFrame:
    """Mean UCC@k per benchmark (k <= every prompt's n) and UCR = distinct correct / n."""
    rows = {}
    for bench, _pid, grp in _prompts(samples):
        texts, correct = grp["response"].tolist(), grp["correct"].tolist()
        n = len(texts)
        r = rows.setdefault(bench, {f"ucc@{k}": [] for k in ks} | {"ucr": []})
        for k in ks:
            r[f"ucc@{k}"].append(ucc_at_k(texts, correct, k, metric, threshold))
        r["ucr"].append(ucc_at_k(texts, correct, n, metric, threshold) / n)
    return _with_mean(pd.DataFrame({b: {m: float(np.mean(v)) for m, v in r.items()} for b, r in rows.items()}).T)


def similarity_table(samples: pd.DataFrame, metrics=METRICS) -> pd.DataFrame:
    """Mean pairwise similarity among each prompt's correct responses (prompts with >= 2), per benchmark."""
    rows = {}
    for bench, _pid, grp in _prompts(samples):
        texts = grp.loc[grp["correct"], "response"].tolist()
        r = rows.setdefault(bench, {m: [] for m in metrics})
        if len(texts) >= 2:
            for m in metrics:
                r[m].append(mean_pairwise_similarity(texts, m))
    table = pd.DataFrame({b: {f"{m}_mean": (float(np.mean(v)) if v else np.nan) for m, v in r.items()} for b, r in rows.items()}).T
    return _with_mean(table)


def entropy_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Mean token entropy (nats) per benchmark: over all samples, correct ones and wrong ones."""
    df = samples.dropna(subset=["mean_token_entropy"])
    if df.empty:
        return pd.DataFrame()
    rows = {}
    for bench, grp in df.groupby("benchmark"):
        rows[bench] = {"entropy": grp["mean_token_entropy"].mean(),
                       "entropy_correct": grp.loc[grp["correct"], "mean_token_entropy"].mean(),
                       "entropy_wrong": grp.loc[~grp["correct"], "mean_token_entropy"].mean()}
    return _with_mean(pd.DataFrame(rows).T)


def modes_table(samples: pd.DataFrame, ks, same_answer: dict | None = None) -> pd.DataFrame:
    """ExPPO's metrics per benchmark: coverage@k as ExPPO computes it (the share of prompts with a correct answer
    among their *first k* responses by ``sample_idx``: observed, seed-dependent; its expectation over draws is the
    unbiased pass@k of the ``passk`` table, reported beside it), response accuracy, observed and
    effective yield, correct-pair disagreement D (prompts with >= 2 correct); modes are classes of answers
    the benchmark's task calls equal (``same_answer`` {benchmark: same(a, b)}; default: normalised strings).
    Source: ExPPO (coverage@k, yields, D); ``../shared/ALGORITHMS.md``, ExPPO metrics."""
    rows = {}
    same_answer = same_answer or {}
    for bench, _pid, grp in _prompts(samples):
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
    return _with_mean(table)


def subset_table(samples: pd.DataFrame, ks) -> pd.DataFrame:
    """Accuracy and pass@k per subset of a benchmark (e.g. K&K puzzles by number of people), for
    samples whose rows carry a ``subset``; indexed ``<benchmark>/<subset>``, sorted. Empty when none do."""
    if "subset" not in samples.columns:
        return pd.DataFrame()
    df = samples.dropna(subset=["subset"])
    if df.empty:
        return pd.DataFrame()
    rows = {}
    for (bench, subset), grp in df.groupby(["benchmark", "subset"], sort=True):
        per = grp.groupby("prompt_id")["correct"].agg(n="size", c="sum")
        n_min = int(per["n"].min())
        rows[f"{bench}/{subset}"] = {
            "n_prompts": float(len(per)), "accuracy": float((per["c"] / per["n"]).mean()),
            **{f"pass@{k}": float(np.mean(pass_at_k(per["n"].to_numpy(), per["c"].to_numpy(), k))) for k in ks if k <= n_min},
        }
    table = pd.DataFrame(rows).T
    table.index.name = "benchmark/subset"
    return table


def per_prompt_values(samples: pd.DataFrame, metric: str = "accuracy") -> pd.Series:
    """Per-prompt accuracy (or ``pass@k``) indexed by (benchmark, prompt_id), for paired bootstraps."""
    per = samples.groupby(["benchmark", "prompt_id"])["correct"].agg(n="size", c="sum")
    if metric == "accuracy":
        return per["c"] / per["n"]
    if metric.startswith("pass@"):
        k = int(metric.split("@")[1])
        return pd.Series(pass_at_k(per["n"].to_numpy(), per["c"].to_numpy(), k), index=per.index)
    raise ValueError(f"metric={metric!r}: expected 'accuracy' or 'pass@<k>'")


def kind_table(passk: pd.DataFrame, kinds: dict) -> pd.DataFrame:
    """pass@k and avg@n by task kind (math, multiple_choice, code, logic): the unweighted mean over the
    benchmarks of each kind, with their count. ``passk`` is the per-benchmark table (its ``mean`` row ignored)."""
    rows = {}
    per = passk.drop(index="mean", errors="ignore")
    for kind in sorted(set(kinds.values())):
        benches = [b for b in per.index if kinds.get(b) == kind]
        if benches:
            rows[kind] = {"benchmarks": float(len(benches)), **per.loc[benches].mean(numeric_only=True).to_dict()}
    table = pd.DataFrame(rows).T
    table.index.name = "kind"
    return table


VERIFIER_COLUMNS = ["benchmark", "prompt_id", "sample_idx", "gold", "extracted_answer", "correct",
                    "reference_correct", "response_tail"]


def verifier_tables(samples: pd.DataFrame, tail_chars: int = 400) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The disagreement audit: how often this suite's verdict differs from plain math-verify's.

    Args:
        samples: the samples table; only rows with a ``reference_correct`` verdict count (math tasks; rows
            of other tasks, or sampled before the audit existed, have none).
        tail_chars: characters of each disagreeing response kept in the listing.
    Returns:
        (table, listing): ``table`` per benchmark (and ``mean``, unweighted): ``verifier_disagreement`` (the
        share of samples whose two verdicts differ), ``verifier_only_suite`` (correct here, wrong for plain
        math-verify) and ``verifier_only_math_verify`` (the reverse), all in [0, 1]; ``listing`` the
        disagreeing samples (:data:`VERIFIER_COLUMNS`). Both empty when no sample has a reference verdict.
    Source: this suite (no peer reports it); the reference grader is :mod:`core.verify`'s plain reading.
    """
    if "reference_correct" not in samples or samples["reference_correct"].isna().all():
        return pd.DataFrame(), pd.DataFrame(columns=VERIFIER_COLUMNS)
    rows = samples[samples["reference_correct"].notna()]
    ours, ref = rows["correct"].astype(bool), rows["reference_correct"].astype(bool)
    frame = pd.DataFrame({"benchmark": rows["benchmark"], "verifier_disagreement": (ours != ref).astype(float),
                          "verifier_only_suite": (ours & ~ref).astype(float),
                          "verifier_only_math_verify": (~ours & ref).astype(float)})
    table = _with_mean(frame.groupby("benchmark").mean())
    listing = rows[ours != ref].assign(response_tail=lambda d: d["response"].astype(str).str[-tail_chars:])
    listing = listing.sort_values(["benchmark", "prompt_id", "sample_idx"]).reindex(columns=VERIFIER_COLUMNS)
    return table, listing.reset_index(drop=True)


def flip_metrics(base_samples: pd.DataFrame, samples: pd.DataFrame, k: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Flip-rate table (see :func:`evaluation.metrics.difficulty.flip_rates`) and its MLflow metrics
    ``eval/<benchmark>/flip/<bucket>/<measure>`` (benchmark ``all``: every prompt pooled), named by the registered
    ``flip_rates`` table."""
    table = flip_rates(base_samples, samples, k)
    return table, TABLES["flip_rates"].flatten({"flip_rates": table})


def protocol_differences(samples: pd.DataFrame, base: pd.DataFrame) -> tuple[list[str], int, int]:
    """How far two samples tables can be compared prompt by prompt (flip rates, paired differences), read from the
    samples themselves (a file carries no config): the prompts they share, and the protocol differences the samples
    show: the samples per prompt, the response-length cap (the longest response that stopped for length, against
    the other's longest response), and the rendered prompt of a shared prompt (another template).

    Args:
        samples, base: samples tables (``benchmark``, ``prompt_id``, ``prompt``, ``n_tokens``, ``finish_reason``).
    Returns:
        (differences, one line each; the number of prompts both have; the number of prompts ``samples`` has).
    """
    key = ["benchmark", "prompt_id"]
    a, b = samples.groupby(key).size(), base.groupby(key).size()
    shared = a.index.intersection(b.index)
    out = []
    if len(shared):
        na, nb = sorted(set(a[shared])), sorted(set(b[shared]))
        if na != nb:
            out.append(f"samples per prompt {'/'.join(map(str, na))} against the base's {'/'.join(map(str, nb))}")

        def cap(t):
            cut = t[t["finish_reason"].astype(str) == "length"]["n_tokens"] if "finish_reason" in t else []
            return (int(max(cut)) if len(cut) else None), int(t["n_tokens"].max()) if "n_tokens" in t and len(t) else 0

        (ca, la), (cb, lb) = cap(samples), cap(base)
        if (ca is not None and (lb > ca or (cb is not None and cb != ca))) or (cb is not None and la > cb):
            out.append(f"responses cut at {ca if ca is not None else f'more than {la}'} tokens against the base's "
                       f"{cb if cb is not None else f'more than {lb}'} (a different max_new_tokens: truncation alone "
                       "turns correct answers wrong)")
        if "prompt" in samples and "prompt" in base:
            pa = samples.drop_duplicates(key).set_index(key)["prompt"]
            pb = base.drop_duplicates(key).set_index(key)["prompt"]
            differ = int((pa[shared].astype(str) != pb[shared].astype(str)).sum())
            if differ:
                out.append(f"{differ} of the {len(shared)} shared prompts are rendered differently (another template)")
    return out, len(shared), len(a)


def tool_table(samples: pd.DataFrame) -> pd.DataFrame:
    """Per benchmark whose samples called tools (a ``tool_calls`` count): exact match (the share of correct samples),
    tool calls per episode, and the share of episodes that ended without an answer; with an unweighted ``mean`` row.
    Empty when no sample carries a tool-call count. Source: TR-GRPO's Table 3 (EM), Search-R1."""
    if "tool_calls" not in samples or samples["tool_calls"].isna().all():
        return pd.DataFrame()
    df = samples[samples["tool_calls"].notna()]
    rows = {b: {"exact_match": float(g["correct"].mean()), "tool_calls": float(g["tool_calls"].astype(float).mean()),
                "no_answer_share": float(g["extracted_answer"].isna().mean())} for b, g in df.groupby("benchmark")}
    return _with_mean(pd.DataFrame(rows).T)


# ---------------------------------------------------------------------------- the registered tables

def _ucc_ks(s: TableSettings) -> list[int]:
    return [int(k) for k in (s["eval.ucc_ks"] or [k for k in s.ks if k >= 8] or [max(s.ks)])]


def _check_flip(eval_cfg, n: int) -> None:
    k = (eval_cfg or {}).get("flip_k")
    if k is not None and int(k) > n:
        raise ValueError(f"eval.flip_k={k}: larger than eval.n={n} (a prompt has only n samples)")


def _passk(samples, s: TableSettings) -> pd.DataFrame:
    table = passk_table(samples, list(s.ks)).rename(columns={"avg@n": f"avg@{s.n}"})
    table.index.name = "benchmark"
    return table


def _verifier(samples, s: TableSettings):
    table, listing = verifier_tables(samples)
    return {"verifier": table, "verifier_disagreements": listing} if len(table) else None


register_table("passk", _passk, section="pass@k", columns=("pass@{k}", "avg@{n}"), summary=("pass@1",),
               doc="Unbiased pass@k (k in eval.ks) and avg@n (mean accuracy over the n samples) per benchmark.")
register_table(
    "ucc", lambda samples, s: ucc_table(samples, [k for k in _ucc_ks(s) if k <= s.n], s["eval.similarity_metric"],
                                        float(s["eval.ucc_threshold"])),
    section="Distinct correct solutions (UCC@k) and similarity among correct answers", columns=("ucc@{k}", "ucr"),
    summary=("ucc@{k}", "ucr"),
    knobs={"eval.ucc_ks": L(I(1), null=True, default=None, doc="UCC@k values (null: the ks >= 8, else the largest k)"),
           "eval.ucc_threshold": F(0, 1, default=0.7, doc="two correct responses are one solution at similarity >= this"),
           "eval.similarity_metric": S(METRICS, default="rouge_l", doc="the similarity UCC@k clusters by")},
    doc="UCC@k: distinct correct solutions among k responses; UCR: distinct correct solutions / n.")
register_table("similarity", lambda samples, s: similarity_table(samples),
               section="Distinct correct solutions (UCC@k) and similarity among correct answers",
               columns=tuple(f"{m}_mean" for m in METRICS), summary=("rouge_l_mean",),
               doc="Mean pairwise similarity among each prompt's correct responses (prompts with >= 2).")
register_table("entropy", lambda samples, s: entropy_table(samples), section="Entropy",
               columns=("entropy", "entropy_correct", "entropy_wrong"),
               doc="Mean token entropy (nats): all samples, correct ones, wrong ones.")
register_table("modes", lambda samples, s: modes_table(samples, list(s.ks), s.same_answer),
               section="Answer modes (ExPPO's metrics)",
               columns=("accuracy", "observed_yield", "effective_yield", "disagreement", "coverage@{k}"),
               doc="ExPPO's coverage@k, accuracy, observed and effective yield, correct-pair disagreement D.")
register_table("subsets", lambda samples, s: subset_table(samples, list(s.ks)).pipe(lambda t: t if len(t) else None),
               section="Accuracy by subset (K&K: by number of people)", columns=("n_prompts", "accuracy", "pass@{k}"),
               rows="{benchmark}/{subset}", doc="Accuracy and pass@k per subset of a benchmark (K&K: people per puzzle).")
register_table("verifier", _verifier, section="Grader check: this suite's verifier against plain math-verify",
               columns=("verifier_disagreement", "verifier_only_suite", "verifier_only_math_verify"),
               listings=("verifier_disagreements",),
               doc="How often this suite's verdict differs from plain math-verify's (and the disagreeing samples).")
register_table("tools", lambda samples, s: tool_table(samples).pipe(lambda t: t if len(t) else None),
               section="Tool use", columns=("exact_match", "tool_calls", "no_answer_share"),
               doc="Exact match, tool calls per episode and the share of episodes without an answer.")
register_table("kinds", lambda samples, s: kind_table(s.tables["passk"], s.kinds) if s.kinds else None,
               section="By task kind", columns=("benchmarks", "pass@{k}", "avg@{n}"), rows="kind/{kind}",
               per_group=False, doc="pass@k and avg@n averaged over the benchmarks of each task kind (unweighted).")
register_table("flip_rates", lambda samples, s: None if s.base_samples is None else
               flip_rates(s.base_samples, samples, None if s["eval.flip_k"] is None else int(s["eval.flip_k"])),
               section="Flip rates against the base model",
               columns=("n_prompts", "solved_from_unsolved", "improved", "regressed"), rows="{benchmark}/flip/{bucket}",
               per_group=False, checks=_check_flip,
               knobs={"eval.flip_k": I(1, null=True, default=None,
                                       doc="null: literal flip rule (no correct sample among all n); k: budget-k reading")},
               doc="Per difficulty bucket of the base model: prompts flipped to solved, improved, regressed.")


def compute_tables(samples: pd.DataFrame, ks, ucc_ks=None, similarity_metric: str | None = None,
                   ucc_threshold: float | None = None, base_samples: pd.DataFrame | None = None,
                   flip_k: int | None = None, kinds: dict | None = None, same_answer: dict | None = None,
                   eval_cfg=None) -> tuple[dict, dict]:
    """Every registered metric table (:data:`TABLES`: the built-ins and plug-ins) and its flat MLflow metrics.

    Args:
        samples: the samples table (see evaluation.evaluate.SAMPLE_COLUMNS).
        ks: pass@k values (each <= the smallest n per prompt), or ``{benchmark: ks}`` when benchmarks have their
            own budgets (per-benchmark decoding, ``eval.decoding``): each group of benchmarks with the same ks and
            n is tabled on its own, the tables joined, and every ``mean`` row recomputed over the benchmarks that
            have the column (unweighted); :func:`budget_metrics` then gives the suite mean at each benchmark's own k.
        ucc_ks: UCC@k values (default: ``eval_cfg.ucc_ks``, else the ks >= 8, or the largest k).
        similarity_metric, ucc_threshold: UCC@k's similarity and threshold (default: ``eval_cfg``'s, else
            rouge_l and 0.7).
        base_samples: the base model's samples on the same prompts, for flip rates.
        flip_k: None for the literal flip rule (unless ``eval_cfg.flip_k`` is set), else the budget-k reading.
        kinds: {benchmark: task kind}; adds the ``kinds`` table (``eval/kind/<kind>/<metric>``).
        same_answer: {benchmark: same(a, b)}, the tasks' answer equivalences for the modes table.
        eval_cfg: the ``eval`` config node (DictConfig or dict): every registered table's knobs (``eval.<key>``)
            are read from it, explicit arguments above taking precedence, else the knob's default.
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
    knobs = knob_values(eval_cfg, {"eval.ucc_ks": ucc_ks, "eval.similarity_metric": similarity_metric,
                                   "eval.ucc_threshold": ucc_threshold, "eval.flip_k": flip_k})
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
            got = e.as_dict(e.compute(samples, TableSettings(ks=tuple(ks), n=n, tables=dict(done), **common)))
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
        out[name] = _with_mean(table) if had_mean else table
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
