"""MLflow as the window onto a sweep: the experiment's kind, one parent run per sweep, datasets, system metrics and
run descriptions.

- :func:`orchestrator.store.tracking.set_experiment_kind` (called by ``setup_experiment``): the experiment tag ``mlflow.experimentKind = custom_model_development``, so MLflow's
  UI opens on the runs table (it shows its GenAI overview otherwise); a kind a user set is left alone.
- :func:`open_sweep_run` / :func:`close_sweep_run`: one run per sweep (``rlvr.kind = sweep``, tagged with the sweep
  id, the command line and the git commit); every point's run, the duplicate records, the base-model run and the
  report run are its children (``mlflow.parentRunId``, found by :func:`sweep_parent`). At the end it carries the
  sweep's summary (``summary.csv``, a Markdown table as its description, counts as metrics, the report HTML) and
  ends FINISHED, FAILED or KILLED like its worst child. A parent whose sweep's process died (kill -9, a lost node)
  is ended KILLED by a later run of the sweep (:func:`dead_sweep`, :func:`end_dead_sweep`).
- :func:`log_datasets`: the training prompt set (context ``training``) and every evaluation benchmark (context
  ``evaluation``) as MLflow datasets, with MLflow's content digest, so the runs table's Dataset column shows them.
- :class:`SystemMetrics`: MLflow's system-metrics monitor (CPU and memory through psutil; GPU utilisation and memory
  through nvidia-ml-py on GPU machines) on a run while it trains or evaluates (``tracking.system_metrics``,
  ``tracking.system_metrics_interval_s``).
- :func:`describe`: the run page's description (``mlflow.note.content``): algorithm, swept values, headline
  metrics, the report's location.
"""
from __future__ import annotations

import json
import logging
import shlex
import sys
from pathlib import Path

from core import tags as tag_names
from orchestrator.store import lease, tracking

log = logging.getLogger("rlvr")

PARENT_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"
ENDED_BY_TAG = "rlvr.ended_by"  # on a sweep's parent run that a later run of the sweep ended: why
SWEEP_KIND = "sweep"
HEADLINE = ("eval/mean/pass_at_1", "eval/mean/avg_at_{n}")  # formatted with eval.n where it appears
_STATUS_RANK = {"FINISHED": 0, "DUPLICATE": 0, "KILLED": 1, "FAILED": 2}


_PARENTS: dict[tuple[str, str], str | None] = {}


def sweep_parent(exp_id: str, sweep_id: str, store: tracking.Store) -> str | None:
    """The id of sweep ``sweep_id``'s parent run in experiment ``exp_id`` (None outside a multirun, or when the
    sweep made none); looked up once per process, through ``store`` (:class:`orchestrator.store.tracking.Store`)."""
    key = (str(exp_id), str(sweep_id))
    if key not in _PARENTS and sweep_id:
        runs = store.search(
            exp_id, f"tags.`{tag_names.KIND}` = '{SWEEP_KIND}' and tags.`{tag_names.SWEEP_ID}` = '{sweep_id}'", max_results=1)
        if not runs:
            return None  # not cached: a job that starts before the parent is visible asks again
        _PARENTS[key] = runs[0].info.run_id
    return _PARENTS.get(key)


def parent_tags(exp_id: str, sweep_id: str, store: tracking.Store) -> dict:
    """``{mlflow.parentRunId: ...}`` for a run of this sweep, or {} when the sweep has no parent run."""
    pid = sweep_parent(exp_id, sweep_id, store)
    return {PARENT_TAG: pid} if pid else {}


def open_sweep_run(exp_id: str, sweep_id: str, git_commit: str, argv: list[str] | None = None, *,
                   store: tracking.Store) -> str:
    """Create the sweep's parent run (RUNNING), or return the one this sweep folder already has (a re-launched
    callback, which takes its lease over). Tags: ``rlvr.kind = sweep``, ``rlvr.sweep_id``, ``rlvr.command`` (the
    command line), ``rlvr.git_commit``, and the lease of the process that runs the sweep
    (:func:`orchestrator.store.lease.owner_tags`: its host, PID and heartbeat, which the sweep's callback keeps
    fresh, so a later run of the sweep knows a parent whose process died: :func:`end_dead_sweep`); named
    ``sweep <folder name>``."""
    owner = lease.owner_tags(lease.new_owner())
    existing = sweep_parent(exp_id, sweep_id, store)
    if existing:
        store.set_tags(owner, existing)
        return existing
    argv = list(sys.argv if argv is None else argv)
    command = "python " + " ".join(shlex.quote(a) for a in argv)
    run = store.create_run(exp_id, f"sweep {Path(sweep_id).name}", {
        tag_names.KIND: SWEEP_KIND, tag_names.SWEEP_ID: sweep_id, tag_names.COMMAND: command[:5000],
        tag_names.GIT_COMMIT: git_commit, "mlflow.source.git.commit": git_commit,
        NOTE_TAG: f"Sweep `{command}`, running: its points are the runs beneath.", **owner})
    _PARENTS[(str(exp_id), sweep_id)] = run.info.run_id
    return run.info.run_id


