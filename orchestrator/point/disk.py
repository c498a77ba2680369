"""What a run and a sweep leave on disk, and what may go.

A finished run needs its final checkpoint (``checkpoint/``: reproduction, re-evaluation and a later point's checkpoint
reuse read it) and its kept step checkpoints (``checkpoints/step_N``, evaluated with ``eval.checkpoints=all``); it no
longer needs its training state (the local engine's ``state/``, 1.6 GB for the 135M model with AdamW; verl's
``verl_checkpoints/``), which only a resume reads: :func:`drop_state` removes it when the run finishes, unless
``train.keep_state=true``. ``python -m orchestrator.clean`` (:mod:`orchestrator.clean`) finds the rest.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("rlvr")


def size_bytes(path) -> int:
    """Bytes under ``path`` (a file or a folder; links not followed, a hard-linked file counted in each place);
    0 when it does not exist."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def human(n: float) -> str:
    """``n`` bytes as ``517 MB`` / ``1.6 GB`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB", "MB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def state_paths(engine_name: str, run_dir) -> list[Path]:
    """The paths of ``run_dir`` that hold the training state of engine ``engine_name`` (its ``state_paths``), the
    ones that exist."""
    from training.engines import engine

    return [p for p in engine(str(engine_name)).state_paths(run_dir) if p.exists()]


def drop_state(cfg, run_dir) -> int:
    """Remove the training state of a run that has finished (see the module docstring), unless
    ``train.keep_state``. Returns the bytes freed; never raises (a state left behind is reported, not fatal)."""
    if bool(cfg.train.get("keep_state", False)):
        return 0
    freed = 0
    try:
        for p in state_paths(str(cfg.engine.name), run_dir):
            n = size_bytes(p)
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            freed += n
    except Exception as e:
        log.warning("the training state in %s was not removed: %s: %s", run_dir, type(e).__name__, e)
    return freed
