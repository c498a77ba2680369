"""Build the sweep report: MLflow -> executed notebook -> HTML (+ PNG figures), logged back to MLflow.

    python -m reports --experiment NAME [--sweep DIR_OR_NAME ...] [--filter MLFLOW_FILTER] [--baseline RUN_OR_ALGO]
                      [--tracking-uri URI] [--out DIR]

The notebook's source is ``reports/templates/report.py`` (a jupytext percent script under version
control); its ``parameters`` cell is replaced with the arguments, the notebook is executed with
nbclient and exported with nbconvert.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core import tags

TEMPLATE = Path(__file__).resolve().parent / "templates" / "report.py"
REPO = Path(__file__).resolve().parent.parent


def _parameters_source(**params) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in params.items())


@dataclass(frozen=True)
class ReportOptions:
    """How :func:`build` makes the report beside its experiment, store, baseline, folder and sweeps.

    Attributes:
        sections: the paper tables shown first (``report.sections``, :mod:`reports.sections`; None: read back from
            the runs' config).
        run_filter: an MLflow search filter (``params.`algo.name` = 'grpo'``) applied first.
        progress: a line per executed cell (``python -m reports``; the sweep's own report stays quiet).
        timeout_s: the seconds one notebook cell may run.
    """

    sections: list | None = None
    run_filter: str = ""
    progress: bool = False
    timeout_s: int = 600


def build(experiment: str, tracking_uri: str = "sqlite:///mlflow.db", baseline: str | None = None, out_dir=None,
          log_to_mlflow: bool = True, parent_run_id: str | None = None, sweeps: list | None = None,
          options: ReportOptions | None = None) -> dict:
    """Write and execute the report notebook for ``experiment``; export HTML; log both to MLflow.

    Args:
        experiment: MLflow experiment name; tracking_uri: the store (a relative sqlite path is
            resolved against the current directory); baseline: run label or algorithm name for the
            paired-bootstrap differences; out_dir: where files go (default
            :func:`orchestrator.store.mlflow_views.report_folder`: ``reports_out/<experiment>/<sweep>`` for one sweep, with
            ``reports_out/<experiment>/latest`` linked to it when it is the newest sweep (:func:`newest_sweep`),
            else ``reports_out/<experiment>/all``);
            parent_run_id: the sweep's parent run, under which the report run is nested, and whose sweep's runs
            (``rlvr.sweep_id``) the report shows; sweeps: the sweeps shown (their folders or folder names; default:
            the parent run's sweep, or every run of the experiment); options: the paper tables shown first, the
            run filter, the progress lines and the cells' timeout (:class:`ReportOptions`; default: its defaults).
    Returns:
        {"notebook": path, "html": path, "figures": [paths], "paper": [paths of the PDF/SVG figures and CSV/LaTeX
        tables under ``out_dir/paper``], "run_id": MLflow report run id or None}.
    Raises:
        Exception: whatever executing the notebook raised (the sweep callback catches it).
    """
    import jupytext
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    options = options or ReportOptions()
    if tracking_uri.startswith("sqlite:///") and not tracking_uri.startswith("sqlite:////"):
        tracking_uri = "sqlite:///" + str(Path(tracking_uri[len("sqlite:///"):]).resolve())
    from orchestrator.store.mlflow_views import report_folder

    if parent_run_id and not sweeps:
        sweeps = [_sweep_of(tracking_uri, parent_run_id)]
    own = len(sweeps or ()) == 1 and not out_dir
    out = report_folder(experiment, sweeps[0] if own else None, out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(TEMPLATE)
    _set_parameters(nb, _parameters_source(
        experiment=experiment, tracking_uri=tracking_uri, baseline=baseline, figures_dir=str(out / "figures"),
        work_dir=str(out), sections=options.sections, sweeps=[str(x) for x in sweeps] if sweeps else None,
        run_filter=options.run_filter))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["title"] = f"RLVR sweep report: {experiment}"  # the HTML page's title
    km, sockets = _kernel_manager()
    client = NotebookClient(nb, km=km, timeout=options.timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}, **_progress_hook(nb, options.progress))
    _execute(client, km, sockets)
    nb_path, html_path = out / "report.ipynb", out / "report.html"
    nbformat.write(nb, nb_path)
    html, _ = HTMLExporter(exclude_input=True, template_name="offline",  # no CDN script: opens offline
                           extra_template_basedirs=[str(TEMPLATE.parent)]).from_notebook_node(nb)
    html_path.write_text(html, encoding="utf-8")
    if own and newest_sweep(tracking_uri, experiment, sweeps[0]):
        link_latest(out)
    figures = sorted((out / "figures").glob("*.png"))
    run_id = None
    if log_to_mlflow:
        run_id = _log_report(tracking_uri, experiment, parent_run_id, out, [nb_path, html_path], figures)
    return {"notebook": nb_path, "html": html_path, "figures": figures,
            "paper": sorted((out / "paper").glob("*")) if (out / "paper").is_dir() else [], "run_id": run_id}


def _set_parameters(nb, source: str) -> None:
    """Replace the source of the notebook's first cell tagged ``parameters`` with ``source`` (the build's arguments)."""
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = source
            break


def _kernel_manager():
    """(a kernel manager, the temporary folder of its IPC sockets): the kernel listens on no TCP port at all."""
    import tempfile

    from jupyter_client.manager import KernelManager

    sockets = tempfile.mkdtemp(prefix="rlvr-kernel-")
    return KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel")), sockets


def _progress_hook(nb, progress: bool) -> dict:
    """The notebook client's ``on_cell_executed`` hook printing a line per executed cell when ``progress``, else {}."""
    hook = {}
    if progress:
        from core.progress import LineProgress

        lines = LineProgress("report", len(nb.cells), unit="cell")
        hook["on_cell_executed"] = lambda cell_index, **_: lines.update(cell_index + 1)
    return hook


def _execute(client, km, sockets: str) -> None:
    """Execute the notebook of ``client``, then stop its kernel ``km`` and remove the ``sockets`` folder."""
    import shutil

    try:
        client.execute()
    finally:  # a kernel manager passed in is not the client's to stop: its channels and kernel are stopped here, so
        # neither "Could not destroy zmq context" nor the kernel's "Parent appears to have exited" ends the sweep
        kc = getattr(client, "kc", None)
        if kc is not None and kc.channels_running:
            kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        shutil.rmtree(sockets, ignore_errors=True)


def _log_report(tracking_uri: str, experiment: str, parent_run_id: str | None, out: Path, files: list,
                figures: list) -> str:
    """Log the report as an MLflow run of ``experiment`` (nested under ``parent_run_id`` when given): ``files`` (the
    notebook and the HTML page), ``figures`` under ``figures/`` and ``out/paper`` under ``paper/``; returns its id."""
    import mlflow

    from orchestrator.store import tracking

    exp_id = tracking.setup_experiment(tracking_uri, experiment, "mlartifacts")
    with mlflow.start_run(experiment_id=exp_id, run_name=f"report {time.strftime('%Y-%m-%d %H:%M')}",
                          tags={tags.KIND: "report", **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})}) as r:
        for f in files:
            mlflow.log_artifact(str(f))
        for f in figures:
            mlflow.log_artifact(str(f), artifact_path="figures")
        if (out / "paper").is_dir():  # PDF/SVG figures, CSV/LaTeX tables
            mlflow.log_artifacts(str(out / "paper"), artifact_path="paper")
        return r.info.run_id