def ui_url(tracking_uri: str, exp_id: str, port: int = 5000) -> str:
    """Where MLflow's UI shows the experiment's runs table: the server itself for an http(s) store, else
    ``mlflow ui`` on 127.0.0.1:``port``. ``workflowType=machine_learning`` because MLflow 3.17's UI follows the
    workflow switch ("GenAI" / "Model training", default GenAI, remembered by the browser) rather than the
    experiment's kind tag, and opens every experiment on its GenAI overview otherwise."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else f"http://127.0.0.1:{port}"
    return f"{base}/#/experiments/{exp_id}/runs?workflowType=machine_learning"


def ui_hint(tracking_uri: str, exp_id: str) -> str:
    """One line telling how to open the sweep in MLflow's UI (printed at the end of a sweep)."""
    url = ui_url(tracking_uri, exp_id)
    if tracking_uri.startswith(("http://", "https://")):
        return f"MLflow: {url}"
    return f"MLflow: mlflow ui --backend-store-uri {tracking_uri} --port 5000, then open {url}"


def worst_status(statuses) -> str:
    """FINISHED when every child finished (or is a duplicate record), else KILLED or FAILED, the worse winning;
    anything else (a run still RUNNING at the end, a point without an outcome) counts as FAILED."""
    rank = max((_STATUS_RANK.get(str(s).upper(), 2) for s in statuses), default=0)
    return ("FINISHED", "KILLED", "FAILED")[rank]


def close_sweep_run(run_id: str, rows: list[dict], status: str | None = None, report_html: Path | None = None,
                    out_dir: Path | None = None, *, store: tracking.Store) -> str:
    """End the parent run with the sweep's summary.

    Args:
        rows: one dict per point and base run: ``point``, ``status`` (FINISHED, DUPLICATE, FAILED, KILLED, ...),
            ``run_id``, ``error`` and the headline metrics (``eval/mean/pass_at_1``, ...).
        status: the parent's end status (default: :func:`worst_status` of the rows).
        report_html: the sweep report, logged to the parent as ``report.html``.
        store: the store the calls go through (:class:`orchestrator.store.tracking.Store`).
    Returns:
        The status the parent ended with.
    """
    import pandas as pd

    status = status or worst_status(r.get("status", "FAILED") for r in rows)
    table = pd.DataFrame(rows)
    folder = Path(out_dir or Path.cwd())
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if len(table):
            table.to_csv(folder / "summary.csv", index=False)
            store.log_artifact(folder / "summary.csv", None, run_id)
        if report_html is not None and Path(report_html).is_file():
            store.log_artifact(report_html, None, run_id)
        counts = {f"sweep/points_{s.lower()}": float(sum(str(r.get("status")).upper() == s for r in rows))
                  for s in ("FINISHED", "DUPLICATE", "FAILED", "KILLED")}
        store.log_metrics(counts, 0, run_id)
        run = store.run(run_id)
        lines = [f"Sweep `{run.data.tags.get(tag_names.COMMAND, '')}`: **{status}**", ""]
        if len(table):
            cols = [c for c in ("point", "status", *sorted(c for c in table.columns if c.startswith("eval/")),
                                "run_id", "error") if c in table.columns]
            lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for r in rows:
                lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
        if report_html is not None:
            lines += ["", f"Report: `{report_html}` (also this run's artifact `report.html`)."]
        store.set_tag(NOTE_TAG, "\n".join(lines)[:20000], run_id)
    finally:
        store.terminate(run_id, status)
    return status


def dead_sweep(parent_run_id: str, stale_s: float, store: tracking.Store):
    """The sweep parent run ``parent_run_id`` (MLflow's ``Run``) when its sweep's process died and left it RUNNING,
    else None: a RUNNING run of kind ``sweep`` whose lease (:func:`orchestrator.store.lease.is_live`: the heartbeat
    of the sweep's callback, fresher than ``stale_s`` seconds; on this host, its process alive) is stale, and none of
    whose runs beneath still holds a live lease. A live sweep, here or on another node, is never taken for dead.
    Reads only."""
    parent = store.run(parent_run_id)
    if (parent.info.status != "RUNNING" or parent.data.tags.get(tag_names.KIND) != SWEEP_KIND
            or lease.is_live(parent, stale_s)):
        return None
    children = store.search(parent.info.experiment_id,
                            f"tags.`{PARENT_TAG}` = '{parent_run_id}' and attributes.status = 'RUNNING'")
    return None if any(lease.is_live(r, stale_s) for r in children) else parent


