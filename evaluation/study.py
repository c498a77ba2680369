"""A study's comparisons (``experiment=cpu_study``, docs/study.md): methods trained with several seeds, each compared
with a baseline method and with the base model on per-prompt values, with paired prompt-bootstrap 95% CIs pooled
over the seeds, and the number of prompts that would resolve each difference.

Everything here is computed from evaluation samples only (each run's logged ``samples.parquet``), so
``python -m evaluation.recompute --study RUNS.json`` recomputes every number the report's study section and
docs/study.md show. The inputs:

- ``samples``: {run label: samples DataFrame} with ``benchmark``, ``prompt_id``, ``sample_idx``, ``correct``,
  ``response`` and (for entropy) ``mean_token_entropy``;
- ``methods``: {method: [labels of its runs, one per training seed]}.

Per-prompt values (one number per (benchmark, prompt) of a run): ``pass@k`` (the unbiased estimator of Chen et al.
2021, Eq. 1, on the prompt's n samples; pass@1 is the share correct), ``ucc@k`` (unique correct clusters among k
samples, :func:`evaluation.metrics.diversity.ucc_at_k`, the QUATRO paper's UCC@k at ROUGE-L >= 0.7) and ``entropy``
(the mean over the prompt's samples of each sample's mean next-token entropy, nats). A method's value is the mean
over its seeds and prompts; differences are method minus reference, paired on the prompts both have.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.metrics.diversity import ucc_at_k
from evaluation.metrics.modes import holm, paired_bootstrap_ci, paired_bootstrap_ci_over_seeds
from evaluation.metrics.passk import pass_at_k

Z_975 = 1.959963984540054  # standard normal quantiles: two-sided 95%
Z_80 = 0.8416212335729143  # and 80% power


def per_prompt(samples: pd.DataFrame, metric: str, similarity_metric: str = "rouge_l",
               threshold: float = 0.7) -> pd.Series:
    """One value per (benchmark, prompt_id) of one run's samples.

    Args:
        samples: one run's samples (n rows per prompt).
        metric: ``pass@k``, ``ucc@k`` (k <= every prompt's n) or ``entropy``.
    Returns:
        float Series indexed by (benchmark, prompt_id), sorted.
    Raises:
        ValueError: an unknown metric, k above a prompt's n, or ``entropy`` without a ``mean_token_entropy`` column.
    """
    groups = samples.sort_values("sample_idx").groupby(["benchmark", "prompt_id"], sort=True)
    if metric == "entropy":
        if "mean_token_entropy" not in samples.columns:
            raise ValueError("metric='entropy': the samples have no mean_token_entropy column (eval.entropy=false)")
        return groups["mean_token_entropy"].mean().astype(float)
    name, _, k = metric.partition("@")
    if name not in ("pass", "ucc") or not k.isdigit() or int(k) < 1:
        raise ValueError(f"metric={metric!r}: expected 'pass@<k>', 'ucc@<k>' or 'entropy'")
    k = int(k)
    n_min = int(groups.size().min())
    if k > n_min:
        raise ValueError(f"metric={metric!r}: k={k} exceeds the n={n_min} samples of a prompt")
    if name == "pass":
        per = groups["correct"].agg(n="size", c="sum")
        return pd.Series(pass_at_k(per["n"].to_numpy(), per["c"].to_numpy(), k), index=per.index, dtype=float)
    return pd.Series({key: float(ucc_at_k(g["response"].tolist(), g["correct"].astype(bool).tolist(), k,
                                          similarity_metric, threshold)) for key, g in groups}, dtype=float)


def seed_matrix(samples: dict, labels: list, metric: str, prompts=None, **kw) -> tuple[np.ndarray, pd.Index]:
    """(S, P) per-prompt values of the runs ``labels`` (one row per seed), on ``prompts`` (default: those every run
    has), for :func:`evaluation.metrics.modes.paired_bootstrap_ci_over_seeds`. ``kw`` goes to :func:`per_prompt`.

    Raises:
        KeyError: a label without samples.
    """
    missing = [lab for lab in labels if lab not in samples]
    if missing:
        raise KeyError(f"runs without samples: {missing}; runs with samples: {sorted(samples)}")
    values = [per_prompt(samples[lab], metric, **kw) for lab in labels]
    if prompts is None:
        prompts = values[0].index
        for v in values[1:]:
            prompts = prompts.intersection(v.index)
    return np.vstack([v.reindex(prompts).to_numpy(dtype=float) for v in values]), prompts


def prompts_needed(diff: float, se: float, n_prompts: int, power: float = 0.8, se_seed: float = 0.0) -> float:
    """Prompts at which a difference ``diff`` would be resolved by a two-sided 95% test with the given power: its
    variance must fall to (|diff| / (z_0.975 + z_power))^2. The prompt part ``se`` (measured on ``n_prompts``
    prompts) shrinks as 1/prompts, the seed part ``se_seed`` does not: n_prompts * se^2 / (target - se_seed^2)
    (with ``se_seed`` 0: the usual normal-approximation sample size n_prompts * ((z_0.975 + z_power) se / |diff|)^2).
    inf when ``diff`` is 0 or the seed part alone is too large (more seeds are needed: :func:`seeds_needed`).

    Raises:
        ValueError: a power other than 0.8 (the only one tabulated here).
    """
    if power != 0.8:
        raise ValueError(f"power={power}: only 0.8 is supported")
    if diff == 0 or not np.isfinite(diff):
        return float("inf")
    target = (abs(diff) / (Z_975 + Z_80)) ** 2
    if se_seed ** 2 >= target:
        return float("inf")
    return float(n_prompts * se ** 2 / (target - se_seed ** 2))


def seeds_needed(diff: float, se_prompts: float, se_seed: float, n_seeds: int) -> float:
    """Training seeds per method at which ``diff`` would be resolved (95%, 80% power) with the same prompts: the
    seed part of the variance ``se_seed^2`` (measured with ``n_seeds`` seeds) shrinks as 1/seeds, the prompt part
    does not: n_seeds * se_seed^2 / (target - se_prompts^2); inf when the prompt part alone is too large, 0 seeds
    more when the difference is resolved without seed variance."""
    if diff == 0 or not np.isfinite(diff):
        return float("inf")
    target = (abs(diff) / (Z_975 + Z_80)) ** 2
    if se_prompts ** 2 >= target:
        return float("inf")
    return float(n_seeds * se_seed ** 2 / (target - se_prompts ** 2))


def _compare(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> dict:
    """The seed-pooled paired CI of a - b, plus the prompt-only part of its spread (seeds averaged first)."""
    ok = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
    a, b = a[:, ok], b[:, ok]
    ci = paired_bootstrap_ci_over_seeds(a, b, n_boot=n_boot, seed=seed)
    prompt_only = paired_bootstrap_ci(a.mean(axis=0), b.mean(axis=0), n_boot=n_boot, seed=seed)
    se = (ci["ci_high"] - ci["ci_low"]) / (2 * Z_975)
    se_prompts = (prompt_only["ci_high"] - prompt_only["ci_low"]) / (2 * Z_975)
    se_seed = float(np.sqrt(max(0.0, se ** 2 - se_prompts ** 2)))
    return {**ci, "se": se, "se_prompts": se_prompts, "se_seed": se_seed,
            "seed_share": se_seed ** 2 / se ** 2 if se > 0 else 0.0,
            "resolved": bool(ci["ci_low"] > 0 or ci["ci_high"] < 0),
            "prompts_needed": prompts_needed(ci["diff"], se_prompts, ci["n_prompts"], se_seed=se_seed),
            "seeds_needed": seeds_needed(ci["diff"], se_prompts, se_seed, max(ci["n_seeds_a"], ci["n_seeds_b"])),
            "scale_needed": float(((Z_975 + Z_80) * se / abs(ci["diff"])) ** 2) if ci["diff"] else float("inf")}


def compare_methods(samples: dict, methods: dict, baseline: str, metrics, n_boot: int = 10_000, seed: int = 0,
                    **kw) -> pd.DataFrame:
    """Each method against ``baseline`` on each metric, pooled over seeds.

    Args:
        samples: {run label: samples}; methods: {method: [run labels, one per seed]}; baseline: a key of ``methods``;
        metrics: per-prompt metrics (:func:`per_prompt`).
    Returns:
        index (method, metric); columns ``mean`` and ``baseline_mean`` (over seeds and prompts), ``diff``,
        ``ci_low``, ``ci_high`` (paired prompt bootstrap pooled over seeds, 95%), ``resolved`` (the CI excludes 0),
        ``se`` (the CI's width / 2 z_0.975), ``se_prompts`` (the same with the seeds averaged first: the prompt
        part), ``se_seed`` (sqrt(se^2 - se_prompts^2): the training seeds' part, which more prompts do not shrink)
        and ``seed_share`` (its share of the variance), ``prompts_needed`` and ``seeds_needed`` (:func:`prompts_needed`,
        :func:`seeds_needed`: the prompts, or the seeds per method, that would resolve the difference at 80% power,
        the other kept), ``scale_needed`` (m = ((z_0.975 + z_0.8) se / |diff|)^2: prompts and seeds both multiplied
        by m would), ``n_prompts``, ``n_seeds_a``, ``n_seeds_b``, ``p_value`` (two-sided bootstrap p of no
        difference), ``p_holm`` and ``resolved_holm`` (Holm-Bonferroni over every row of the table: the family is
        all methods x metrics compared, ``family`` of them; :func:`with_holm`).
    Raises:
        KeyError: an unknown baseline or a run without samples.
    """
    if baseline not in methods:
        raise KeyError(f"baseline {baseline!r} is not a method; methods: {sorted(methods)}")
    rows = {}
    for metric in metrics:
        base_m, prompts = seed_matrix(samples, methods[baseline], metric, **kw)
        for method, labels in methods.items():
            if method == baseline:
                continue
            a, _ = seed_matrix(samples, labels, metric, prompts=prompts, **kw)
            rows[(method, metric)] = {"mean": float(np.nanmean(a)), "baseline_mean": float(np.nanmean(base_m)),
                                      **_compare(a, base_m, n_boot, seed)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    if len(out):
        out.index = pd.MultiIndex.from_tuples(out.index, names=["method", "metric"])
    return with_holm(out)


def with_holm(table: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """``table`` (rows: one family of comparisons, each with a ``p_value``) with ``p_holm`` (Holm-adjusted over all its
    rows, :func:`evaluation.metrics.modes.holm`), ``resolved_holm`` (p_holm < alpha) and ``family`` (the number of
    comparisons corrected for)."""
    if not len(table):
        return table
    adj, rejected = holm(table["p_value"].to_numpy(), alpha)
    return table.assign(p_holm=adj, resolved_holm=rejected, family=int(np.isfinite(table["p_value"]).sum()))


def base_curves(samples: dict, methods: dict, base_label: str, ks, n_boot: int = 10_000, seed: int = 0) -> pd.DataFrame:
    """pass@k of each method against the base model's for every k (Yue et al. 2025's crossing question).

    Returns:
        index (method, k); columns ``mean`` (the method's pass@k over seeds and prompts), ``base``, ``diff``,
        ``ci_low``, ``ci_high``, ``resolved`` and the other columns of :func:`compare_methods` (the base model is
        one "seed": evaluated once; the Holm family: every method x k of the table).
    Raises:
        KeyError: the base label or a run without samples.
    """
    rows = {}
    for k in ks:
        base_m, prompts = seed_matrix(samples, [base_label], f"pass@{k}")
        for method, labels in methods.items():
            a, _ = seed_matrix(samples, labels, f"pass@{k}", prompts=prompts)
            rows[(method, int(k))] = {"mean": float(np.nanmean(a)), "base": float(np.nanmean(base_m)),
                                      **_compare(a, base_m, n_boot, seed)}
    out = pd.DataFrame.from_dict(rows, orient="index")
    if len(out):
        out.index = pd.MultiIndex.from_tuples(out.index, names=["method", "k"])
    return with_holm(out)


def crossings(curves: pd.DataFrame) -> pd.DataFrame:
    """Per method, where its pass@k curve crosses the base model's (from :func:`base_curves`).

    Returns:
        index method; ``above_at`` (the k values where the method is above the base, CI resolved), ``below_at``
        (below, resolved), ``crosses`` ("yes": resolved above at some k and resolved below at a larger k; "not
        resolved": the point estimate changes sign but the CIs do not both exclude 0; "no"), and
        ``first_k_below`` (the smallest k with a negative point difference, or None).
    """
    rows = {}
    for method, grp in curves.groupby(level="method", sort=False):
        grp = grp.droplevel("method").sort_index()
        above = [int(k) for k, r in grp.iterrows() if r["resolved"] and r["diff"] > 0]
        below = [int(k) for k, r in grp.iterrows() if r["resolved"] and r["diff"] < 0]
        neg = [int(k) for k, r in grp.iterrows() if r["diff"] < 0]
        pos = [int(k) for k, r in grp.iterrows() if r["diff"] > 0]
        if above and below and min(below) > min(above):
            crosses = "yes"
        elif pos and neg and min(neg) > min(pos):
            crosses = "not resolved"
        else:
            crosses = "no"
        rows[method] = {"above_at": above, "below_at": below, "crosses": crosses,
                        "first_k_below": min(neg) if neg else None}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def study_tables(samples: dict, methods: dict, baseline: str, base_label: str | None, ks, n_boot: int = 10_000,
                 seed: int = 0, **kw) -> dict[str, pd.DataFrame]:
    """The study's three tables: ``comparisons`` (each method vs ``baseline`` on pass@1, pass@K, UCC@K and entropy,
    K = the largest of ``ks``; entropy left out when a run has none), ``base_curves`` and ``crossings`` (empty
    without a base model). ``kw`` goes to :func:`per_prompt` (similarity metric and threshold of UCC@k)."""
    K = max(ks)
    metrics = ["pass@1", f"pass@{K}", f"ucc@{K}"]
    runs = [lab for labels in methods.values() for lab in labels]
    if all("mean_token_entropy" in samples[lab].columns and samples[lab]["mean_token_entropy"].notna().any()
           for lab in runs):
        metrics.append("entropy")
    out = {"comparisons": compare_methods(samples, methods, baseline, metrics, n_boot, seed, **kw)}
    if base_label is not None and base_label in samples:
        curves = base_curves(samples, methods, base_label, ks, n_boot, seed)
        out["base_curves"], out["crossings"] = curves, crossings(curves)
    else:
        out["base_curves"], out["crossings"] = pd.DataFrame(), pd.DataFrame()
    return out


def write_manifest(path, samples_files: dict, methods: dict, baseline: str, base_label: str | None, ks,
                   similarity_metric: str = "rouge_l", threshold: float = 0.7) -> Path:
    """Write the study manifest ``python -m evaluation.recompute --study`` reads: the samples file of every run
    (paths relative to the manifest), the methods and their seeds' runs, the baseline, the base model's run and the
    k values. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = {lab: os.path.relpath(Path(f).resolve(), path.parent.resolve()) for lab, f in samples_files.items()}
    path.write_text(json.dumps({"samples": rel, "methods": methods, "baseline": baseline, "base": base_label,
                                "ks": [int(k) for k in ks], "similarity_metric": similarity_metric,
                                "ucc_threshold": threshold}, indent=1))
    return path


def read_manifest(path) -> tuple[dict, dict]:
    """(the manifest's fields, {run label: samples DataFrame}).

    Raises:
        ValueError: a field missing, or a samples file that cannot be read (named).
    """
    path = Path(path)
    man = json.loads(path.read_text())
    missing = [k for k in ("samples", "methods", "baseline", "ks") if k not in man]
    if missing:
        raise ValueError(f"{path}: not a study manifest (fields {missing} are missing)")
    samples = {}
    for lab, f in man["samples"].items():
        try:
            samples[lab] = pd.read_parquet(path.parent / f)
        except Exception as e:
            raise ValueError(f"{path.parent / f} (run {lab!r}): cannot be read as a samples table "
                             f"({type(e).__name__})") from e
    return man, samples


def formatted(comparisons: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """:func:`compare_methods`' table as the report and docs/study.md show it (strings, 4 decimals): method mean,
    baseline mean, difference with its 95% CI, resolved, resolved after Holm's correction over the table's
    comparisons (with the adjusted p), and for an unresolved difference what would resolve it at
    80% power: the prompts with the same seeds, or the seeds per method with the same prompts, or, where the other
    part of the variance alone is too large for either, both scaled together; seeds."""
    c = comparisons
    return pd.DataFrame({
        "method mean": c["mean"].map("{:.4f}".format), f"{baseline} mean": c["baseline_mean"].map("{:.4f}".format),
        "difference [95% CI]": [f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}]" for d, lo, hi in zip(c["diff"], c["ci_low"], c["ci_high"])],
        "resolved": c["resolved"].map({True: "yes", False: "no"}),
        **({f"Holm ({int(c['family'].iloc[0])} comparisons)": [f"{'yes' if r else 'no'} (p={p:.3g})" for r, p in
                                                               zip(c["resolved_holm"], c["p_holm"])]}
           if "p_holm" in c and len(c) else {}),
        "to resolve at 80% power": [_to_resolve(r) for _, r in c.iterrows()],
        "seeds": [f"{a} vs {b}" for a, b in zip(c["n_seeds_a"], c["n_seeds_b"])]}, index=c.index)


def _to_resolve(r) -> str:
    """"-" for a resolved difference, else "N prompts", "N seeds", "N prompts or M seeds", or "N prompts and M seeds"
    (both multiplied by ``scale_needed``) when neither alone can."""
    if r["resolved"]:
        return "-"
    if not np.isfinite(r["scale_needed"]):
        return "no difference"
    options = []
    if np.isfinite(r["prompts_needed"]):
        options.append(f"{int(np.ceil(r['prompts_needed'])):,} prompts")
    if np.isfinite(r["seeds_needed"]):
        options.append(f"{max(int(r['n_seeds_a']), int(np.ceil(r['seeds_needed']))):,} seeds")
    if options:
        return " or ".join(options)
    m = r["scale_needed"]
    return (f"{int(np.ceil(m * r['n_prompts'])):,} prompts and "
            f"{int(np.ceil(m * max(r['n_seeds_a'], r['n_seeds_b']))):,} seeds")


def formatted_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """:func:`base_curves`' table as shown: rows methods, one column per k, each ``pass@k (difference from the base
    model [95% CI])``, `` *`` where the difference stays resolved after Holm's correction over the table's methods x
    k; a first row with the base model's pass@k."""
    ks = sorted(set(curves.index.get_level_values("k")))
    rows = {"base model": {f"pass@{k}": f"{curves.xs(k, level='k')['base'].iloc[0]:.4f}" for k in ks}}
    for method in dict.fromkeys(curves.index.get_level_values("method")):
        g = curves.xs(method, level="method")
        rows[method] = {f"pass@{k}": f"{g.loc[k, 'mean']:.4f} ({g.loc[k, 'diff']:+.4f} [{g.loc[k, 'ci_low']:+.4f}, "
                                      f"{g.loc[k, 'ci_high']:+.4f}]){' *' if g.get('resolved_holm', {}).get(k) else ''}"
                        for k in ks}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("method")


def to_markdown(df: pd.DataFrame) -> str:
    """A pipe table of ``df`` (index levels first), for docs pages."""
    names = [n or "" for n in df.index.names]
    head = "| " + " | ".join([*names, *map(str, df.columns)]) + " |"
    rule = "| " + " | ".join("---" for _ in range(len(names) + len(df.columns))) + " |"
    body = []
    for idx, row in df.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        body.append("| " + " | ".join([*map(str, idx), *map(str, row.tolist())]) + " |")
    return "\n".join([head, rule, *body])