def _sweep_of(tracking_uri: str, parent_run_id: str) -> str:
    """The sweep folder (``rlvr.sweep_id``) of a sweep's parent run."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri).get_run(parent_run_id).data.tags[tags.SWEEP_ID]


def newest_sweep(tracking_uri: str, experiment: str, sweep: str) -> bool:
    """True when ``sweep`` (a folder or its name) is the experiment's most recently started sweep (its parent run,
    ``rlvr.kind=sweep``, started last), or when the store has no sweep runs to tell: ``latest`` is moved only by a
    report of the newest sweep, so rebuilding an older sweep's report leaves it where it is."""
    from mlflow.tracking import MlflowClient

    from .load import in_sweeps

    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        exp = client.get_experiment_by_name(experiment)
        last = client.search_runs([exp.experiment_id], filter_string=f"tags.`{tags.KIND}` = 'sweep'",
                                  order_by=["attributes.start_time DESC"], max_results=1) if exp else []
    except Exception:  # noqa: BLE001 -- a store that cannot say: the report's own sweep is taken as the newest
        return True
    return not last or in_sweeps(last[0].data.tags, [sweep])


def link_latest(folder: Path) -> Path:
    """Point ``<folder's parent>/latest`` at ``folder`` (a relative symbolic link, replaced atomically), so the
    experiment's newest sweep report is at ``reports_out/<experiment>/latest/report.html``."""
    import os

    link = folder.parent / "latest"
    if link.exists() and not link.is_symlink():  # a folder of that name (report.out_dir=.../latest): left alone
        return link
    tmp = folder.parent / f".latest-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(folder.name, target_is_directory=True)
    os.replace(tmp, link)
    return link