def end_dead_sweep(parent, why: str, store: tracking.Store) -> None:
    """End ``parent`` (a sweep's parent run that :func:`dead_sweep` found dead) KILLED, saying why on the run: the tag
    ``rlvr.ended_by`` (:data:`ENDED_BY_TAG`) and its description, which keeps the sweep's command."""
    command = parent.data.tags.get(tag_names.COMMAND, "")
    store.set_tags({ENDED_BY_TAG: why[:4900],
                    NOTE_TAG: f"Sweep `{command}`: **KILLED**: {why}. Its points are the runs beneath."[:20000]},
                   parent.info.run_id)
    store.terminate(parent.info.run_id, "KILLED")


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "/").replace("\n", " ")[:120]


def headline(metrics: dict, n: int | None = None) -> dict:
    """The headline evaluation metrics of a run (mean pass@1 and avg@n over benchmarks) present in ``metrics``."""
    keys = [k.format(n=n) for k in HEADLINE]
    return {k: float(metrics[k]) for k in keys if k in metrics}


def _dataset_source(path: Path | None, tags: dict):
    """A local file's dataset source (MLflow's ``local`` artifact source) or, for generated data, a code source
    whose tags name the generating task and its config."""
    import warnings

    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    if path is not None and Path(path).is_file():
        with warnings.catch_warnings():  # MLflow registers its local source twice and says so on every resolve
            warnings.simplefilter("ignore", UserWarning)
            return resolve_dataset_source(Path(path).resolve().as_uri())
    return CodeDatasetSource(tags={k: str(v)[:500] for k, v in tags.items()})


def _frame(rows: list[dict]):
    import pandas as pd

    cols = [c for c in ("id", "prompt", "gold", "subset", "task") if any(c in r for r in rows)]
    return pd.DataFrame([{c: (v if isinstance(v := r.get(c), (str, int, float)) or v is None else json.dumps(v, default=str))
                          for c in cols} for r in rows])


