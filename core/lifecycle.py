"""Run lifecycle shared by every engine and the orchestrator: the preemption flag and the layout of
the Hugging Face checkpoints a training run keeps.

Layout of a run folder (``run_dir``):

    checkpoint/              the final policy (Hugging Face format), what evaluation reads
    checkpoints/step_<N>/    the policy after N training steps, kept every ``train.save_every`` steps
    state/                   full training state for resumption (engine-specific)
"""
from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

STOP_REQUESTED = threading.Event()  # set by a preemption signal handler: save state and stop after this step
TRAINING = threading.Event()  # set while an engine trains: a stop request is honoured at the end of its step


class Preempted(Exception):
    """Training stopped at a step boundary after saving its full state (see :data:`STOP_REQUESTED`)."""


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM or SIGINT outside SLURM); ``signum`` is the signal's number and
    ``state_saved`` whether training saved its full state first."""

    def __init__(self, signum: int, state_saved: bool = False, where: str = ""):
        super().__init__(signum, state_saved, where)
        self.signum, self.state_saved, self.where = int(signum), state_saved, where


def final_checkpoint_dir(run_dir) -> Path:
    """``run_dir/checkpoint``: the final policy of a run."""
    return Path(run_dir) / "checkpoint"


def step_checkpoint_dir(run_dir, step: int) -> Path:
    """``run_dir/checkpoints/step_<step>``: the policy after ``step`` completed training steps."""
    return Path(run_dir) / "checkpoints" / f"step_{int(step)}"


def saved_checkpoints(run_dir) -> list[tuple[int, Path]]:
    """``[(step, path), ...]`` of the complete intermediate checkpoints of a run, by step.

    A folder counts once it holds ``config.json`` (they are written to a temporary folder and renamed).
    """
    root = Path(run_dir) / "checkpoints"
    out = []
    for d in root.glob("step_*") if root.is_dir() else []:
        try:
            step = int(d.name.split("_", 1)[1])
        except ValueError:
            continue
        if (d / "config.json").is_file():
            out.append((step, d))
    return sorted(out)


def save_atomically(target: Path, save_fn) -> Path:
    """Run ``save_fn(tmp_dir)`` and rename the result to ``target`` (replacing an older one), so a kill
    mid-save never leaves a half-written checkpoint under ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_fn(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target
