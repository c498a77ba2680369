"""The report's first screen: what was compared, on what evaluation protocol, the main differences against the
baseline and the base model with paired prompt-bootstrap 95% CIs, what is and is not resolved, and every protocol or
provenance warning (the sections below give each number in full)."""
from __future__ import annotations

import pandas as pd

from .. import data, load, pairing
from ..seed_groups import eval_seed_note
from . import register_section

#: the table's HTML id: the report test finds it in the browser's first screen
TABLE_ID = "rlvr-summary"


def _ci(row) -> str:
    return f"{row['difference']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]"


def _resolved(row) -> str:
    if row["ci_low"] > 0:
        return "yes, above"
    if row["ci_high"] < 0:
        return "yes, below"
    return "no"


def summary_table(ctx) -> tuple[pd.DataFrame, list[str]]:
    """(one row per evaluated run: pass@1 and pass@K over the benchmarks' mean, the per-prompt accuracy difference
    against the baseline and against the base model under the run's protocol, each with its 95% CI and whether the CI
    excludes 0; the comparisons that could not be made, one line each)."""
    shown = ctx.shown
    if shown.empty:
        return pd.DataFrame(), []
    passk = data.passk_table(shown)
    mean = passk.xs("mean", level="benchmark") if len(passk) and "mean" in passk.index.get_level_values(
        "benchmark") else pd.DataFrame()
    table = pd.DataFrame(index=pd.Index(list(shown["label"]), name="run"))
    cols = [c for c in mean.columns if c.startswith("pass@")]
    for c in ([cols[0], cols[-1]] if len(cols) > 1 else cols):
        table[c] = [mean[c].get(lab) if lab in mean.index else None for lab in table.index]
    notes: list[str] = []
    samples = ctx.samples
    comparisons = []
    spec, base = ctx.baseline_spec(), load.base_label(ctx.runs)
    if spec is not None and spec != base:
        comparisons.append((f"vs {spec}", spec))
    if base is not None:
        comparisons.append(("vs base model", base))
    for title, ref in comparisons:  # one rule for who is compared with whom (reports/pairing.py)
        pairs, refused = pairing.pair_runs(shown, ref)
        diffs = pairing.differences(samples, pairs)
        table[f"{title} (95% CI)"] = [_ci(diffs.loc[lab]) if lab in diffs.index else None for lab in table.index]
        table[f"resolved {title}"] = [_resolved(diffs.loc[lab]) if lab in diffs.index else None for lab in table.index]
        if len(diffs) > 1:
            table[f"resolved {title} (Holm)"] = [
                ("yes" if diffs.loc[lab, "resolved_holm"] else "no") if lab in diffs.index else None for lab in table.index]
            notes.append(pairing.holm_note(diffs, f"resolved {title} (Holm)"))
        if pairing.levels_of(pairs) != [""]:
            levels = pairing.levels_of(pairs)
            if len(levels) > 1:
                notes.append(f"{title}: each run against {ref} at its own level ({'; '.join(levels)}).")
        for run, why in refused.items():
            notes.append(f"{run} is not compared {title.replace('vs', 'with')}: {why}.")
    seeds = eval_seed_note(shown)
    if seeds:
        notes.append(seeds)
    return table, notes


def _protocol_lines(ctx) -> list[str]:
    from evaluation.protocol import of_tags, summary

    groups: dict = {}
    for lab, t in zip(ctx.shown["label"], ctx.shown["tags"]):
        proto = of_tags(t)
        groups.setdefault(summary(proto) if proto else "not recorded (runs logged before protocols were)", []).append(lab)
    if len(groups) == 1:
        return [f"**Evaluation protocol** (every run): {next(iter(groups))}."]
    return [f"**Evaluation protocol** {i}: {text} ({', '.join(labs)})" for i, (text, labs) in enumerate(groups.items(), 1)]


def _show(ctx, page) -> None:
    runs = ctx.runs
    if runs.empty:
        page.note("This experiment has no runs yet: there is nothing to report.")
        return
    done = ctx.done
    failed = int((runs["status"] == "FAILED").sum())
    killed = int((runs["status"] == "KILLED").sum())
    reused = runs[runs["reused_from"].notna()] if "reused_from" in runs else runs.iloc[:0]
    algos = list(dict.fromkeys(a for a, k in zip(done["algo"], done["kind"]) if k == "trained"))
    page.markdown(
        f"**Compared**: {len(done)} trained point(s) ({', '.join(algos) or 'none'}) and "
        f"{int(((runs['kind'] == 'base') & (runs['status'] == 'FINISHED')).sum())} base-model evaluation(s) "
        f"(*Initialization*) of experiment `{ctx.experiment}` at `{ctx.tracking_uri}`; baseline `{ctx.baseline_spec() or 'none'}`"
        + (f"; {len(reused)} point(s) reuse an identical earlier run's numbers (run table: *reuses*)" if len(reused) else "")
        + (f"; {failed} failed" if failed else "") + (f", {killed} stopped" if killed else "") + ".")
    for line in _protocol_lines(ctx) if len(ctx.shown) else []:
        page.markdown(line)
    table, notes = summary_table(ctx)
    if table.empty:
        page.note("No run of this experiment finished training and evaluation" + (
            ": see the run table for the failures." if failed else "."))
    else:
        page.table(table, "summary", html_id=TABLE_ID, fmt=".4f")
        cmp_cols = [c for c in table.columns if c.startswith("resolved ") and not c.endswith("(Holm)")]
        n_cmp = int(table[cmp_cols].notna().sum().sum()) if cmp_cols else 0
        n_res = int(table[cmp_cols].isin(["yes, above", "yes, below"]).sum().sum()) if cmp_cols else 0
        if n_cmp:
            page.markdown(f"Per-prompt accuracy (pass@1) differences with paired prompt-bootstrap 95% CIs: {n_res} of "
                          f"{n_cmp} comparisons resolved (the CI excludes 0); about {0.05 * n_cmp:.1f} would be by "
                          "chance alone at 95%. Not resolved does not mean equal: the sections below say how many "
                          "prompts or seeds would resolve a difference.")
    for line in notes + data.provenance_warnings(runs) + data.lora_notes(runs):
        page.note(line)
    for problem in ctx.sample_problems:  # named once here; the per-sample sections leave the run out
        page.note(f"Left out of every per-sample section: {problem}")


register_section("summary", "Summary", order=0, show=_show, collapsible=False)