def datasets(train_cfg, train_rows: list[dict] | None, bench_rows: dict[str, list[dict]], eval_cfg) -> list:
    """MLflow DatasetInputs: the training prompts (context ``training``) and each benchmark (``evaluation``).

    Name: ``<data.name>/train`` and the benchmark's name; source: the benchmark's local file when
    ``eval.data_dir`` holds it, else the generating task and its config (a code source); digest: MLflow's digest
    of the rows, so it changes when the data does."""
    from mlflow.data.pandas_dataset import from_pandas
    from mlflow.entities import DatasetInput, InputTag

    out = []
    if train_rows:
        name = str(train_cfg.get("name", "train"))
        src = _dataset_source(None, {"rlvr.task": name, "rlvr.split": "train",
                                     "rlvr.data": json.dumps(_plain(train_cfg), default=str, sort_keys=True)})
        ds = from_pandas(_frame(train_rows), source=src, name=f"{name}/train")
        out.append(DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", "training")]))
    data_dir = eval_cfg.get("data_dir") if eval_cfg is not None else None
    for bench, rows in bench_rows.items():
        path = Path(str(data_dir)) / bench / "test.jsonl" if data_dir else None
        src = _dataset_source(path, {"rlvr.task": bench, "rlvr.split": "eval",
                                     "rlvr.max_prompts": eval_cfg.get("max_prompts")})
        ds = from_pandas(_frame(rows), source=src, name=bench)
        out.append(DatasetInput(ds._to_mlflow_entity(), [InputTag("mlflow.data.context", "evaluation")]))
    return out


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        return dict(cfg)


def log_datasets(run_id: str, train_cfg, train_rows, bench_rows, eval_cfg, store: tracking.Store) -> None:
    """Log :func:`datasets` to ``run_id``. Never raises (a warning instead): datasets describe a run, the run's
    results do not depend on them."""
    try:
        inputs = datasets(train_cfg, train_rows, bench_rows, eval_cfg)
        if inputs:
            store.log_inputs(run_id, inputs)
    except Exception as e:
        log.warning("run %s: could not log its datasets: %s: %s", run_id, type(e).__name__, e)


def log_union_of_datasets(run_id: str, runs, store: tracking.Store) -> None:
    """Log to ``run_id`` (a sweep's parent) every distinct (dataset, context) the ``runs`` (MLflow Run objects of its
    children) logged, so the parent row's Dataset column shows what the sweep trained and evaluated on."""
    seen, out = set(), []
    for r in runs:
        for d in getattr(getattr(r, "inputs", None), "dataset_inputs", None) or []:
            ctx = {t.key: t.value for t in d.tags}.get("mlflow.data.context")
            key = (d.dataset.name, d.dataset.digest, ctx)
            if key not in seen:
                seen.add(key)
                out.append(d)
    if out:
        store.log_inputs(run_id, out)


class SystemMetrics:
    """Context manager: MLflow's system-metrics monitor on ``run_id`` (metrics ``system/...``: CPU utilisation,
    system memory, and on NVIDIA GPUs utilisation and memory per GPU), sampled every ``interval_s`` seconds and
    logged at once. With ``resume`` (a run another process started), its steps continue after the last one the run
    holds instead of starting again at 0. A no-op when ``enabled`` is false or psutil is missing (a warning says so)."""

    def __init__(self, run_id: str, enabled: bool = True, interval_s: float = 10.0, resume: bool = False):
        self.run_id, self.enabled, self.interval_s, self.monitor = run_id, enabled, float(interval_s), None
        self.resume = bool(resume)

    def __enter__(self):
        if not self.enabled:
            return self
        try:
            import psutil  # noqa: F401  (MLflow's CPU and memory monitor)
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop lines, per run
            self.monitor = SystemMetricsMonitor(self.run_id, sampling_interval=self.interval_s, samples_before_logging=1,
                                                resume_logging=self.resume, tracking_uri=tracking.mlflow.get_tracking_uri())
            self.monitor.start()
        except Exception as e:
            log.warning("system metrics are off for run %s: %s: %s", self.run_id, type(e).__name__, e)
            self.monitor = None
        return self

    def __exit__(self, *exc):
        monitor, self.monitor = self.monitor, None  # idempotent: exception paths may call it twice
        if monitor is not None:
            try:
                monitor.finish()
            except Exception as e:
                log.warning("system metrics of run %s: %s: %s", self.run_id, type(e).__name__, e)
        return False


def system_metrics(cfg, run_id: str, resume: bool = False) -> SystemMetrics:
    """:class:`SystemMetrics` for ``run_id`` as ``cfg.tracking`` asks (``resume``: the run was started by another
    process, see :class:`SystemMetrics`)."""
    t = cfg.get("tracking", {}) or {}
    return SystemMetrics(run_id, bool(t.get("system_metrics", True)), float(t.get("system_metrics_interval_s", 10.0)),
                         resume)


def report_folder(experiment: str, sweep_id: str | None = None, out_dir=None) -> Path:
    """Where a report goes: ``report.out_dir`` when set; else ``reports_out/<experiment>/<sweep folder name>`` for a
    sweep's own report (each sweep its own folder; ``reports_out/<experiment>/latest`` links the newest, see
    :func:`reports.build.build`), or ``reports_out/<experiment>/all`` for one over the whole experiment."""
    if out_dir:
        return Path(str(out_dir))
    return Path("reports_out") / str(experiment) / (Path(str(sweep_id)).name if sweep_id else "all")


def describe(cfg, point: str, metrics: dict, kind: str = "trained", sweep_id: str | None = None) -> str:
    """The Markdown description of a run: what it is, the swept values, headline metrics, the report's path (of
    sweep ``sweep_id``)."""
    algo = str(cfg.algo.name) if kind != "base" else "the starting model"
    n = cfg.eval.get("n") if cfg.get("eval") is not None else None
    head = headline(metrics, n)
    rep = cfg.get("report", {}) or {}
    report = report_folder(str(cfg.experiment_name), sweep_id, rep.get("out_dir")) / "report.html"
    lines = [f"**{algo}** on `{cfg.data.name}` with `{cfg.model.get('name', '')}`"
             + (f", {cfg.train.steps} steps of {cfg.train.prompts_per_step} prompts x {cfg.train.group_size}"
                if kind != "base" else "")]
    if point:
        lines.append(f"Swept values: `{point}`")
    if head:
        lines.append("Headline: " + ", ".join(f"{k.split('/')[-1].replace('_at_', '@')} {v:.4f}" for k, v in head.items())
                     + f" (mean over {', '.join(str(b) for b in cfg.eval.benchmarks)})")
    lines.append(f"Report: `{report.resolve()}` (built when the sweep ends)")
    return "\n\n".join(lines)
