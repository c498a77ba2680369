"""MLflow plumbing: store and experiment setup, parameter flattening, finished-run lookup."""
from __future__ import annotations

from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

TAG_HASH = "rlvr.config_hash"
TAG_KIND = "rlvr.kind"  # trained | duplicate
TAG_DUP_OF = "rlvr.duplicate_of"


def _artifact_uri(root: str) -> str:
    if "://" in root:
        return root
    return Path(root).resolve().as_uri()


def setup_experiment(tracking_uri: str, experiment_name: str, artifact_root: str) -> str:
    """Point MLflow at ``tracking_uri`` and return the id of ``experiment_name`` (created if new,
    with its artifacts under ``artifact_root``/<experiment>)."""
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment_name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(experiment_name, artifact_location=_artifact_uri(str(Path(artifact_root) / experiment_name)) if "://" not in artifact_root else f"{artifact_root.rstrip('/')}/{experiment_name}")
    except Exception:  # created concurrently by another job
        exp = client.get_experiment_by_name(experiment_name)
        if exp is None:
            raise
        return exp.experiment_id


def flatten(d, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are kept as their string form."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def retry(fn, *args, attempts: int = 8, **kwargs):
    """Call ``fn``; retry with backoff while SQLite says "database is locked" (parallel jobs, one file)."""
    import time

    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # sqlalchemy OperationalError wrapped by MLflow
            if "locked" not in str(e).lower() or i == attempts - 1:
                raise
            time.sleep(0.2 * 2 ** i)


def runs_with_hash(experiment_id: str, config_hash: str, kind: str = "trained"):
    """All runs of the experiment with this config hash and kind, oldest first."""
    return MlflowClient().search_runs(
        [experiment_id], filter_string=f"tags.`{TAG_HASH}` = '{config_hash}' and tags.`{TAG_KIND}` = '{kind}'",
        order_by=["attributes.start_time ASC"], max_results=1000,
    )


def find_finished_run(experiment_id: str, config_hash: str):
    """The earliest FINISHED trained run of the experiment with this config hash, or None."""
    runs = MlflowClient().search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_HASH}` = '{config_hash}' and tags.`{TAG_KIND}` = 'trained' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time ASC"],
        max_results=1,
    )
    return runs[0] if runs else None
