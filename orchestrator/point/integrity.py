"""Content hashes of a run's results, so that a corrupt or missing file is noticed before it is trusted.

At the end of a point, ``integrity.json`` (an artifact, and a copy in the run folder) records the SHA-256 of

    artifacts   every file logged as an artifact (``samples.parquet``, the table CSVs, ``eval/step_<N>/...``)
    run_dir     the files of the run folder that later stages read: the final checkpoint (``checkpoint/...``),
                kept checkpoints (``checkpoints/step_<N>/...``) and ``eval/.../samples.parquet``

Dedup (:func:`verify_run`) and the report check them: a finished run whose files do not match is not taken as
a duplicate target; the point is re-evaluated from its checkpoint, or retrained when the checkpoint is bad.
Runs finished before this file existed have no record and are taken as they are.
"""
from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from core import tags

log = logging.getLogger("rlvr")

RECORD = "integrity.json"


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_tree(root: Path, prefix: str) -> dict[str, str]:
    """``{prefix/relative path: sha256}`` of every file under ``root`` (empty when it does not exist)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {f"{prefix}/{p.relative_to(root).as_posix()}": sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def write_record(run_dir: Path, artifacts: dict[str, Path], run_files: dict[str, str]) -> Path:
    """Write ``run_dir/integrity.json`` from ``artifacts`` ({artifact path: local file}) and ``run_files``
    ({run-folder path: sha256}); returns its path."""
    record = {"artifacts": {rel: sha256(Path(p)) for rel, p in sorted(artifacts.items())}, "run_dir": dict(sorted(run_files.items()))}
    path = Path(run_dir) / RECORD
    path.write_text(json.dumps(record, indent=1))
    return path


def local_artifact_dir(run) -> Path | None:
    """The run's artifact folder when the artifact store is a local path, else None."""
    uri = run.info.artifact_uri or ""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if "://" not in uri and uri:
        return Path(uri)
    return None


def load_record(source, run) -> dict | None:
    """The run's ``integrity.json`` ({"artifacts": ..., "run_dir": ...}), or None when it has none. ``source`` reads a
    remote store's artifacts: anything with MLflow's ``download_artifacts(run_id, path, dst_path)``, the run's
    :class:`orchestrator.store.tracking.Store` (retried) or, for the reports, an MLflow client."""
    art = local_artifact_dir(run)
    try:
        if art is not None:
            path = art / RECORD
            if not path.is_file():
                return None
        else:
            path = Path(source.download_artifacts(run.info.run_id, RECORD, tempfile.mkdtemp(prefix="rlvr-int-")))
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    except Exception:  # a remote store without the file
        return None


def _check(path: Path, want: str) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        return None if sha256(path) == want else "corrupt (its SHA-256 differs from the one recorded)"
    except OSError as e:
        return f"unreadable ({e.strerror or e})"


def verify_run(source, run) -> tuple[list[str], bool]:
    """Check a finished run's files against its ``integrity.json`` (artifacts of a remote store read through
    ``source``, as :func:`load_record` reads them).

    Returns:
        (problems, checkpoint_ok): one line per bad file, naming it; ``checkpoint_ok`` is False when a file of
        the final or a kept checkpoint is bad (the point must be retrained, not only re-evaluated). Files of a
        run folder that is not reachable from here (another node) are not checked; artifacts of a remote store
        are checked by downloading them.
    """
    record = load_record(source, run)
    if record is None:
        return [], True
    problems, ckpt_ok = [], True
    run_dir = Path(run.data.tags.get(tags.RUN_DIR) or "/nonexistent")
    if run_dir.is_dir():
        for rel, want in record.get("run_dir", {}).items():
            why = _check(run_dir / rel, want)
            if why:
                problems.append(f"{run_dir / rel}: {why}")
                ckpt_ok = ckpt_ok and not rel.startswith("checkpoint")
    art = local_artifact_dir(run)
    for rel, want in record.get("artifacts", {}).items():
        if art is not None:
            path = art / rel
        else:
            try:
                path = Path(source.download_artifacts(run.info.run_id, rel, tempfile.mkdtemp(prefix="rlvr-int-")))
            except Exception:
                path = Path("/nonexistent") / rel
        why = _check(path, want)
        if why:
            problems.append(f"artifact {rel} of run {run.info.run_id} ({path}): {why}")
    return problems, ckpt_ok
