"""The tables and series the report shows, as pure functions of what :mod:`reports.load` read from MLflow (tested).

Evaluation metrics are found through the metric-table registry (:data:`evaluation.tables.TABLES`): an entry's
``parse`` maps an MLflow metric name to its table, row and column, so no metric name is matched by a pattern here and
a plug-in table (``plugins`` config key, :func:`reports.load.load_plugins`) is found like the built-ins. The runs grouped
by seed (mean +- std over seeds, the study's methods) are in :mod:`reports.seed_groups`.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from core import tags as tag_names
from evaluation.tables import TABLES, MetricTable, find_table, metric_key

from .load import BASE_LABEL

#: every run's per-step panels: the update's, then (:func:`train_panels`) the algorithms' own, then the
#: training-inference mismatch with vLLM rollouts (training/mismatch.py) and its correction (tis_*)
TRAIN_PANELS = ["train/reward_mean", "train/accuracy", "train/entropy", "train/kl_ref", "train/clip_fraction",
                "train/ppo_kl", "train/grad_norm", "train/mismatch_kl", "train/mismatch_logprob_abs_diff",
                "train/tis_weight_mean", "train/correction_masked_share", "train/staleness_mean",
                "train/staleness_logprob_gap"]



def train_panels() -> list[str]:
    """The report's per-step training panels: :data:`TRAIN_PANELS` with, after the update's, the metrics each
    registered algorithm declared for its own panels (``panels=`` of
    :func:`training.algorithms.register_advantage` / ``register_policy_loss``; QUATRO's lambda and reversed share)."""
    from training.algorithms import panel_metrics

    cut = TRAIN_PANELS.index("train/grad_norm") + 1
    own = [k for k in panel_metrics() if k not in TRAIN_PANELS]
    return TRAIN_PANELS[:cut] + own + TRAIN_PANELS[cut:]



def display_name(metric: str) -> str:
    """``pass_at_8`` -> ``pass@8`` (MLflow keys cannot hold '@'; reports show the papers' names)."""
    return re.sub(r"_at_(\d+)", r"@\1", metric)



def provenance_warnings(runs: pd.DataFrame, shown: int = 4) -> list[str]:
    """One line per provenance key (:mod:`orchestrator.point.provenance`: library versions, machine, commit, evaluation
    protocol) on which the runs differ, naming the values and the runs with each (at most ``shown`` per value)."""
    from orchestrator.point.provenance import differences

    if runs.empty:
        return []
    # the runs whose numbers the report shows: finished trained, base and evaluation runs (a duplicate record
    # carries the environment of the process that recorded it, not of the run that made its numbers)
    shown_runs = runs[runs["kind"].isin(["trained", "base", "evaluation"]) & (runs["status"] == "FINISHED")]
    lines = [f"Run {label} changed environment while it ran: {t[tag_names.ENV_CHANGED]}."
             for label, t in zip(shown_runs["label"], shown_runs["tags"]) if t.get(tag_names.ENV_CHANGED)]
    for key, values in differences(dict(zip(shown_runs["label"], shown_runs["tags"]))).items():
        parts = []
        for value, labels in values.items():
            more = f" and {len(labels) - shown} more" if len(labels) > shown else ""
            parts.append(f"{value} ({', '.join(labels[:shown])}{more})")
        lines.append(f"The runs compared here differ in {key}: " + "; ".join(parts) + ". A difference between "
                     "them may come from this rather than from what was swept.")
    return lines



def lora_notes(runs: pd.DataFrame) -> list[str]:
    """One line per LoRA setting among the trained runs (``train.lora.rank > 0``): rank, alpha, modules, the
    learning rate and its rule, and that it is the suite's choice, not the paper's protocol (the papers fine-tune
    every weight; sweeps/lora/on.yaml)."""
    if runs.empty or "params" not in runs:
        return []
    groups: dict = {}
    for label, p, kind in zip(runs["label"], runs["params"], runs.get("kind", [None] * len(runs))):
        if kind != "trained" or not isinstance(p, dict):
            continue
        try:
            rank = int(float(p.get("train.lora.rank", 0) or 0))
        except ValueError:
            continue
        if rank <= 0:
            continue
        lr, full = str(p.get("train.lora.lr", "auto")), p.get("train.lr", "?")
        rate = (f"learning rate 10 x train.lr ({full}), the rule of \"LoRA Without Regret\"" if lr == "auto"
                else f"learning rate {lr} (train.lora.lr)")
        key = (f"rank {rank}, alpha {p.get('train.lora.alpha', '?')}, on {p.get('train.lora.target_modules', '?')}, "
               f"{rate}")
        groups.setdefault(key, []).append(str(label))
    return [f"LoRA adapters on a frozen base ({key}) for {', '.join(labels[:4])}"
            f"{f' and {len(labels) - 4} more' if len(labels) > 4 else ''}: the suite's choice for one GPU, not the "
            "paper's protocol (its models fine-tune every weight); compare with full fine-tuning before reading these "
            "numbers as the paper's." for key, labels in groups.items()]



def swept_params(runs: pd.DataFrame) -> list[str]:
    """Parameter keys whose value differs between the trained runs (the sweep's axes), bookkeeping keys
    excluded (base-model runs carry only model, eval and data parameters, so they are left out)."""
    if runs.empty:
        return []
    params = [p for p, k in zip(runs["params"], runs["kind"] if "kind" in runs else [None] * len(runs)) if k != "base"]
    keys = sorted({k for p in params for k in p})
    out = []
    for k in keys:
        if k.startswith(("tracking.", "experiment_name", "identity_exclude", "force", "report.")):
            continue
        if len({p.get(k) for p in params}) > 1:
            out.append(k)
    return out



def short_labels(runs: pd.DataFrame) -> pd.DataFrame:
    """Replace run labels by the algorithm plus the swept non-algorithm hyperparameters that tell its row from the
    rows beside it (the full override string stays in the MLflow run name): a key that varies among that algorithm's
    runs (``quatro delta=0.01``, ``grpo seed=1``), and a config key (``train.rollout.correction``) that varies among
    any algorithm's runs, a factor crossed with the algorithms, even where this algorithm's runs take one value of
    it (``gspo correction=token_tis`` beside ``quatro correction=none`` and ``quatro correction=token_tis``). A key
    set with the algorithm (an arm's ``train.save_every``) says nothing the algorithm's name does not, and a
    top-level knob an algorithm reads through its own settings (``delta``) only labels the algorithms it varies
    for."""
    if runs.empty:
        return runs
    axes = [k for k in swept_params(runs) if not k.startswith("algo.")]
    varying: dict = {}  # algorithm -> the swept keys that take more than one value among its (non-base) runs
    for algo, params, kind in zip(runs["algo"], runs["params"], runs["kind"]):
        if kind != "base":
            for k in axes:
                varying.setdefault(algo, {}).setdefault(k, set()).add(params.get(k))
    crossed = {k for by_key in varying.values() for k, values in by_key.items() if len(values) > 1 and "." in k}
    labels = []
    for algo, params, kind in zip(runs["algo"], runs["params"], runs["kind"]):
        if kind == "base":
            labels.append(BASE_LABEL)
            continue
        # evaluation settings keep their group (eval.seed=1 is a decoding seed, seed=1 a training seed)
        parts = [algo] + [f"{k if k.startswith('eval.') else k.split('.')[-1]}={params.get(k)}" for k in axes
                          if len(varying[algo][k]) > 1 or k in crossed]
        labels.append(" ".join(parts) + (" (dup)" if kind == "duplicate" else ""))
    seen: dict = {}
    for i, lab in enumerate(labels):  # keep labels unique
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[i] = f"{lab} #{seen[lab]}"
    runs = runs.copy()
    runs["label"] = labels
    return runs



def run_table(runs: pd.DataFrame, tracking_uri: str | None = None) -> pd.DataFrame:
    """Run table: label, algorithm, swept hyperparameters, status (a point that reuses an identical earlier run's
    numbers: ``reuses <run id>``), steps, the checkpoint the benchmarks evaluated when a run chose it on a validation
    split (``eval.select_on=validation``: its step and on what), how it was trained and evaluated (rollout sampler
    and training precision; evaluation sampler and dtype), wall time, the time of each phase (:data:`PHASE_COLUMNS`:
    the last training step's generate / log-probs / update split and the final evaluation's sampling / entropy /
    verification / metrics split, seconds), run id."""
    if runs.empty:
        return pd.DataFrame()
    axes = [k for k in swept_params(runs) if not k.startswith("algo.")]
    reused = runs["reused_from"] if "reused_from" in runs else [None] * len(runs)
    table = pd.DataFrame({
        "run": runs["label"], "algorithm": runs["algo"],
        **{k: [None if kind == "base" else p.get(k) for p, kind in zip(runs["params"], runs["kind"])] for k in axes},
        "status": [f"reuses {str(u)[:8]} ({s.lower()})" if isinstance(u, str) and u else
                   ("duplicate of " + str(d)[:8]) if k == "duplicate" else s
                   for k, s, d, u in zip(runs["kind"], runs["status"], runs["duplicate_of"], reused)],
        "steps": runs["steps"],
        "rollout": [t.get(tag_names.ROLLOUT_SAMPLER) for t in runs["tags"]],
        "precision": [t.get(tag_names.PRECISION) for t in runs["tags"]],
        "eval sampler": [t.get(tag_names.SAMPLER) for t in runs["tags"]],
        "eval dtype": [t.get(tag_names.EVAL_DTYPE) for t in runs["tags"]],
        "wall time (s)": runs["wall_time_s"].round(1),
    })
    chosen = [t.get(tag_names.SELECTED_STEP) for t in runs["tags"]]
    if any(chosen):  # the benchmarks evaluated this step's checkpoint, not the last (chosen on held-out prompts)
        table.insert(table.columns.get_loc("steps") + 1, "evaluated checkpoint", [
            f"step {s} (best {t.get(tag_names.SELECTED_ON, 'validation')})" if s else None
            for s, t in zip(chosen, runs["tags"])])
    for col, key in PHASE_COLUMNS:  # where the time went (last step's training phases; the final evaluation's)
        values = [m.get(key) for m in runs["metrics"]]
        if any(v is not None for v in values):
            table[col] = [None if v is None else round(float(v), 1) for v in values]
    table["MLflow run"] = runs["run_id"]
    return table.set_index("run")



COST_KEYS = ["train/step_time_s", "train/samples_per_s", "train/peak_memory_gb", "train/peak_reserved_gb", "train/gpus",
             "train/flops", "time/val_s"]



def cost_table(runs: pd.DataFrame, hist: dict) -> pd.DataFrame:
    """What each run cost (ExPPO's Table 7, TR-GRPO's Table 8): wall time (training and evaluation, s), GPUs, GPU-hours
    (GPUs x wall hours), training steps/s and samples/s (over all logged steps: steps and responses per second of
    step time), peak allocated and peak reserved memory (GiB; on the CPU the process's peak resident set, no
    reserved figure), the training compute (the sum of ``train/flops``, :mod:`training.compute`) and the validation
    along training's wall time (the sum of ``time/val_s``; ``train.validate_every``). ``hist`` holds :data:`COST_KEYS` from :func:`histories`. GPUs: the run's ``train/gpus``
    (local engine), else ``engine.n_gpus_per_node x engine.nnodes`` for verl runs. Runs that evaluated another run's
    checkpoint (``rlvr.trained_in``) show their own wall time and no training figures. Empty without trained runs."""
    rows = {}
    for _, r in runs.iterrows():
        if r["kind"] != "trained":
            continue
        label, params, evaluation_only = r["label"], r["params"], bool(r["tags"].get(tag_names.TRAINED_IN))

        def series(key):
            got = hist.get(key, {}).get(label)
            return (None, None) if got is None or evaluation_only else got

        _, step_t = series("train/step_time_s")
        _, sps = series("train/samples_per_s")
        _, alloc = series("train/peak_memory_gb")
        _, reserved = series("train/peak_reserved_gb")
        _, gpus_logged = series("train/gpus")
        _, flops = series("train/flops")
        _, val_t = series("time/val_s")
        if gpus_logged is not None and len(gpus_logged):
            gpus = float(np.max(gpus_logged))
        elif params.get("engine.name") == "verl":
            gpus = float(params.get("engine.n_gpus_per_node", 1)) * float(params.get("engine.nnodes", 1))
        else:
            gpus = np.nan
        wall = float(r["wall_time_s"]) if pd.notna(r["wall_time_s"]) else np.nan
        total_t = float(np.sum(step_t)) if step_t is not None and len(step_t) else np.nan
        samples = float(np.sum(np.asarray(sps) * np.asarray(step_t))) if sps is not None and step_t is not None \
            and len(sps) == len(step_t) else np.nan
        rows[label] = {
            "wall time (s)": round(wall, 1), "GPUs": gpus, "GPU-hours": round(gpus * wall / 3600, 3) if gpus == gpus else np.nan,
            "steps/s": round(len(step_t) / total_t, 4) if total_t == total_t and total_t > 0 else np.nan,
            "samples/s": round(samples / total_t, 2) if total_t == total_t and total_t > 0 else np.nan,
            "peak allocated (GiB)": round(float(np.max(alloc)), 2) if alloc is not None and len(alloc) else np.nan,
            "peak reserved (GiB)": round(float(np.max(reserved)), 2) if reserved is not None and len(reserved) else np.nan,
            "training FLOPs (est.)": float(np.sum(flops)) if flops is not None and len(flops) else np.nan,
            "validation (s)": round(float(np.sum(val_t)), 1) if val_t is not None and len(val_t) else np.nan,
            "trained in": str(r["tags"].get(tag_names.TRAINED_IN, ""))[:8] or None,
        }
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "run"
    return table



PHASE_COLUMNS = [("step s", "train/step_time_s"), ("generate s", "train/generate_time_s"),
                 ("log-probs s", "train/logprob_time_s"), ("update s", "train/update_time_s"),
                 ("eval s", "time/eval_s"), ("eval sampling s", "time/eval_sampling_s"),
                 ("eval entropy s", "time/eval_entropy_s"), ("eval verify s", "time/eval_verify_s"),
                 ("eval metrics s", "time/eval_metrics_s")]



def train_summary(hist: dict) -> pd.DataFrame:
    """Rows = runs, columns = training metrics: the mean over all logged steps (from :func:`histories`),
    so runs can be compared at a glance (e.g. clip fraction and entropy by inner epochs)."""
    records: dict = {}
    for key, by_run in hist.items():
        for label, (_steps, values) in by_run.items():
            records.setdefault(label, {})[key.removeprefix("train/")] = float(np.mean(values)) if len(values) else np.nan
    df = pd.DataFrame.from_dict(records, orient="index")
    df.index.name = "run (mean over steps)"
    return df



def table_entry(table: str | MetricTable) -> MetricTable:
    """The registered metric table ``table`` (a name of :data:`evaluation.tables.TABLES`, or the entry itself).

    Raises:
        KeyError: no table of that name is registered (the message lists the registered ones).
    """
    return table if isinstance(table, MetricTable) else TABLES[table]



def metric_sections(exclude=()) -> dict[str, list[MetricTable]]:
    """{report section title: its registered tables}, in registration order, leaving out the tables named in
    ``exclude`` (those the report shows in sections of their own)."""
    out: dict[str, list[MetricTable]] = {}
    for entry in TABLES.values():
        if entry.name not in exclude:
            out.setdefault(entry.section, []).append(entry)
    return out



def _column_order(entry: MetricTable, first=()):
    def order(c):
        got = entry.parse_column(c)
        template, fields = got if got else (c, {})
        return (c not in first, template, tuple(fields.values()))
    return order



def metric_table(runs: pd.DataFrame, table: str | MetricTable, columns=None, sort: bool = True) -> pd.DataFrame:
    """The registered metric table ``table`` as the runs logged it at the main evaluation temperature.

    Args:
        runs: :func:`load_runs`' frame (``label`` and ``metrics`` are read).
        table: a registered table's name or entry.
        columns: only these column templates or columns (``"coverage@{k}"``, ``"pass@1"``), each the table's.
        sort: sort the rows (by run label, then the row fields).
    Returns:
        Rows (run, <the table's row fields>): (run, benchmark) for per-benchmark tables, (run, kind) for ``kinds``;
        columns the display names (``pass@8``), ordered by column family then number. Empty when no run logged it.
    Raises:
        KeyError: an unregistered table. ValueError: a column that is not the table's.
    """
    entry = table_entry(table)
    for c in columns or ():
        if c not in entry.columns and not entry.owns(c):
            raise ValueError(f"column {c!r} is not one of metric table {entry.name!r}'s {entry.columns}")
    records: dict = {}
    names: list = []
    for _, r in runs.iterrows():
        for key, v in r["metrics"].items():
            m = entry.parse(key)
            if m is None or m.temperature is not None:
                continue
            if columns and m.template not in columns and m.column not in columns:
                continue
            names = list(m.row)
            records.setdefault((r["label"], *m.row.values()), {})[m.column] = v
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame.from_dict(records, orient="index")
    df.index = pd.MultiIndex.from_tuples(df.index, names=["run", *names])
    df = df[sorted(df.columns, key=_column_order(entry))]
    return df.sort_index() if sort else df



def temperature_table(runs: pd.DataFrame, benchmark: str = "mean") -> pd.DataFrame:
    """Rows (run, temperature), columns = the summary columns of every registered table (``summary``: pass@1, UCR,
    UCC@k, rouge_l_mean for the built-ins) for ``benchmark``, at the main evaluation temperature (``eval/...``) and
    every extra one (``eval_T<t>/...``). Empty when no run was evaluated at an extra temperature."""
    records = {}
    for _, r in runs.iterrows():
        parsed = [(find_table(k), v) for k, v in r["metrics"].items()]
        if not any(m is not None and m.temperature is not None for m, _ in parsed):
            continue
        main_t = float(r["params"].get("eval.temperature", "nan"))
        for m, v in parsed:
            if m is not None and m.row == {"benchmark": benchmark} and TABLES[m.table].in_summary(m.column):
                t = m.temperature if m.temperature is not None else main_t
                records.setdefault((r["label"], t), {})[m.column] = v
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame.from_dict(records, orient="index")
    df.index = pd.MultiIndex.from_tuples(df.index, names=["run", "temperature"])
    return df.sort_index()



def subset_table(runs: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Rows = runs, columns = ``<benchmark>/<subset>`` (e.g. ``kk/3_people``, ordered by the number in
    the subset name): column ``metric`` (``accuracy``, ``pass@2``...) of the registered ``subsets`` table."""
    entry = table_entry("subsets")
    records = {}
    for _, r in runs.iterrows():
        for key, v in r["metrics"].items():
            m = entry.parse(key)
            if m is not None and m.temperature is None and metric in (m.column, metric_key(m.column)):
                records.setdefault(r["label"], {})[f"{m.row['benchmark']}/{m.row['subset']}"] = v
    if not records:
        return pd.DataFrame()
    df = pd.DataFrame.from_dict(records, orient="index")

    def order(c):
        num = re.findall(r"\d+", c)  # the number in the subset's name (3_people), not a metric name
        return (c.split("/")[0], int(num[0]) if num else 0, c)

    df.index.name = "run"
    return df[sorted(df.columns, key=order)]



def kind_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Rows (run, task kind), columns the number of benchmarks, then pass@k / avg@n (display names), from the
    registered ``kinds`` table (``eval/kind/<kind>/<metric>``: the unweighted mean over each kind's benchmarks)."""
    df = metric_table(runs, "kinds", sort=False)
    return df[sorted(df.columns, key=_column_order(table_entry("kinds"), first=("benchmarks",)))] if len(df) else df



def passk_table(runs: pd.DataFrame) -> pd.DataFrame:
    """pass@k (columns ordered by k) and avg@n per (run, benchmark), including the ``mean`` benchmark."""
    return metric_table(runs, "passk")



def flip_table(runs: pd.DataFrame, benchmark: str | None = "all") -> pd.DataFrame:
    """Rows (run, bucket) (or (run, benchmark, bucket) with ``benchmark=None``), columns ``n_prompts``,
    ``solved_from_unsolved``, ``improved``, ``regressed`` (the registered ``flip_rates`` table's columns), from
    ``eval/<benchmark>/flip/<bucket>/<measure>`` (benchmark ``all``: every prompt pooled)."""
    entry = table_entry("flip_rates")
    order = {b: i for i, b in enumerate(("very_hard", "hard", "medium", "easy"))}
    rec = {}
    for _, r in runs.iterrows():
        for key, v in r["metrics"].items():
            m = entry.parse(key)
            if m is not None and m.temperature is None and (benchmark is None or m.row["benchmark"] == benchmark):
                bench, bucket = m.row["benchmark"], m.row["bucket"]
                idx = (r["label"], bucket) if benchmark is not None else (r["label"], bench, bucket)
                rec.setdefault(idx, {})[m.column] = v
    if not rec:
        return pd.DataFrame()
    df = pd.DataFrame.from_dict(rec, orient="index")
    df.index = pd.MultiIndex.from_tuples(df.index, names=["run", "bucket"] if benchmark is not None else ["run", "benchmark", "bucket"])
    runs_order = {lab: i for i, lab in enumerate(runs["label"])}
    keys = sorted(df.index, key=lambda ix: (runs_order.get(ix[0], 1e9), *ix[1:-1], order.get(ix[-1], 9)))
    cols = [c for c in entry.columns if c in df.columns]
    return df.loc[keys, cols]



def flip_rules(runs: pd.DataFrame) -> list[str]:
    """The flip-rate rules the runs were evaluated with (tag ``rlvr.flip_rule``)."""
    return sorted({r["tags"].get(tag_names.FLIP_RULE) for _, r in runs.iterrows() if r["tags"].get(tag_names.FLIP_RULE)})



def largest_k_key(runs: pd.DataFrame, benchmark: str = "mean") -> str | None:
    """``eval/<benchmark>/pass_at_<K>`` for the largest K any run logged (the ``passk`` table's ``pass@{k}``), or None."""
    entry = table_entry("passk")
    ks = [m.fields["k"] for _, r in runs.iterrows() for key in r["metrics"] for m in [entry.parse(key)]
          if m is not None and m.temperature is None and m.template == "pass@{k}" and m.row["benchmark"] == benchmark]
    return f"eval/{entry.row_prefix(benchmark)}/{metric_key(entry.display('pass@{k}', {'k': max(ks)}))}" if ks else None



def protocol_of(tags: dict) -> str | None:
    """The id of the evaluation protocol a run was evaluated under (``rlvr.eval_protocol_id``, or for runs logged
    before it the ``rlvr.env.eval_identity`` tag), None when it records neither."""
    tags = tags or {}
    return tags.get(tag_names.EVAL_PROTOCOL_ID) or tags.get(tag_names.ENV_PREFIX + "eval_identity")


def protocols(runs: pd.DataFrame) -> dict:
    """{run label: :func:`protocol_of` its tags} for ``runs``."""
    return {} if runs.empty else {lab: protocol_of(t) for lab, t in zip(runs["label"], runs["tags"])}


def base_by_protocol(runs: pd.DataFrame) -> dict:
    """{protocol id: label of the first finished base-model run evaluated under it}."""
    out: dict = {}
    if runs.empty:
        return out
    for lab, kind, status, t in zip(runs["label"], runs["kind"], runs["status"], runs["tags"]):
        if kind == "base" and status == "FINISHED":
            out.setdefault(protocol_of(t), lab)
    return out


def protocol_difference(runs: pd.DataFrame, a: str, b: str) -> str:
    """The settings runs ``a`` and ``b`` (labels) were evaluated differently with, one line (from their
    ``rlvr.eval_protocol`` tags; "another protocol" when a run does not record it)."""
    from evaluation.protocol import differences, of_tags

    tags = dict(zip(runs["label"], runs["tags"]))
    pa, pb = of_tags(tags.get(a, {})), of_tags(tags.get(b, {}))
    return "; ".join(differences(pa, pb)) if pa and pb else "another evaluation protocol"


def prompt_similarities(samples_by_run: dict) -> pd.DataFrame:
    """Per (run, benchmark, prompt) mean pairwise similarity among the prompt's correct responses, for
    the four metrics; prompts with fewer than two correct responses are left out."""
    from evaluation.metrics.diversity import METRICS, mean_pairwise_similarity

    rows = []
    for label, df in samples_by_run.items():
        for (bench, pid), grp in df[df["correct"]].groupby(["benchmark", "prompt_id"]):
            texts = grp["response"].tolist()
            if len(texts) >= 2:
                rows.append({"run": label, "benchmark": bench, "prompt_id": pid,
                             **{m: mean_pairwise_similarity(texts, m) for m in METRICS}})
    return pd.DataFrame(rows)



def quatro_advantage_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """QUATRO's advantages against the number of correct answers c in a group (0/1 rewards), for every delta
    and group size G of the sweep's QUATRO runs, from the closed form (:func:`training.algorithms.quatro.
    quatro_advantages`; the QUATRO paper's Fig. 2). Columns ``delta``, ``G``, ``correct``, ``A_correct``,
    ``A_wrong``; empty without QUATRO runs."""
    import torch

    from training.algorithms.quatro import quatro_advantages

    rows = []
    settings = set()
    for _, r in runs.iterrows():
        p = r["params"]
        if p.get("algo.advantage.name") == "quatro":
            try:
                settings.add((float(p.get("algo.advantage.delta", p.get("delta"))), int(p.get("train.group_size", 8)),
                              float(p.get("algo.advantage.lambda_min", 1e-3))))
            except (TypeError, ValueError):
                continue
    for delta, G, lam_min in sorted(settings):
        for c in range(1, G):
            rewards = torch.tensor([[1.0] * c + [0.0] * (G - c)], dtype=torch.float64)
            adv = quatro_advantages(rewards, delta, lam_min)[0]
            rows.append({"delta": delta, "G": G, "correct": c, "A_correct": float(adv[0]), "A_wrong": float(adv[-1])})
    return pd.DataFrame(rows, columns=["delta", "G", "correct", "A_correct", "A_wrong"])



def staleness_axes(runs: pd.DataFrame) -> tuple[list, list] | None:
    """(inner-epoch values, learning rates) when the sweep varies the inner epochs (the QUATRO paper's staleness
    study, its Fig. 1 and 4: a column per number of epochs, a colour per learning rate; one learning rate draws one
    colour, as the CPU twin has), else None."""
    if runs.empty:
        return None
    epochs = sorted({int(p["train.ppo_epochs"]) for p in runs["params"] if p.get("train.ppo_epochs")})
    lrs = sorted({float(p["train.lr"]) for p in runs["params"] if p.get("train.lr")})
    return (epochs, lrs) if len(epochs) > 1 and lrs else None



def qualitative_examples(samples_by_run: dict, n_prompts: int = 3, per_run: int = 3, chars: int = 240) -> pd.DataFrame:
    """A few prompts and, for each run, its distinct correct answers (up to ``per_run``, most frequent first)
    with the end of one response giving each (the QUATRO paper's C.6). Prompts are those most runs solve,
    taken in order. Columns ``prompt``, ``run``, ``answer``, ``count``, ``response_tail``."""
    if not samples_by_run:
        return pd.DataFrame()
    solved = {}
    for label, df in samples_by_run.items():
        for key in df.loc[df["correct"].astype(bool), ["benchmark", "prompt_id"]].itertuples(index=False, name=None):
            solved.setdefault(key, set()).add(label)
    keys = sorted(solved, key=lambda k: (-len(solved[k]), str(k)))[:n_prompts]
    rows = []
    for bench, pid in keys:
        for label, df in samples_by_run.items():
            grp = df[(df["benchmark"] == bench) & (df["prompt_id"] == pid) & df["correct"].astype(bool)]
            if grp.empty:
                continue
            prompt = str(grp["prompt"].iloc[0])[-300:] if "prompt" in grp else f"{bench}/{pid}"
            for answer, sub in sorted(grp.groupby(grp["extracted_answer"].astype(str)), key=lambda kv: -len(kv[1]))[:per_run]:
                rows.append({"prompt": f"{bench}/{pid}: {prompt}", "run": label, "answer": answer, "count": len(sub),
                             "response_tail": str(sub["response"].iloc[0])[-chars:]})
    return pd.DataFrame(rows)
