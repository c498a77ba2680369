"""MLflow -> pandas: the report's inputs (the runs of an experiment or of some sweeps, their per-step training
histories, evaluation trajectories over checkpoints, their samples and token-probability artifacts) and the runs'
plug-in modules. Everything here reads the store; the tables built from what it returns are :mod:`reports.data`'s,
their rendering :mod:`reports.render`'s.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from core import tags as tag_names

BASE_LABEL = "Initialization"  # the papers' name for the starting model's row



def in_sweeps(tags: dict, sweeps) -> bool:
    """True when a run's ``rlvr.sweep_id`` (the sweep's folder) is one of ``sweeps``: each a folder path or its last
    part (``multirun/rlvr/2026-12-05_10-00-00-000000`` or ``2026-12-05_10-00-00-000000``)."""
    sid = tags.get(tag_names.SWEEP_ID)
    if not sid:
        return False
    return any(str(s).rstrip("/") in (sid, Path(sid).name) for s in sweeps)



def load_runs(tracking_uri: str, experiment: str, sweeps=None, filter_string: str = "") -> pd.DataFrame:
    """One row per run of ``experiment``: ids, label, algorithm, status, kind, wall time, steps,
    and the ``params``/``metrics``/``tags`` dicts. Empty frame when the experiment does not exist.

    A point recorded as a duplicate shows the numbers of the finished run it reuses (``rlvr.duplicate_of``): its row
    takes that run's id, status, metrics, tags and wall time (so every table and figure reads that run's samples and
    histories) under the point's own name and parameters, with ``kind`` ``trained`` and ``reused_from`` naming the
    run (``record_id``: the duplicate record's own id). A re-run of a sweep, or a sweep extended by a point, is then
    reported whole. A duplicate whose run is not in the store stays a ``duplicate`` row without numbers. Each run is
    one row: where several points show the same run (a point identical to another, or the same run reached through
    two sweeps), the first row is kept, so no comparison is counted twice.

    Args:
        sweeps: only the runs of these sweeps (:func:`in_sweeps`), with the base-model runs their runs compared
            against (``rlvr.base_run_id``, which an earlier sweep may have made); None: every run.
        filter_string: an MLflow search filter (``params.algo.name = 'grpo'``) applied first.
    """
    import logging

    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    cols = ["run_id", "label", "algo", "status", "kind", "duplicate_of", "reused_from", "record_id", "wall_time_s",
            "steps", "params", "metrics", "tags"]
    if exp is None:
        return pd.DataFrame(columns=cols)
    rows = []
    found = client.search_runs([exp.experiment_id], filter_string=filter_string or "", max_results=5000,
                               order_by=["attributes.start_time ASC"])
    by_id = {r.info.run_id: r for r in found}
    if filter_string:  # a duplicate's run may fall outside the filter: the whole experiment is where it is
        by_id |= {r.info.run_id: r for r in client.search_runs([exp.experiment_id], max_results=5000)}
    if sweeps:
        own = [r for r in found if in_sweeps(r.data.tags, sweeps)]
        numbers = [reused(r, by_id) or r for r in own]  # the runs whose numbers the sweep's points show
        bases = {r.data.tags.get(tag_names.BASE_RUN_ID) for r in numbers} - {None, ""} - {r.info.run_id for r in own}
        found = [r for r in found if r.info.run_id in bases] + own
    for r in found:
        source = reused(r, by_id)
        record = r
        if source is not None:  # the point's own name and parameters, the reused run's numbers
            r = source
        tags = r.data.tags
        if tags.get(tag_names.KIND) in ("report", "sweep"):  # the report runs and the sweeps' parent runs
            continue
        if tags.get(tag_names.REPRODUCES):  # a check of another run (orchestrator.reproduce), not a second point
            continue
        end = r.info.end_time or r.info.start_time
        is_base = tags.get(tag_names.KIND) == "base"
        params = record.data.params if source is not None else r.data.params
        rows.append({
            "run_id": r.info.run_id,
            "label": BASE_LABEL if is_base else (record.info.run_name or record.info.run_id[:8]),
            "algo": "base model" if is_base else params.get("algo.name", "?"),
            "status": r.info.status, "kind": tags.get(tag_names.KIND, "trained"),
            "duplicate_of": record.data.tags.get(tag_names.DUPLICATE_OF),
            "reused_from": r.info.run_id if source is not None else None, "record_id": record.info.run_id,
            "wall_time_s": float(tags[tag_names.ACTIVE_S]) if tags.get(tag_names.ACTIVE_S) else
                           (end - r.info.start_time) / 1000.0 if r.info.start_time else np.nan,
            "steps": int(params.get("train.steps", 0) or 0) if tags.get(tag_names.KIND) == "trained" else 0,
            "params": dict(params), "metrics": dict(r.data.metrics), "tags": dict(tags),
        })
    seen: set = set()  # a run once, however many points or sweeps show it: the first row that shows it is kept
    rows = [r for r in rows if r["run_id"] not in seen and not seen.add(r["run_id"])]
    return pd.DataFrame(rows, columns=cols)



def reused(run, by_id: dict):
    """The finished trained run whose numbers a duplicate record ``run`` shows (its ``rlvr.duplicate_of``), or None
    (not a duplicate, or its run is not in ``by_id`` or did not finish)."""
    tags = run.data.tags
    if tags.get(tag_names.KIND) != "duplicate":
        return None
    source = by_id.get(tags.get(tag_names.DUPLICATE_OF) or "")
    if source is None or source.info.status != "FINISHED" or source.data.tags.get(tag_names.KIND) != "trained":
        return None
    return source



def finished(runs: pd.DataFrame) -> pd.DataFrame:
    """The trained runs that finished (duplicates and failures left out)."""
    if runs.empty:
        return runs
    return runs[(runs["kind"] == "trained") & (runs["status"] == "FINISHED")]


def finished_or_training(runs: pd.DataFrame) -> pd.DataFrame:
    """The trained runs that finished or are still training (a report during a sweep draws their curves so far)."""
    if runs.empty:
        return runs
    return runs[(runs["kind"] == "trained") & runs["status"].isin(["FINISHED", "RUNNING"])]



def evaluated(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished base-model runs (the "Initialization" rows, first) and the finished trained runs: every
    run whose evaluation tables the report shows."""
    if runs.empty:
        return runs
    base = runs[(runs["kind"] == "base") & (runs["status"] == "FINISHED")]
    return pd.concat([base, finished(runs)])



def base_label(runs: pd.DataFrame) -> str | None:
    """Label of the (first) finished base-model run, the default baseline of the paired differences."""
    if runs.empty:
        return None
    base = runs[(runs["kind"] == "base") & (runs["status"] == "FINISHED")]
    return str(base["label"].iloc[0]) if len(base) else None



def histories(tracking_uri: str, runs: pd.DataFrame, keys) -> dict:
    """{metric: {run label: (steps array, values array)}} for the per-step training metrics ``keys`` the runs logged
    (a metric in the order the first run that logged it reached it; a run in the order of ``runs``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    out: dict = {}
    for _, r in runs.iterrows():
        for key in keys:
            if key not in r["metrics"]:
                continue
            hist = sorted(client.get_metric_history(r["run_id"], key), key=lambda m: m.step)
            out.setdefault(key, {})[r["label"]] = (np.array([m.step for m in hist]), np.array([m.value for m in hist]))
    return out



def plugin_modules(runs: pd.DataFrame) -> list[str]:
    """The modules named in the runs' ``plugins`` config key (the MLflow param ``plugins``, a list's string form),
    in first-seen order."""
    import ast

    out: list[str] = []
    for params in (runs["params"] if len(runs) and "params" in runs else []):
        raw = (params or {}).get("plugins")
        if not raw or raw in ("None", "[]"):
            continue
        try:
            mods = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            mods = [m.strip(" '\"") for m in str(raw).strip("[]").split(",")]
        out.extend(str(m) for m in (mods if isinstance(mods, (list, tuple)) else [mods]) if m)
    return list(dict.fromkeys(out))



def load_plugins(runs: pd.DataFrame) -> list[str]:
    """Import the runs' plug-in modules (:func:`plugin_modules`) so that their metric tables are registered and
    shown. Returns one line per module that failed to import (the report names them and goes on)."""
    from core.plugins import load_plugins as _load

    problems = []
    for m in plugin_modules(runs):
        try:
            _load([m])
        except ImportError as e:
            problems.append(str(e))
    return problems



def eval_trajectories(tracking_uri: str, runs: pd.DataFrame, key: str) -> dict:
    """{run label: (steps, values)} of evaluation metric ``key`` (e.g. ``eval/mean/pass_at_8``) for the trained
    runs evaluated at more than one checkpoint (``eval.checkpoints=all``), each starting with the base model's
    value at step 0 when the run's base run (tag ``rlvr.base_run_id``) has it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    base_values = {r["run_id"]: r["metrics"].get(key) for _, r in runs.iterrows() if r["kind"] == "base"}
    out = {}
    for _, r in runs.iterrows():
        if r["kind"] != "trained" or key not in r["metrics"]:
            continue
        hist = sorted(client.get_metric_history(r["run_id"], key), key=lambda m: (m.step, m.timestamp))
        by_step = {m.step: m.value for m in hist}  # the last value logged at a step
        if len(by_step) < 2:
            continue
        base_v = base_values.get(r["tags"].get(tag_names.BASE_RUN_ID))
        if base_v is not None and 0 not in by_step:
            by_step[0] = base_v
        steps = sorted(by_step)
        out[r["label"]] = (np.array(steps), np.array([by_step[s] for s in steps]))
    return out



