"""verl's metrics into this run's MLflow run: verl's ``file`` logger writes per-step metrics as JSONL; a thread
(:class:`MetricsStreamer`) reads the complete records and logs them with sanitised names and the suite's standard
names beside verl's (:data:`ALIASES`, :func:`mlflow_metrics`), so the report's panels read both engines alike."""
from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Callable

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")
ALIASES = {  # verl metric -> this suite's standard name (the report's panels)
    "critic/score/mean": "train/reward_mean",
    "actor/entropy": "train/entropy",
    "actor/kl_loss": "train/kl_ref",
    "actor/grad_norm": "train/grad_norm",
    "actor/clip_fraction": "train/clip_fraction",
    "actor/pg_loss": "train/policy_loss",
    "response_length/mean": "train/response_length_mean",
    "response_length/max": "train/response_length_max",
    "timing_s/step": "train/step_time_s",
    "actor/lr": "train/lr",
}


def aliases_for(loss_agg_mode: str) -> dict:
    """:data:`ALIASES` usable for a run: verl aggregates ``actor/entropy`` with the loss's aggregation
    mode, a per-token mean only for ``token-mean`` and ``seq-mean-token-mean``."""
    if loss_agg_mode in ("token-mean", "seq-mean-token-mean"):
        return dict(ALIASES)
    return {k: v for k, v in ALIASES.items() if k != "actor/entropy"}


def mlflow_metrics(data: dict, aliases: dict | None = None) -> dict:
    """verl's per-step metrics as MLflow metrics: every finite number under ``verl/<name>`` with
    characters MLflow rejects replaced by ``_`` (``@`` -> ``_at_``), plus this suite's standard names
    for the metrics in ``aliases`` (default :data:`ALIASES`: ``train/reward_mean``, ``train/entropy``, ...),
    and ``train/<name>`` for the metrics the suite's own functions report through the adapters: the
    estimator's ``rlvr/<name>`` and the loss's ``actor/<name>`` (those not in :data:`ALIASES`), the names the
    local engine logs."""
    aliases = ALIASES if aliases is None else aliases
    out = {}
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            continue
        if "/row_index/" in str(k) or str(k).endswith("/row_index"):  # the reward's bookkeeping, not a measure
            continue
        out["verl/" + _BAD_CHARS.sub("_", str(k).replace("@", "_at_"))] = float(v)
        if k in aliases:
            out[aliases[k]] = float(v)
        elif str(k).startswith(("rlvr/", "actor/")) and k not in ALIASES:
            out["train/" + _BAD_CHARS.sub("_", str(k).split("/", 1)[1])] = float(v)
    return out


def read_new_metrics(path: Path, offset: int) -> tuple[list[tuple[int, dict]], int]:
    """Complete JSONL records ``{"step", "data"}`` written to verl's file logger after byte ``offset``.

    Returns:
        ([(step, data), ...], new offset). A partly written last line is left for the next call.
    """
    if not path.is_file():
        return [], offset
    if path.stat().st_size < offset:  # the file was recreated (verl opens it with "wb"): start over
        offset = 0
    with open(path, "rb") as f:
        f.seek(offset)
        chunk = f.read()
    out = []
    end = chunk.rfind(b"\n") + 1
    for line in chunk[:end].splitlines():
        if line.strip():
            try:
                rec = json.loads(line)
                out.append((int(rec["step"]), rec.get("data") or {}))
            except (ValueError, KeyError, TypeError):  # a damaged line loses one record, not the stream
                continue
    return out, offset + end


class MetricsStreamer(threading.Thread):
    """Stream verl's JSONL metrics into ``log_metrics(metrics, step)`` while verl runs; steps at or
    below ``logged_through`` (already in the tracker from an earlier attempt) are skipped, so a
    resumed run logs every step once. Step numbers are verl's ``global_steps`` minus 1 (0-based, as
    the local engine)."""

    def __init__(self, path: Path, log_metrics: Callable[[dict, int], None], logged_through: int = -1,
                 poll_s: float = 2.0, progress=None, aliases: dict | None = None):
        super().__init__(daemon=True)
        self.path, self.log_metrics, self.logged_through = Path(path), log_metrics, logged_through
        self.aliases = aliases
        self.poll_s, self.progress, self.offset = poll_s, progress, 0
        self.stop_event = threading.Event()

    def flush(self) -> None:
        records, self.offset = read_new_metrics(self.path, self.offset)
        for step, data in records:
            step0 = step - 1
            if self.progress is not None:
                self.progress(step0)
            if step0 > self.logged_through:
                m = mlflow_metrics(data, self.aliases)
                if m:
                    self.log_metrics(m, step0)
                self.logged_through = step0

    def run(self) -> None:
        while not self.stop_event.wait(self.poll_s):
            self.flush()
        self.flush()
