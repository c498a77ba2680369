"""Build the sweep report: MLflow -> executed notebook -> HTML (+ PNG figures), logged back to MLflow.

    python -m reports --experiment NAME [--baseline RUN_OR_ALGO] [--tracking-uri URI] [--out DIR]

The notebook's source is ``reports/templates/report.py`` (a jupytext percent script under version
control); its ``parameters`` cell is replaced with the arguments, the notebook is executed with
nbclient and exported with nbconvert.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent / "templates" / "report.py"
REPO = Path(__file__).resolve().parent.parent


def _parameters_source(**params) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in params.items())


def build(experiment: str, tracking_uri: str = "sqlite:///mlflow.db", baseline: str | None = None, out_dir=None,
          log_to_mlflow: bool = True, timeout_s: int = 600, parent_run_id: str | None = None,
          sections: list | None = None) -> dict:
    """Write and execute the report notebook for ``experiment``; export HTML; log both to MLflow.

    Args:
        experiment: MLflow experiment name; tracking_uri: the store (a relative sqlite path is
            resolved against the current directory); baseline: run label or algorithm name for the
            paired-bootstrap differences; out_dir: where files go (default ``reports_out/<experiment>``);
            parent_run_id: the sweep's parent run, under which the report run is nested; sections: the paper
            tables shown first (``report.sections``, :mod:`reports.sections`; None: read back from the runs' config).
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

    if tracking_uri.startswith("sqlite:///") and not tracking_uri.startswith("sqlite:////"):
        tracking_uri = "sqlite:///" + str(Path(tracking_uri[len("sqlite:///"):]).resolve())
    out = Path(out_dir or Path("reports_out") / experiment).resolve()
    out.mkdir(parents=True, exist_ok=True)
    nb = jupytext.read(TEMPLATE)
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            cell.source = _parameters_source(experiment=experiment, tracking_uri=tracking_uri, baseline=baseline,
                                             figures_dir=str(out / "figures"), work_dir=str(out), sections=sections)
            break
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["title"] = f"RLVR sweep report: {experiment}"  # the HTML page's title
    import shutil
    import tempfile

    from jupyter_client.manager import KernelManager

    sockets = tempfile.mkdtemp(prefix="rlvr-kernel-")  # IPC sockets: the kernel listens on no TCP port at all
    try:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(sockets) / "kernel"))
        NotebookClient(nb, km=km, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    nb_path, html_path = out / "report.ipynb", out / "report.html"
    nbformat.write(nb, nb_path)
    html, _ = HTMLExporter(exclude_input=True, template_name="offline",  # no CDN script: opens offline
                           extra_template_basedirs=[str(TEMPLATE.parent)]).from_notebook_node(nb)
    html_path.write_text(html, encoding="utf-8")
    figures = sorted((out / "figures").glob("*.png"))
    run_id = None
    if log_to_mlflow:
        import mlflow

        from orchestrator import tracking

        exp_id = tracking.setup_experiment(tracking_uri, experiment, "mlartifacts")
        with mlflow.start_run(experiment_id=exp_id, run_name=f"report {time.strftime('%Y-%m-%d %H:%M')}",
                              tags={"rlvr.kind": "report", **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})}) as r:
            mlflow.log_artifact(str(nb_path))
            mlflow.log_artifact(str(html_path))
            for f in figures:
                mlflow.log_artifact(str(f), artifact_path="figures")
            if (out / "paper").is_dir():  # PDF/SVG figures, CSV/LaTeX tables
                mlflow.log_artifacts(str(out / "paper"), artifact_path="paper")
            run_id = r.info.run_id
    return {"notebook": nb_path, "html": html_path, "figures": figures,
            "paper": sorted((out / "paper").glob("*")) if (out / "paper").is_dir() else [], "run_id": run_id}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiment", required=True)
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--baseline", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-mlflow", action="store_true", help="do not log the report to MLflow")
    args = ap.parse_args(argv)
    res = build(args.experiment, args.tracking_uri, args.baseline, args.out, log_to_mlflow=not args.no_mlflow)
    print(f"report: {res['html']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
