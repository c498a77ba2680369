"""A sweep point's stop signals (SIGTERM, SIGINT and, under SLURM, SIGUSR2), as one object that owns its state."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

log = logging.getLogger("rlvr")


class StopSignals:
    """A point's signal handling, as one object that owns its state.

    Outside SLURM, SIGTERM and SIGINT (``kill``, a container stop, Ctrl-C): while training, the first one asks for
    the state to be saved after the running optimiser step (as SIGUSR2 does on SLURM), or, during a step's generation
    and scoring, ends the step at once and saves the last completed step's state (:func:`core.lifecycle.abortable`) and is remembered in
    :attr:`signum` (the exit status says which); a second one, or one outside training, stops at once
    (:class:`core.lifecycle.Interrupted`). Under SLURM, SIGUSR2 (``--signal``, sent before the time limit or on
    preemption) asks training to save its full state after the running optimiser step; submitit's own handler, kept in
    :attr:`previous_usr2`, then requeues the job (:meth:`hand_on_preemption`)."""

    def __init__(self):
        self.signum: int = signal.SIGTERM
        self.previous_usr2 = None
        self._previous: dict = {}

    def install(self) -> None:
        """The stop handlers (outside SLURM, on the main thread only); :meth:`restore` puts the previous ones back."""
        from core.lifecycle import ABORTABLE, STOP_REQUESTED, TRAINING, Interrupted, request_stop

        if "SLURM_JOB_ID" in os.environ or threading.current_thread() is not threading.main_thread():
            return

        owner = os.getpid()

        def handler(signum, frame):
            if os.getpid() != owner:  # a forked worker (the verifier's pool) that inherited this handler
                return
            if TRAINING.is_set() and not STOP_REQUESTED.is_set():
                self.signum = signum
                log.warning("%s received: %s, then stopping (send it again to stop at once)", signal.Signals(signum).name,
                            "ending this step's generation and saving the last completed step's state"
                            if ABORTABLE.value else "saving the training state after the running optimiser step")
                request_stop()  # inside a step's generation or scoring: raises there (core.lifecycle.StepAborted)
                return
            raise Interrupted(signum)

        self._previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in self._previous:
            signal.signal(s, handler)

    def install_preemption(self) -> None:
        """Under SLURM: SIGUSR2 sets the stop request; submitit's handler is kept for :meth:`hand_on_preemption`."""
        if "SLURM_JOB_ID" not in os.environ:
            return
        from core.lifecycle import request_stop

        def handler(signum, frame):
            request_stop()  # inside a step's generation or scoring: raises there (core.lifecycle.StepAborted)

        if self.previous_usr2 is None:  # installed once per point: a second run of it keeps submitit's handler
            self.previous_usr2 = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, handler)

    def hand_on_preemption(self) -> None:
        """Call the SIGUSR2 handler that was there before (submitit's: it requeues the job)."""
        if callable(self.previous_usr2):
            self.previous_usr2(signal.SIGUSR2, None)

    @contextlib.contextmanager
    def installed(self):
        """``with signals.installed():`` the stop handlers (:meth:`install`) for the block, the previous ones put back
        on leaving it (:meth:`restore`)."""
        self.install()
        try:
            yield self
        finally:
            self.restore()

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

