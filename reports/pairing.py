"""Which run is compared with which: the one pairing rule of every section that compares runs (the summary, the
differences against the baseline, ExPPO's Table 2B), and the Holm correction of a table of comparisons.

A comparison differs in one factor only. The baseline (``report.baseline``, ``--baseline``) names the base model's
row, one run (its label), or an algorithm. An algorithm is matched **per level** of the sweep's other factors: the
factors (:func:`factors`: the swept keys outside the algorithm's own, ``train.rollout.correction``, ``seed``, ...)
on which the baseline algorithm's runs take several values are the levels, and each run is compared with the
baseline's run at its own level (QUATRO at correction=none against GRPO at correction=none, and again at
token_tis). A factor the baseline's runs take one value of (a key the algorithm ignores, such as ``delta`` for
GRPO, whose points are one run) does not split. The base model is matched per evaluation protocol.

Whatever the baseline, a pair is never formed across evaluation protocols (``rlvr.eval_protocol_id``): runs recorded
before the protocol tag existed pair only with each other. Each run not compared is named with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from . import data


@dataclass(frozen=True)
class Pair:
    """One comparison: ``run`` against ``against`` (run labels), at ``level`` (the other factors' shared values,
    ``correction=none``; empty when the baseline splits on none)."""
    run: str
    against: str
    level: str = ""


def factors(runs: pd.DataFrame) -> list[str]:
    """The sweep's factors besides the algorithm: the swept keys (:func:`reports.data.swept_params`) outside
    ``algo.*``."""
    return [k for k in data.swept_params(runs) if not k.startswith("algo.")]


def _short(key: str) -> str:
    return key if key.startswith("eval.") else key.split(".")[-1]


def pair_runs(runs: pd.DataFrame, baseline: str | None) -> tuple[list[Pair], dict[str, str]]:
    """The comparisons of ``runs`` (labelled, :func:`reports.data.short_labels`; the evaluated runs) with
    ``baseline`` (a label, an algorithm, or the base model's label), by the rule of this module.

    Returns:
        (the pairs, in the order of ``runs``; {label: why it is not compared} for the runs left out).
    """
    if baseline is None or runs.empty:
        return [], {}
    rows = {lab: r for lab, r in zip(runs["label"], runs.to_dict("records"))}
    protos = data.protocols(runs)
    if baseline in rows and rows[baseline]["kind"] == "base":
        return _against_bases(runs, protos)
    refs = [baseline] if baseline in rows else [lab for lab, r in rows.items()
                                                 if r["algo"] == baseline and r["kind"] != "base"]
    if not refs:
        return [], {}
    levels = [k for k in factors(runs) if len({str(rows[ref]["params"].get(k)) for ref in refs}) > 1]
    pairs, refused = [], {}
    for lab, r in rows.items():
        if lab in refs or r["kind"] == "base":
            continue
        at = [ref for ref in refs if all(rows[ref]["params"].get(k) == r["params"].get(k) for k in levels)]
        level = " ".join(f"{_short(k)}={r['params'].get(k)}" for k in levels)
        same = [ref for ref in at if protos.get(ref) == protos.get(lab)]
        if same:
            pairs.append(Pair(lab, same[0], level))
        elif at:
            than = "" if at[0] == baseline else f" than {at[0]}"
            refused[lab] = (f"evaluated under another protocol{than} "
                            f"({data.protocol_difference(runs, lab, at[0])})" if protos.get(lab) and protos.get(at[0])
                            else f"{'it' if protos.get(at[0]) else at[0]} was evaluated before evaluation protocols "
                                 f"were recorded, so it pairs only with runs of that time")
        else:
            refused[lab] = f"no {baseline} run at {level}" if level else f"no {baseline} run to compare with"
    return pairs, refused


def _against_bases(runs: pd.DataFrame, protos: dict) -> tuple[list[Pair], dict[str, str]]:
    """Every trained run against the base model evaluated under its own protocol."""
    bases = data.base_by_protocol(runs)
    pairs, refused = [], {}
    for lab, kind in zip(runs["label"], runs["kind"]):
        if kind == "base":
            continue
        against = bases.get(protos.get(lab))
        if against is None:
            refused[lab] = "no base model was evaluated under its protocol"
        else:
            pairs.append(Pair(lab, against))
    return pairs, refused


def differences(samples: dict, pairs: list[Pair], metric: str = "accuracy", n_boot: int = 2000,
                alpha: float = 0.05) -> pd.DataFrame:
    """Per pair with samples on both sides: the mean difference of per-prompt ``metric`` (run minus ``against``) on
    the prompts both share, its paired prompt-bootstrap 95% CI and p-value
    (:func:`evaluation.metrics.modes.paired_bootstrap_ci_over_seeds` with one seed each, which is
    :func:`~evaluation.metrics.modes.paired_bootstrap_ci` on the same draws), and Holm's adjustment over the table's
    comparisons (:func:`evaluation.study.with_holm`: ``p_holm``, ``resolved_holm``, ``family``, the number of
    comparisons corrected for).

    Returns:
        index run label; columns ``against``, ``level``, ``difference``, ``ci_low``, ``ci_high``, ``prompts``,
        ``p_value``, ``p_holm``, ``resolved_holm``, ``family``. Empty without a pair with samples.
    """
    from evaluation.metrics.modes import paired_bootstrap_ci_over_seeds
    from evaluation.study import with_holm
    from evaluation.tables import per_prompt_values

    rows = {}
    for p in pairs:
        if p.run not in samples or p.against not in samples:
            continue
        ref, vals = per_prompt_values(samples[p.against], metric), per_prompt_values(samples[p.run], metric)
        common = ref.index.intersection(vals.index)
        if len(common) == 0:
            continue
        ci = paired_bootstrap_ci_over_seeds(vals.loc[common].to_numpy()[None, :], ref.loc[common].to_numpy()[None, :],
                                            n_boot=n_boot, alpha=alpha)
        rows[p.run] = {"against": p.against, "level": p.level, "difference": ci["diff"], "ci_low": ci["ci_low"],
                       "ci_high": ci["ci_high"], "prompts": int(ci["n_prompts"]), "p_value": ci["p_value"]}
    if not rows:
        return pd.DataFrame()
    out = with_holm(pd.DataFrame.from_dict(rows, orient="index"), alpha)
    out["p_value"] = out["p_value"].astype(float)
    return out.rename_axis("run")


def holm_note(table: pd.DataFrame, what: str) -> str:
    """One line naming the Holm family of ``table`` (:func:`differences`), empty for fewer than two comparisons."""
    n = int(table["family"].iloc[0]) if len(table) and "family" in table else 0
    return (f"{what}: Holm-Bonferroni over the {n} comparisons of this table (resolved_holm: adjusted p < 0.05)."
            if n > 1 else "")


def levels_of(pairs: list[Pair]) -> list[str]:
    """The distinct levels of ``pairs``, in order."""
    return list(dict.fromkeys(p.level for p in pairs))



def method_pairs(runs: pd.DataFrame, methods: dict, baseline: str | None) -> tuple[dict, dict[str, str]]:
    """:func:`pair_runs` over methods (a run's seeds pooled: ``methods`` = {method: [run labels]},
    :func:`reports.seed_groups.seed_group`), each standing as its first run without the training seed.

    Returns:
        ({method: its reference method}, {method: why it is not compared}).
    """
    from .seed_groups import seed_group

    if baseline is None or not methods:
        return {}, {}
    first = {labs[0]: m for m, labs in methods.items()}
    rows = runs[runs["label"].isin(list(first))].copy()
    rows["label"] = [first[lab] for lab in rows["label"]]
    rows["params"] = [{k: v for k, v in p.items() if k != "seed"} for p in rows["params"]]
    spec = seed_group(baseline) if seed_group(baseline) in methods else baseline
    pairs, refused = pair_runs(rows, spec)
    return {p.run: p.against for p in pairs}, refused