def _check_out(out, fail) -> None:
    """``--out``: not a file, and a folder that can be written (read-only, /proc, a full disk: ``fail`` with one line,
    not a traceback)."""
    if not out:
        return
    if Path(out).exists() and not Path(out).is_dir():
        fail(f"--out={out}: a file, not a folder")
    from orchestrator.store import store_checks

    try:
        store_checks.check_writable(Path(out), f"--out={out}", 1.0)
    except store_checks.StoreError as e:
        fail(str(e))


def check_args(args) -> None:
    """The command's arguments checked before anything is loaded or created: the store exists (a SQLite file is
    never created by reading), the experiment is in it, each ``--sweep`` has runs in it, ``--out`` is not a
    file, ``--baseline`` names the base model's row, an algorithm or a run label of the runs the report shows.
    Raises SystemExit(2) after one line naming the bad value and what there is."""
    from mlflow.tracking import MlflowClient

    def fail(msg):
        print(f"error: {msg}", file=sys.stderr)
        raise SystemExit(2)

    uri = args.tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        fail(f"--tracking-uri={uri}: no such store (run from the folder the sweep ran in, or give its URI)")
    if not uri.startswith("sqlite:"):  # a server that does not answer: seconds, not MLflow's minutes of retries
        from orchestrator.store import tracking

        try:
            tracking.check_store(uri, "mlartifacts", min_free_mb=0)
        except tracking.StoreError as e:
            fail(str(e).replace("tracking.uri=", "--tracking-uri="))
    try:
        client = MlflowClient(tracking_uri=uri)
        names = [e.name for e in client.search_experiments()]
    except Exception as e:  # noqa: BLE001 -- a store that cannot be read, in one line
        fail(f"--tracking-uri={uri}: cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    if args.experiment not in names:
        fail(f"--experiment={args.experiment!r}: not in {uri} (experiments: {', '.join(sorted(names)) or 'none'})")
    if args.sweep:
        from .load import in_sweeps

        exp = client.get_experiment_by_name(args.experiment)
        known = {r.data.tags.get(tags.SWEEP_ID) for r in client.search_runs([exp.experiment_id], max_results=5000)}
        known.discard(None)
        for sw in args.sweep:
            if not any(in_sweeps({tags.SWEEP_ID: k}, [sw]) for k in known):
                fail(f"--sweep={sw!r}: no run of experiment {args.experiment!r} has it (sweeps: "
                     f"{', '.join(sorted(Path(k).name for k in known)) or 'none'})")
    _check_out(args.out, fail)
    if args.filter:
        try:
            client.search_runs([client.get_experiment_by_name(args.experiment).experiment_id],
                               filter_string=args.filter, max_results=1)
        except Exception as e:  # noqa: BLE001 -- MLflow's parse error, its first line
            fail(f"--filter={args.filter!r}: not an MLflow search filter ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if args.baseline:
        from orchestrator.checks.preflight import nearest

        from .data import short_labels
        from .load import BASE_LABEL, load_runs

        runs = short_labels(load_runs(uri, args.experiment, args.sweep or None, args.filter))
        trained = runs[runs["kind"] != "base"] if len(runs) else runs
        names = list(dict.fromkeys([BASE_LABEL, *(str(a) for a in trained.get("algo", [])),
                                    *(str(x) for x in trained.get("label", []))])) if len(runs) else [BASE_LABEL]
        if args.baseline not in names:
            fail(f"--baseline={args.baseline}: not among these runs{nearest(args.baseline, names)} (the base model's "
                 f"row, an algorithm or a run label: {', '.join(names)})")


def main(argv=None) -> int:
    """``python -m reports``: a report over a whole experiment (``reports_out/<experiment>/all``), over chosen
    sweeps (``--sweep``, repeatable; one sweep: its own folder), or over runs an MLflow filter picks (``--filter``).
    Bad arguments: one line, exit 2, before anything is built."""
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--sweep", action="append", default=[],
                    help="only this sweep's runs (its folder, or the folder's name; repeat to compare sweeps)")
    ap.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"params.`algo.name` = 'grpo'\"")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the report to MLflow")
    args = ap.parse_args(argv)
    from core.console import setup

    setup()  # the progress lines (one per executed cell) on the screen; the libraries' output off it
    check_args(args)
    res = build(args.experiment, args.tracking_uri, args.baseline, args.out, log_to_mlflow=not args.no_mlflow,
                sweeps=args.sweep or None, options=ReportOptions(run_filter=args.filter, progress=True))
    print(f"report: {res['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
