"""One owner per run: a lease held in the MLflow run's tags, so that two sweeps (or a sweep and its own
re-run) never train the same point at the same time, with MLflow as the only shared state.

Tags of a leased run:
    rlvr.host, rlvr.pid   where the owning process runs
    rlvr.owner            ``host:pid:token``, unique per claim
    rlvr.heartbeat        Unix time of the owner's last sign of life (every :data:`HEARTBEAT_S` s, and every step)

A lease is *live* while the run is RUNNING, its heartbeat is fresher than ``stale_s`` and, when it is held on
this host, its process exists (a dead PID on the same host is stale at once). A stale lease is taken over with
:func:`claim`: write a new owner token, wait :data:`SETTLE_S`, read it back; of several processes that claim at
once the last writer wins and every other one sees a token that is not its own (MLflow has no compare-and-set;
this closes the window to claims more than ``SETTLE_S`` apart, which is what the poll interval guarantees).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from core import tags as tag_names
from orchestrator.store import tracking

log = logging.getLogger("rlvr")

HEARTBEAT_S = 20.0
SETTLE_S = float(os.environ.get("RLVR_LEASE_SETTLE_S", "1.0"))


def pid_alive(pid: int) -> bool:
    """True when a process with this PID exists on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def new_owner() -> str:
    """A fresh owner token ``host:pid:hex``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def owner_tags(owner: str) -> dict:
    """The tags that make ``owner`` the lease holder, with a heartbeat of now."""
    return {tag_names.OWNER: owner, tag_names.HOST: socket.gethostname(), tag_names.PID: str(os.getpid()), tag_names.HEARTBEAT: f"{time.time():.3f}"}


def is_live(run, stale_s: float, now: float | None = None) -> bool:
    """Whether ``run`` (an MLflow Run) holds a live lease: RUNNING, heartbeat younger than ``stale_s`` seconds,
    and, when held on this host, its process alive."""
    if run.info.status != "RUNNING":
        return False
    tags = run.data.tags
    if tags.get(tag_names.HOST) == socket.gethostname() and tags.get(tag_names.PID, "").isdigit():
        if int(tags[tag_names.PID]) != os.getpid() and not pid_alive(int(tags[tag_names.PID])):
            return False
    try:
        beat = float(tags.get(tag_names.HEARTBEAT) or 0)
    except ValueError:
        beat = 0.0
    if not beat:  # a run from before leases existed: its start time is its last sign of life
        beat = (run.info.start_time or 0) / 1000
    return (now or time.time()) - beat < stale_s


def claim(store: tracking.Store, run_id: str, owner: str | None = None) -> str | None:
    """Take over the lease of ``run_id`` through ``store`` (an :class:`orchestrator.store.tracking.Store`); return the owner
    token when this process won, else None."""
    owner = owner or new_owner()
    store.set_tags(owner_tags(owner), run_id)
    time.sleep(SETTLE_S)
    return owner if store.run(run_id).data.tags.get(tag_names.OWNER) == owner else None


class Heartbeat(threading.Thread):
    """Refresh ``rlvr.heartbeat`` of ``run_id`` every ``every_s`` seconds until :attr:`stop` is set.
    :meth:`beat` refreshes it at once (the training loop calls it every step). A missed beat is logged, not
    raised: a long run of them lets another process take the run over, which is what a lost store means. A beat
    waits out an outage as its ``store`` (:class:`orchestrator.store.tracking.Store`) does. As a context manager it
    is started on entering and stopped (:attr:`stop` set) on leaving."""

    def __init__(self, store: tracking.Store, run_id: str, every_s: float = HEARTBEAT_S):
        super().__init__(daemon=True, name=f"rlvr-heartbeat-{run_id[:8]}")
        self.store, self.run_id, self.every_s, self.stop = store, run_id, every_s, threading.Event()
        self._last = 0.0
        self._now = threading.Event()

    def __enter__(self) -> Heartbeat:
        self.start()
        return self

    def __exit__(self, *exc) -> bool:
        self.stop.set()
        return False

    def nudge(self) -> None:
        """Ask the thread to beat now (the training loop, every step) without waiting on the store."""
        self._now.set()

    def beat(self, min_interval_s: float = 2.0) -> None:
        if time.time() - self._last < min_interval_s:
            return
        self._last = time.time()
        try:
            self.store.set_tag(tag_names.HEARTBEAT, f"{self._last:.3f}", self.run_id)
        except Exception as e:
            log.warning("heartbeat of run %s failed: %s", self.run_id, e)

    def run(self) -> None:
        while not self.stop.is_set():
            nudged = self._now.wait(self.every_s)
            self._now.clear()
            if self.stop.is_set():
                return
            self.beat(2.0 if nudged else 0.0)
