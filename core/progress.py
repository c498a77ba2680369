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


class LineProgress:
    """One log line per :meth:`update` when not :func:`interactive` (else silent: the bar shows it).

    Args:
        desc: what is running (``train quatro``); total: units in all; start: units already done (a resume).
    """

    def __init__(self, desc: str, total: int, start: int = 0, unit: str = "step"):
        self.desc, self.total, self.start, self.unit = desc, int(total), int(start), unit
        self.enabled = not interactive()
        self.t0 = time.perf_counter()

    def update(self, done: int, **fields) -> str | None:
        """Log ``desc: unit done/total, k v ..., rate (s/unit, or units/s when faster than one a second), elapsed,
        ETA``; returns the line (None when disabled)."""
        if not self.enabled:
            return None
        elapsed = time.perf_counter() - self.t0
        rate = elapsed / max(done - self.start, 1)
        parts = [f"{self.desc}: {self.unit} {done}/{self.total}"]
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        speed = f"{rate:.1f} s/{self.unit}" if rate >= 1 else f"{1 / max(rate, 1e-9):.1f} {self.unit}s/s"
        parts += [speed, f"elapsed {_clock(elapsed)}", f"ETA {_clock(rate * (self.total - done))}"]
        line = ", ".join(parts)
        log.info(line)
        return line


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
    lines = LineProgress(desc, total, unit=unit)
    for i, x in enumerate(items, 1):
        yield x
        lines.update(i)
