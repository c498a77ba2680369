"""The seed papers' tables as report sections (``report.sections``: each experiment preset names the ones its paper
reproduces; the report shows them first, in the paper's layout: rows = methods, columns as the paper has them).

Each section registers itself by name with its title (the paper's table or figure number) and a builder that
turns the sweep's runs into that table from what the sweep has (one learning rate, one temperature, one seed: the
table still draws, with what there is); when the sweep lacks the data altogether the builder returns an empty
frame and the report names the key to sweep (``needs``). Every builder reads only the data functions of
:mod:`reports.data`, so a section's numbers are the ones the generic sections show.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from . import data as R


@dataclass
class Context:
    """What a section builder reads: the runs (:func:`reports.data.load_runs`, labelled), the evaluated runs
    (``shown``: base model first), the finished trained runs (``done``), the store, each run's samples and the
    baseline. Training histories and samples are fetched once, on first use."""
    runs: pd.DataFrame
    shown: pd.DataFrame
    done: pd.DataFrame
    tracking_uri: str
    samples_fn: Callable[[], dict] = dict  # {run label: samples}, called once on first use (a download)
    baseline: str | None = None
    _hist: dict | None = None
    _samples: dict | None = None

    @property
    def samples(self) -> dict:
        if self._samples is None:
            self._samples = self.samples_fn()
        return self._samples

    def hist(self) -> dict:
        if self._hist is None:
            keys = list(dict.fromkeys(R.train_panels() + R.COST_KEYS + ["train/seq_ratio_mean", "train/seq_ratio_max"]))
            self._hist = R.histories(self.tracking_uri, self.done, keys=keys) if len(self.done) else {}
        return self._hist


@dataclass(frozen=True)
class PaperSection:
    """A paper's table: ``title`` names the paper and its table or figure number; ``build(ctx) -> DataFrame`` (empty:
    the sweep lacks the data); ``needs``: what to sweep then."""
    name: str
    title: str
    build: Callable[[Context], pd.DataFrame]
    needs: str


SECTIONS: dict[str, PaperSection] = {}


def register_section(name: str, title: str, needs: str):
    """Decorator: register ``build`` as the paper section ``name`` (a ``report.sections`` entry).

    Raises:
        ValueError: the name is taken.
    """
    def deco(build):
        if name in SECTIONS:
            raise ValueError(f"paper section {name!r} is already registered")
        SECTIONS[name] = PaperSection(name, title, build, needs)
        return build
    return deco


def _mean_passk(ctx: Context) -> pd.DataFrame:
    """pass@k (and avg@n) of the mean over benchmarks, rows = runs (the base model first)."""
    p = R.passk_table(ctx.shown)
    return p.xs("mean", level="benchmark") if len(p) and "mean" in p.index.get_level_values("benchmark") else pd.DataFrame()


def _by_benchmark(ctx: Context) -> pd.DataFrame:
    """pass@k per benchmark side by side: rows = runs, columns (benchmark, pass@k)."""
    p = R.passk_table(ctx.shown)
    if p.empty:
        return p
    wide = p.unstack("benchmark").swaplevel(axis=1)
    benches = [b for b in dict.fromkeys(p.index.get_level_values("benchmark")) if b != "mean"] + ["mean"]
    return wide.reindex(columns=[c for b in benches for c in wide.columns if c[0] == b])


def _with_params(table: pd.DataFrame, runs: pd.DataFrame, keys) -> pd.DataFrame:
    """``table`` (indexed by run label) with the runs' values of the config ``keys`` as leading columns."""
    if table.empty:
        return table
    params = {lab: p for lab, p in zip(runs["label"], runs["params"])}
    lead = pd.DataFrame({k.split(".")[-1]: [params.get(lab, {}).get(k, "") for lab in table.index] for k in keys},
                        index=table.index)
    return pd.concat([lead, table], axis=1)


def _train_means(ctx: Context, keys) -> pd.DataFrame:
    """Rows = trained runs, columns = the mean over steps of the training metrics ``keys`` that were logged."""
    summary = R.train_summary({k: v for k, v in ctx.hist().items() if k in keys})
    summary.index.name = "run"
    return summary


def _per_step(ctx: Context, key: str) -> pd.DataFrame:
    """Rows = trained runs, columns = steps: the training metric ``key``."""
    series = ctx.hist().get(key, {})
    if not series:
        return pd.DataFrame()
    return pd.DataFrame({lab: pd.Series(v, index=s) for lab, (s, v) in series.items()}).T.rename_axis("run")


# ------------------------------------------------------------------------------------------------- QUATRO

@register_section("quatro_passk", "QUATRO Table 1: pass@k by method", "eval.ks (k up to 256 in eval=paper)")
def _quatro_passk(ctx):
    return _mean_passk(ctx)


