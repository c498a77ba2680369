"""Run lifecycle shared by every engine and the orchestrator: the preemption flag, the phases a stop request may
end at once, and the layout of the Hugging Face checkpoints a training run keeps.

Layout of a run folder (``run_dir``):

    checkpoint/              the final policy (Hugging Face format), what evaluation reads
    checkpoints/step_<N>/    the policy after N training steps, kept every ``train.save_every`` steps
    state/                   full training state for resumption (engine-specific)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import threading
from pathlib import Path

STOP_REQUESTED = threading.Event()  # set by a preemption signal handler: save state and stop after this step
TRAINING = threading.Event()  # set while an engine trains: a stop request is honoured at the end of its step


class _Flag:
    """A flag a signal handler may read and write: a plain attribute, no lock (a handler that waited for a lock the
    interrupted main thread holds would wait forever)."""

    def __init__(self):
        self.value = False


ABORTABLE = _Flag()  # true while a step generates and scores: a stop request ends the step at once
OWNER_PID = os.getpid()  # the process whose steps a stop request ends (a forked worker inherits the handlers)


class Preempted(Exception):
    """Training stopped at a step boundary after saving its full state (see :data:`STOP_REQUESTED`)."""


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM or SIGINT outside SLURM); ``signum`` is the signal's number and
    ``state_saved`` whether training saved its full state first."""

    def __init__(self, signum: int, state_saved: bool = False, where: str = ""):
        super().__init__(signum, state_saved, where)
        self.signum, self.state_saved, self.where = int(signum), state_saved, where


class StepAborted(BaseException):
    """A stop request ended a training step before its update (:func:`abortable`): nothing the step changed is in
    the training state yet, so the state of the last completed step is what a resumed run continues from. A
    ``BaseException``, as ``KeyboardInterrupt`` is: the ``except Exception`` of a library or of the verifier (which
    scores a failed check incorrect) must not swallow it."""


@contextlib.contextmanager
def abortable():
    """A phase of a training step that a stop request may end at once: generation and scoring, which change no
    weight, optimiser or scheduler state (minutes per step at scale, longer than a scheduler's grace period). A
    request that arrives inside it raises :class:`StepAborted` from the signal handler, wherever the main thread is
    (a blocking call is interrupted); one that arrived before it raises on entry.

    Raises:
        StepAborted: a stop was requested before or during the phase.
    """
    global OWNER_PID
    if STOP_REQUESTED.is_set():
        raise StepAborted()
    OWNER_PID = os.getpid()
    ABORTABLE.value = True
    try:
        if STOP_REQUESTED.is_set():  # requested between the check above and the flag
            raise StepAborted()
        yield
    finally:
        ABORTABLE.value = False


def request_stop() -> None:
    """What a stop signal's handler calls: set :data:`STOP_REQUESTED`, and inside an :func:`abortable` phase raise
    :class:`StepAborted` there at once; elsewhere training stops after its running optimiser step (inside the
    update: :class:`training.update.UpdateStopped`) or at the end of its step. In a forked child of the
    training process (a worker pool) it does nothing.

    Raises:
        StepAborted: inside an abortable phase.
    """
    if os.getpid() != OWNER_PID:  # a forked worker (the verifier's pool) that inherited the handler: not its step
        return
    STOP_REQUESTED.set()
    if ABORTABLE.value:
        ABORTABLE.value = False
        raise StepAborted()


def final_checkpoint_dir(run_dir) -> Path:
    """``run_dir/checkpoint``: the final policy of a run."""
    return Path(run_dir) / "checkpoint"


def step_checkpoint_dir(run_dir, step: int) -> Path:
    """``run_dir/checkpoints/step_<step>``: the policy after ``step`` completed training steps."""
    return Path(run_dir) / "checkpoints" / f"step_{int(step)}"


def selectable_checkpoint_dir(run_dir, step: int) -> Path:
    """``run_dir/selectable/step_<step>``: the policy after ``step`` completed steps, kept while
    ``eval.select_on=validation`` may still choose it (the best so far by the validation inside the loop, or the
    ``train.keep_top_k`` best); removed once it cannot be chosen."""
    return Path(run_dir) / "selectable" / f"step_{int(step)}"


def saved_checkpoints(run_dir, folder: str = "checkpoints") -> list[tuple[int, Path]]:
    """``[(step, path), ...]`` of the complete intermediate checkpoints of a run, by step.

    A folder counts once it holds ``config.json`` (a LoRA run's: ``adapter_config.json``); they are written to a
    temporary folder and renamed. ``folder="selectable"``: those of :func:`selectable_checkpoint_dir`.
    """
    root = Path(run_dir) / folder
    out = []
    for d in root.glob("step_*") if root.is_dir() else []:
        try:
            step = int(d.name.split("_", 1)[1])
        except ValueError:
            continue
        if (d / "config.json").is_file() or (d / "adapter_config.json").is_file():
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