def download_samples(tracking_uri: str, runs: pd.DataFrame, dst: Path, problems: list | None = None) -> dict:
    """{run label: samples DataFrame} for runs that logged ``samples.parquet``.

    A file whose SHA-256 differs from the run's ``integrity.json`` record, or that cannot be read, is left out and
    named, one line each, in ``problems`` (when given); a run that logged no samples is left out silently.
    """
    import mlflow
    from mlflow.tracking import MlflowClient

    from orchestrator.point.integrity import load_record, sha256

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=tracking_uri)
    out = {}
    for _, r in runs.iterrows():
        try:
            path = mlflow.artifacts.download_artifacts(run_id=r["run_id"], artifact_path="samples.parquet",
                                                       dst_path=str(Path(dst) / r["run_id"]))
        except Exception:
            continue
        try:
            record = load_record(client, client.get_run(r["run_id"])) or {}
            want = record.get("artifacts", {}).get("samples.parquet")
            if want and sha256(Path(path)) != want:
                raise ValueError("its SHA-256 differs from the one recorded in integrity.json (corrupt)")
            out[r["label"]] = pd.read_parquet(path)
        except Exception as e:
            if problems is not None:
                problems.append(f"{r['label']} (run {r['run_id']}): samples.parquet is unreadable: "
                                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return out



def download_validation(tracking_uri: str, runs: pd.DataFrame, dst: Path) -> dict:
    """{run label: path of its ``validation.parquet``} for runs that logged the validation along training
    (``train.validate_every``, :class:`orchestrator.point.validation.LoopValidator`, rewritten after each point);
    others left out."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    out = {}
    for _, r in runs.iterrows():
        try:
            out[r["label"]] = Path(mlflow.artifacts.download_artifacts(
                run_id=r["run_id"], artifact_path="validation.parquet", dst_path=str(Path(dst) / r["run_id"])))
        except Exception:
            continue
    return out


def token_prob_table(tracking_uri: str, runs: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """TR-GRPO's Fig. 1 as a table: for each run that logged ``token_probs.csv`` (the local engine's per-token
    counts over all training rollouts, :mod:`training.token_probs`), its ``top`` most frequent sampled tokens ranked
    by their mean probability under the rollout policy (rank 1: the highest).

    Returns:
        Rows (run, rank), columns ``token`` (Python repr, so whitespace shows), ``count``, ``share`` (of the run's
        response tokens), ``mean_prob``; empty when no run logged the file.
    """
    import tempfile

    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    parts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _, r in runs.iterrows():
            try:
                path = mlflow.artifacts.download_artifacts(run_id=r["run_id"], artifact_path="token_probs.csv",
                                                           dst_path=str(Path(tmp) / r["run_id"]))
                df = pd.read_csv(path, keep_default_na=False)
            except Exception:
                continue
            if df.empty:
                continue
            df = df.sort_values(["count", "token_id"], ascending=[False, True]).head(top)
            df = df.sort_values(["mean_prob", "count"], ascending=[False, False]).reset_index(drop=True)
            df.index = pd.RangeIndex(1, len(df) + 1, name="rank")
            df["token"] = [repr(str(t)) for t in df["token"]]
            parts[r["label"]] = df[["token", "count", "share", "mean_prob"]]
    return pd.concat(parts, names=["run", "rank"]) if parts else pd.DataFrame()



def configured_baseline(runs: pd.DataFrame) -> str | None:
    """The sweep's own ``report.baseline`` (logged with every run's config): the most common non-null value among
    the trained runs, so that ``python -m reports`` without ``--baseline`` rebuilds the report the sweep built."""
    if runs.empty:
        return None
    values = [p.get("report.baseline") for p, k in zip(runs["params"], runs["kind"]) if k == "trained"]
    values = [v for v in values if v not in (None, "", "None", "null")]
    return max(set(values), key=values.count) if values else None
