"""The seed papers' tables as report sections (``report.sections``: each experiment preset names the ones its paper
reproduces; the report shows them first, in the paper's layout: rows = methods, columns as the paper has them).

Each table registers itself by name (:func:`reports.sections.paper_table`) with its title (the paper's table or
figure number) and a builder that turns the sweep's runs into that table from what the sweep has (one learning rate, one temperature, one seed: the
table still draws, with what there is); when the sweep lacks the data altogether the builder returns an empty
frame and the report names the key to sweep (``needs``). Every builder reads only the data functions of
:mod:`reports.data`, so a section's numbers are the ones the generic sections show. A paper topic that also has a
figure in the report body (QUATRO's staleness and advantage, ExPPO's coverage, the cost) is one section in its own file
with both; the body part that lists these tables is :data:`paper_tables` below.
"""
from __future__ import annotations

import pandas as pd

from .. import data, load, render
from ..seed_groups import seed_aggregate
from . import _tables, paper_table, register_section

# ------------------------------------------------------------------------------------------------- QUATRO

@paper_table("quatro_passk", "QUATRO Table 1: pass@k by method", "eval.ks (k up to 256 in eval=paper)")
def _quatro_passk(ctx):
    return _tables.mean_passk(ctx)


@paper_table("quatro_ucr", "QUATRO Table 2: UCC@k and UCR at T = 1.0 and 1.5", "eval.extra_temperatures=[1.5]")
def _quatro_ucr(ctx):
    temps = data.temperature_table(ctx.shown)
    if len(temps):
        return temps
    ucc = data.metric_table(ctx.shown, "ucc")  # the main temperature only: the sweep has no extra one
    return ucc.xs("mean", level="benchmark") if len(ucc) and "mean" in ucc.index.get_level_values(-1) else ucc


@paper_table("quatro_entropy", "QUATRO Table 3: final entropy (nats per token)", "eval.entropy=true")
def _quatro_entropy(ctx):
    return data.metric_table(ctx.shown, "entropy")


@paper_table("quatro_similarity", "QUATRO Fig. 5: similarity among correct responses", "eval.n >= 2")
def _quatro_similarity(ctx):
    return data.metric_table(ctx.shown, "similarity")


@paper_table("quatro_flip_rates", "QUATRO Fig. IV: flip rates by difficulty under the base model", "eval.base=true")
def _quatro_flips(ctx):
    return data.flip_table(ctx.done)


@paper_table("quatro_log_ratio", "QUATRO appendix A.3: the -sg[log s] term (reversed share, sequence ratios, "
                  "pass@k)", "the arms of sweeps/quatro_arm/")
def _quatro_log_ratio(ctx):
    t = _tables.train_means(ctx, ["train/reversed_share", "train/seq_ratio_mean", "train/seq_ratio_max", "train/clip_fraction"])
    p = _tables.mean_passk(ctx)
    return t.join(p, how="outer") if len(t) else t


@paper_table("quatro_lambda", "QUATRO: the dual variable lambda* over training (mean per step)", "algo=quatro")
def _quatro_lambda(ctx):
    return _tables.per_step(ctx, "train/lambda_mean")


@paper_table("quatro_group_size", "QUATRO: pass@k and UCR by group size G", "train.group_size")
def _quatro_group_size(ctx):
    p = _tables.mean_passk(ctx)
    ucc = data.metric_table(ctx.shown, "ucc")
    if len(ucc) and "mean" in ucc.index.get_level_values(-1):
        p = p.join(ucc.xs("mean", level="benchmark")[["ucr"]] if "ucr" in ucc.columns else pd.DataFrame(), how="left")
    return _tables.with_params(p, ctx.runs, ["train.group_size"]) if len(p) else p


@paper_table("quatro_code", "QUATRO Table 4: code pass@k by benchmark", "eval=code")
def _quatro_code(ctx):
    return _tables.by_benchmark(ctx)


# ------------------------------------------------------------------------------------------------- ExPPO

@paper_table("exppo_passk", "ExPPO Tables 3 and 4: pass@k at each benchmark's budget", "eval=exppo")
def _exppo_passk(ctx):
    return _tables.by_benchmark(ctx)


@paper_table("exppo_shared_d", "ExPPO Table 2B: disagreement D on the Shared set, Delta-D against the baseline",
                  "report.baseline and prompts with two or more correct samples in every run")
def _exppo_shared_d(ctx):
    return _tables.shared_d(ctx)


@paper_table("exppo_decoding_seeds", "ExPPO Table 3: mean ± std over decoding seeds", "eval.seed=0,1,2")
def _exppo_decoding_seeds(ctx):
    return seed_aggregate(data.passk_table(ctx.shown), key="eval.seed")


@paper_table("training_seeds", "Mean ± std over training seeds (the papers' three-seed tables)", "seed=0,1,2")
def _training_seeds(ctx):
    return seed_aggregate(data.passk_table(ctx.shown), key="seed")