@register_section("quatro_ucr", "QUATRO Table 2: UCC@k and UCR at T = 1.0 and 1.5", "eval.extra_temperatures=[1.5]")
def _quatro_ucr(ctx):
    temps = R.temperature_table(ctx.shown)
    if len(temps):
        return temps
    ucc = R.metric_table(ctx.shown, "ucc")  # the main temperature only: the sweep has no extra one
    return ucc.xs("mean", level="benchmark") if len(ucc) and "mean" in ucc.index.get_level_values(-1) else ucc


@register_section("quatro_entropy", "QUATRO Table 3: final entropy (nats per token)", "eval.entropy=true")
def _quatro_entropy(ctx):
    return R.metric_table(ctx.shown, "entropy")


@register_section("quatro_similarity", "QUATRO Fig. 5: similarity among correct responses", "eval.n >= 2")
def _quatro_similarity(ctx):
    return R.metric_table(ctx.shown, "similarity")


@register_section("quatro_flip_rates", "QUATRO Fig. IV: flip rates by difficulty under the base model", "eval.base=true")
def _quatro_flips(ctx):
    return R.flip_table(ctx.done)


@register_section("quatro_staleness", "QUATRO Fig. 1 and 4: clip fraction, entropy and reward by inner epochs and "
                  "learning rate (means over steps)", "train.ppo_epochs")
def _quatro_staleness(ctx):
    t = _train_means(ctx, ["train/clip_fraction", "train/entropy", "train/reward_mean", "train/seq_ratio_mean"])
    return _with_params(t, ctx.runs, ["train.ppo_epochs", "train.lr"]).sort_values(["ppo_epochs", "lr"]) if len(t) else t


@register_section("quatro_log_ratio", "QUATRO appendix A.3: the -sg[log s] term (reversed share, sequence ratios, "
                  "pass@k)", "the arms of sweeps/quatro_arm/")
def _quatro_log_ratio(ctx):
    t = _train_means(ctx, ["train/reversed_share", "train/seq_ratio_mean", "train/seq_ratio_max", "train/clip_fraction"])
    p = _mean_passk(ctx)
    return t.join(p, how="outer") if len(t) else t


@register_section("quatro_advantage", "QUATRO Fig. 2: advantages against the number of correct answers", "algo=quatro")
def _quatro_advantage(ctx):
    c = R.quatro_advantage_curves(ctx.done)
    return c.set_index(["delta", "G", "correct"]) if len(c) else c


@register_section("quatro_lambda", "QUATRO: the dual variable lambda* over training (mean per step)", "algo=quatro")
def _quatro_lambda(ctx):
    return _per_step(ctx, "train/lambda_mean")


@register_section("quatro_group_size", "QUATRO: pass@k and UCR by group size G", "train.group_size")
def _quatro_group_size(ctx):
    p = _mean_passk(ctx)
    ucc = R.metric_table(ctx.shown, "ucc")
    if len(ucc) and "mean" in ucc.index.get_level_values(-1):
        p = p.join(ucc.xs("mean", level="benchmark")[["ucr"]] if "ucr" in ucc.columns else pd.DataFrame(), how="left")
    return _with_params(p, ctx.runs, ["train.group_size"]) if len(p) else p


@register_section("quatro_code", "QUATRO Table 4: code pass@k by benchmark", "eval=code")
def _quatro_code(ctx):
    return _by_benchmark(ctx)


# ------------------------------------------------------------------------------------------------- ExPPO

@register_section("exppo_coverage", "ExPPO Fig. 1: coverage (pass@k at the largest k) over checkpoints",
                  "train.save_every=N eval.checkpoints=all")
def _exppo_coverage(ctx):
    key = R.largest_k_key(ctx.shown)
    traj = R.eval_trajectories(ctx.tracking_uri, ctx.runs, key) if key else {}
    if not traj:
        return pd.DataFrame()
    return pd.DataFrame({lab: pd.Series(v, index=s) for lab, (s, v) in traj.items()}).T.rename_axis("run")


@register_section("exppo_passk", "ExPPO Tables 3 and 4: pass@k at each benchmark's budget", "eval=exppo")
def _exppo_passk(ctx):
    return _by_benchmark(ctx)


@register_section("exppo_shared_d", "ExPPO Table 2B: disagreement D on the Shared set, Delta-D against the baseline",
                  "report.baseline and prompts with two or more correct samples in every run")
def _exppo_shared_d(ctx):
    from core.tasks import get_task, task_names
    from evaluation.metrics.modes import shared_set_disagreement

    label = ctx.baseline or R.base_label(ctx.runs)
    if label is not None and label not in ctx.samples and label in set(ctx.done["algo"]):
        label = ctx.done[ctx.done["algo"] == label]["label"].iloc[0]
    if not ctx.samples or label not in ctx.samples:
        return pd.DataFrame()
    benches = {b for df in ctx.samples.values() for b in df["benchmark"].unique()}
    same = {b: get_task(b).same_answer for b in benches if b in task_names()}
    return shared_set_disagreement(ctx.samples, label, same)


@register_section("exppo_decoding_seeds", "ExPPO Table 3: mean ± std over decoding seeds", "eval.seed=0,1,2")
def _exppo_decoding_seeds(ctx):
    return R.seed_aggregate(R.passk_table(ctx.shown), key="eval.seed")


