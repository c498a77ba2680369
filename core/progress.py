"""Progress that a log file shows: with a terminal, tqdm bars; without one (a SLURM ``.out`` file, ``> log``),
one log line per unit of work (a training step, an evaluation chunk) with its numbers and the time left."""
from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("rlvr")


def interactive() -> bool:
    """True when stderr is a terminal (tqdm draws bars there; elsewhere :class:`LineProgress` writes lines)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _clock(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


#: seconds without a progress line after which a running :class:`LineProgress` says the unit is still under way
QUIET_S = 30.0


class LineProgress:
    """One log line per :meth:`update` when not :func:`interactive` (else silent: the bar shows it), and, while a
    unit takes longer than :data:`QUIET_S`, a line every :data:`QUIET_S` saying it is still under way (a first step
    or an evaluation chunk of minutes is never a silent stretch in a log file). Use it as a context manager, or call
    :meth:`close`, so that the reminder stops with the work.

    Args:
        desc: what is running (``train quatro``); total: units in all; start: units already done (a resume).
    """

    def __init__(self, desc: str, total: int, start: int = 0, unit: str = "step"):
        self.desc, self.total, self.start, self.unit = desc, int(total), int(start), unit
        self.enabled = not interactive()
        self.t0 = self.last = time.perf_counter()
        self.done = self.start
        self._stop = None
        if self.enabled and self.done < self.total:
            import threading
            import weakref

            self._stop = threading.Event()
            # the thread holds the progress weakly: one its owner dropped (an exception past it) stops reminding
            threading.Thread(target=_remind, args=(weakref.ref(self), self._stop), name="rlvr-progress",
                             daemon=True).start()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the still-under-way reminders (idempotent)."""
        if self._stop is not None:
            self._stop.set()

    def remind(self, now: float) -> str | None:
        """The still-under-way line when :data:`QUIET_S` passed since the last line (logged), else None."""
        if now - self.last < QUIET_S or self.done >= self.total:
            return None
        self.last = now
        line = f"{self.desc}: {self.unit} {self.done + 1}/{self.total} still under way, elapsed {_clock(now - self.t0)}"
        log.info(line)
        return line

    def update(self, done: int, **fields) -> str | None:
        """Log ``desc: unit done/total, k v ..., rate (s/unit, or units/s when faster than one a second), elapsed,
        ETA``; returns the line (None when disabled)."""
        if not self.enabled:
            return None
        self.done = done
        if done >= self.total:
            self.close()
        elapsed = time.perf_counter() - self.t0
        rate = elapsed / max(done - self.start, 1)
        parts = [f"{self.desc}: {self.unit} {done}/{self.total}"]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        speed = f"{rate:.1f} s/{self.unit}" if rate >= 1 else f"{1 / max(rate, 1e-9):.1f} {self.unit}s/s"
        parts += [speed, f"elapsed {_clock(elapsed)}", f"ETA {_clock(rate * (self.total - done))}"]
        line = ", ".join(parts)
        log.info(line)
        self.last = self.t0 + elapsed
        return line


def _remind(ref, stop) -> None:
    while not stop.wait(min(QUIET_S, 1.0)):
        progress = ref()
        if progress is None:
            return
        progress.remind(time.perf_counter())
        del progress


def track(items, desc: str, total: int | None = None, unit: str = "item"):
    """Iterate ``items`` showing progress: a tqdm bar on a terminal (stderr), else one log line per item
    (:class:`LineProgress`: ``desc: unit i/total, elapsed, ETA``). For the suite's long commands
    (``orchestrator.memory``, ``evaluation.recompute``, ``python -m reports``)."""
    items = list(items) if total is None else items
    total = len(items) if total is None else int(total)
    if interactive():
        from tqdm.auto import tqdm

        yield from tqdm(items, desc=desc, total=total, unit=unit)
        return
    with LineProgress(desc, total, unit=unit) as lines:
        for i, x in enumerate(items, 1):
            yield x
            lines.update(i)