@paper_table("exppo_lambda_grid", "ExPPO Table 9: pass@k by the shaping strength lambda", "exppo_lambda")
def _exppo_lambda(ctx):
    p = _tables.mean_passk(ctx)
    return _tables.with_params(p, ctx.runs, ["algo.advantage.lam"]) if len(p) else p


@paper_table("exppo_components", "ExPPO Table 9: component ablation (pass@k by arm)", "the arms of sweeps/exppo_part/")
def _exppo_components(ctx):
    return _tables.mean_passk(ctx)


@paper_table("exppo_modes", "ExPPO: answer modes (observed and effective yield, disagreement)", "eval.n >= 2")
def _exppo_modes(ctx):
    return data.metric_table(ctx.shown, "modes")


# ------------------------------------------------------------------------------------------------- TR-GRPO

@paper_table("trgrpo_kk", "TR-GRPO Table 1: Knights-and-Knaves accuracy by number of people", "data=kk eval=kk")
def _trgrpo_kk(ctx):
    return data.subset_table(ctx.shown)


@paper_table("trgrpo_weights", "TR-GRPO Table 4 and Fig. 2: weight ablations (accuracy by number of people)",
                  "algo=tr_grpo_equal,tr_grpo_random,tr_grpo_reverse")
def _trgrpo_weights(ctx):
    return data.subset_table(ctx.shown)


@paper_table("trgrpo_sensitivity", "TR-GRPO Table 7: sensitivity to tau and to the bounds (L, U)",
                  "the points of sweeps/trgrpo_point/")
def _trgrpo_sensitivity(ctx):
    t = data.subset_table(ctx.shown)
    if t.empty:
        t = _tables.mean_passk(ctx)
    else:
        t = t.assign(mean=t.mean(axis=1))
    return _tables.with_params(t, ctx.runs, ["algo.policy_loss.tau", "algo.policy_loss.low", "algo.policy_loss.high"]) \
        if len(t) else t


@paper_table("trgrpo_tokens", "TR-GRPO Fig. 1: the most frequent sampled tokens ranked by mean probability",
                  "engine=local (it logs token_probs.csv for every trained run)")
def _trgrpo_tokens(ctx):
    return load.token_prob_table(ctx.tracking_uri, ctx.done)


@paper_table("trgrpo_math", "TR-GRPO Table 2: math (greedy accuracy, avg@16, pass@16 by benchmark)",
                  "eval=trgrpo_math")
def _trgrpo_math(ctx):
    return _tables.by_benchmark(ctx)


@paper_table("trgrpo_search", "TR-GRPO Table 3: search agents (exact match, tool calls)", "eval=search")
def _trgrpo_search(ctx):
    return data.metric_table(ctx.shown, "tools")


@paper_table("trgrpo_dynamics", "TR-GRPO Fig. 3: gradient norm and reward over training", "a trained run")
def _trgrpo_dynamics(ctx):
    parts = {name: _tables.per_step(ctx, key) for name, key in (("grad_norm", "train/grad_norm"), ("reward", "train/reward_mean"))}
    parts = {k: v for k, v in parts.items() if len(v)}
    return pd.concat(parts, axis=1) if parts else pd.DataFrame()


# ------------------------------------------------------------------------------------------------- the body's part

def _show_paper_tables(ctx, page) -> None:
    """Each table the sweep names (``ctx.paper``), titled with the paper's number, or what to sweep for it."""
    from . import build_section, is_empty, paper_names

    if not ctx.paper:
        page.note("This sweep names no paper tables (report.sections; every paper preset sets its paper's).")
        return
    for name in ctx.paper:
        sec, tab = build_section(name, ctx)
        if sec is None:
            page.html(f'<h3 id="paper-{name}">{name}</h3>')
            page.note(f"No paper section is called {name!r}; the known ones: {', '.join(paper_names())}.")
            continue
        page.html(f'<h3 id="paper-{name}">{sec.title}</h3>')
        if is_empty(tab):
            page.html(f'<p class="paper-missing" data-section="{name}"><em>This sweep has no data for it: sweep '
                      f'{sec.needs}.</em></p>')
        else:
            page.html(f'<div class="paper-table" data-section="{name}" style="overflow-x:auto">'
                      + tab.to_html(float_format=render.paper_number, na_rep="-") + "</div>")
            page.export(tab, f"paper_{name}")


paper_tables = register_section(
    "paper_tables", "The paper's tables", order=20, show=_show_paper_tables,
    doc="The tables of the paper the sweep reproduces (`report.sections`, set by every paper preset), in the paper's "
        "layout, each titled with the paper's table or figure number; each drawn from what the sweep has, or, where the "
        "sweep lacks the data, naming the key to sweep. The sections below show every metric in full.")