@register_section("training_seeds", "Mean ± std over training seeds (the papers' three-seed tables)", "seed=0,1,2")
def _training_seeds(ctx):
    return R.seed_aggregate(R.passk_table(ctx.shown), key="seed")


@register_section("exppo_lambda_grid", "ExPPO Table 9: pass@k by the shaping strength lambda", "exppo_lambda")
def _exppo_lambda(ctx):
    p = _mean_passk(ctx)
    return _with_params(p, ctx.runs, ["algo.advantage.lam"]) if len(p) else p


@register_section("exppo_components", "ExPPO Table 9: component ablation (pass@k by arm)", "the arms of sweeps/exppo_part/")
def _exppo_components(ctx):
    return _mean_passk(ctx)


@register_section("exppo_modes", "ExPPO: answer modes (observed and effective yield, disagreement)", "eval.n >= 2")
def _exppo_modes(ctx):
    return R.metric_table(ctx.shown, "modes")


@register_section("cost", "ExPPO Table 7 and TR-GRPO Table 8: cost (wall time, GPU-hours, throughput, memory)",
                  "a trained run")
def _cost(ctx):
    return R.cost_table(ctx.done, ctx.hist()) if len(ctx.done) else pd.DataFrame()


# ------------------------------------------------------------------------------------------------- TR-GRPO

@register_section("trgrpo_kk", "TR-GRPO Table 1: Knights-and-Knaves accuracy by number of people", "data=kk eval=kk")
def _trgrpo_kk(ctx):
    return R.subset_table(ctx.shown)


@register_section("trgrpo_weights", "TR-GRPO Table 4 and Fig. 2: weight ablations (accuracy by number of people)",
                  "algo=tr_grpo_equal,tr_grpo_random,tr_grpo_reverse")
def _trgrpo_weights(ctx):
    return R.subset_table(ctx.shown)


@register_section("trgrpo_sensitivity", "TR-GRPO Table 7: sensitivity to tau and to the bounds (L, U)",
                  "the points of sweeps/trgrpo_point/")
def _trgrpo_sensitivity(ctx):
    t = R.subset_table(ctx.shown)
    if t.empty:
        t = _mean_passk(ctx)
    else:
        t = t.assign(mean=t.mean(axis=1))
    return _with_params(t, ctx.runs, ["algo.policy_loss.tau", "algo.policy_loss.low", "algo.policy_loss.high"]) \
        if len(t) else t


@register_section("trgrpo_tokens", "TR-GRPO Fig. 1: the most frequent sampled tokens ranked by mean probability",
                  "engine=local (it logs token_probs.csv for every trained run)")
def _trgrpo_tokens(ctx):
    return R.token_prob_table(ctx.tracking_uri, ctx.done)


@register_section("trgrpo_math", "TR-GRPO Table 2: math (greedy accuracy, avg@16, pass@16 by benchmark)",
                  "eval=trgrpo_math")
def _trgrpo_math(ctx):
    return _by_benchmark(ctx)


@register_section("trgrpo_search", "TR-GRPO Table 3: search agents (exact match, tool calls)", "eval=search")
def _trgrpo_search(ctx):
    return R.metric_table(ctx.shown, "tools")


@register_section("trgrpo_dynamics", "TR-GRPO Fig. 3: gradient norm and reward over training", "a trained run")
def _trgrpo_dynamics(ctx):
    parts = {name: _per_step(ctx, key) for name, key in (("grad_norm", "train/grad_norm"), ("reward", "train/reward_mean"))}
    parts = {k: v for k, v in parts.items() if len(v)}
    return pd.concat(parts, axis=1) if parts else pd.DataFrame()


def sections_of(runs: pd.DataFrame, given=None) -> list[str]:
    """The sweep's ``report.sections``: ``given`` when not None, else read back from the trained runs' logged
    config (the most common value). Returns names in order; [] when none."""
    import ast

    if given is not None:
        return [str(s) for s in given]
    if runs.empty:
        return []
    values = [p.get("report.sections") for p, k in zip(runs["params"], runs["kind"]) if k == "trained"]
    values = [v for v in values if v not in (None, "", "None", "[]")]
    if not values:
        return []
    try:
        return [str(s) for s in ast.literal_eval(max(set(values), key=values.count))]
    except (ValueError, SyntaxError):
        return []


def build_section(name: str, ctx: Context) -> tuple[PaperSection | None, pd.DataFrame]:
    """(the section, its table) for ``name``; (None, empty) for a name no section has. Never raises on missing data:
    an empty table means the sweep lacks it."""
    sec = SECTIONS.get(name)
    if sec is None:
        return None, pd.DataFrame()
    table = sec.build(ctx)
    return sec, (table if isinstance(table, pd.DataFrame) else pd.DataFrame())


def is_empty(df: pd.DataFrame) -> bool:
    """True when ``df`` has no cell with a value (the section's data is missing)."""
    return df is None or df.empty or not bool(np.asarray(df.notna()).any())
