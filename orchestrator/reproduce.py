"""``python -m orchestrator.reproduce RUN_ID``: train and evaluate a finished run again from its logged config, into a
new run beside it, and print every metric that moved.

The new run is the original's config (the artifact ``config.yaml``, resolved as the run saw it) with ``force`` set,
so the suite's own run identity does not take it for a duplicate; it is tagged ``rlvr.reproduces=RUN_ID``, and
records its own provenance (:mod:`orchestrator.point.provenance`), so the versions that differ between the two runs are
printed too. Every metric series of the original run (training metrics step by step, evaluation metrics, pass@k)
is compared with the new run's, value by value; timings, throughput and memory are listed apart, as they differ
between any two runs. On the CPU a re-run of the same code is bitwise identical (tests/e2e/test_sweep.py).

Exit status: 0 when the re-run finished (with ``--strict``: and every compared series is identical, else 1); 2 on
bad input (no such run, no logged config, a run that did not train), before any work starts.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from core import tags
from orchestrator.point import provenance

#: metric names that measure the machine, not the algorithm: never expected to repeat
NOT_REPRODUCIBLE = re.compile(r"(^system/|time|timing|_s$|_s/|_ms$|per_s|throughput|memory|mem_|_mem|gpu_hours|wall)")


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _history(store, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in store.metric_history(run_id, key))


def compare(store, original: str, again: str) -> tuple[list[dict], list[str]]:
    """Every metric series of run ``original`` against run ``again``, read through ``store`` (an
    :class:`orchestrator.store.tracking.Store`): (one row per compared series with ``key``, ``points`` compared,
    ``differing`` points, ``max_abs_diff`` and ``identical`` (bitwise, NaN equal to NaN, the same steps), the names set
    apart by :data:`NOT_REPRODUCIBLE`)."""
    keys = sorted(store.run(original).data.metrics)
    rows, apart = [], []
    for key in keys:
        if NOT_REPRODUCIBLE.search(key):
            apart.append(key)
            continue
        a, b = _history(store, original, key), _history(store, again, key)
        same_steps = [s for s, _ in a] == [s for s, _ in b]
        pairs = list(zip([v for _, v in a], [v for _, v in b]))
        differing = [(x, y) for x, y in pairs if not (x == y or (math.isnan(x) and math.isnan(y)))]
        diffs = [abs(x - y) for x, y in differing if not (math.isnan(x) or math.isnan(y))]
        rows.append({"key": key, "points": len(a), "differing": len(differing) + (0 if same_steps else 1),
                     "max_abs_diff": max(diffs) if diffs else (0.0 if not differing else math.nan),
                     "identical": same_steps and not differing})
    return rows, apart


def default_workdir(run_id: str) -> Path:
    """``outputs/reproduce/<RUN_ID[:8]>-<date>_<time>``: where a re-run writes (its config, its run folder ``run/``
    with the checkpoint, ``reproduce.log`` with everything said, the libraries' output included)."""
    import time

    return Path("outputs") / "reproduce" / f"{run_id[:8]}-{time.strftime('%Y-%m-%d_%H-%M-%S')}"


def reproduce(run_id: str, tracking_uri: str, workdir: Path | None = None) -> str:
    """Re-run run ``run_id`` of the store at ``tracking_uri`` from its logged config, in ``workdir`` (default
    :func:`default_workdir`; the new run's folder is ``workdir/run``); returns the new run's id.

    Raises:
        SystemExit(2): no such run, not a trained run, or no ``config.yaml`` artifact.
    """
    from omegaconf import OmegaConf, open_dict

    from orchestrator.point.run import run as run_point  # the function sweep.py runs for each point
    from orchestrator.store import tracking

    store = tracking.Store.at(tracking_uri)
    original = store.find_run(run_id)
    if original is None:
        _fail(f"RUN_ID={run_id}: no such run in {tracking_uri}")
    if original.data.tags.get(tags.KIND, "trained") != "trained":
        _fail(f"RUN_ID={run_id}: a {original.data.tags.get(tags.KIND)} run; only trained runs are re-run")
    workdir = Path(workdir or default_workdir(run_id))
    workdir.mkdir(parents=True, exist_ok=True)
    from core.console import setup

    setup(workdir / "reproduce.log")
    print(f"re-running run {run_id} in {workdir.resolve()} (its run folder run/, its log reproduce.log)", flush=True)
    try:
        path = store.download_artifacts(run_id, "config.yaml", str(workdir))
    except Exception:
        _fail(f"RUN_ID={run_id}: the run has no config.yaml artifact to re-run from")
    cfg = OmegaConf.load(path)
    with open_dict(cfg):
        cfg.force = True
        cfg.tracking.uri = tracking_uri
    summary = run_point(cfg, run_dir=workdir / "run")
    new_id = summary["run_id"]
    store.set_tag(tags.REPRODUCES, run_id, new_id)
    return new_id


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="the store the run is in (default: %(default)s)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any compared metric series differs")
    args = p.parse_args(argv)
    from orchestrator.store import tracking

    new_id = reproduce(args.run_id, args.tracking_uri)
    store = tracking.Store.at(args.tracking_uri)
    rows, apart = compare(store, args.run_id, new_id)
    same = [r for r in rows if r["identical"]]
    print(f"re-run of {args.run_id}: run {new_id}, its folder {Path(store.run(new_id).data.tags.get(tags.RUN_DIR, '?')).resolve()}")
    env = provenance.differences({args.run_id: store.run(args.run_id).data.tags,
                                  new_id: store.run(new_id).data.tags})
    for key, values in env.items():
        print(f"  provenance differs: {key}: " + "; ".join(f"{v} ({', '.join(ids)})" for v, ids in values.items()))
    print(f"{len(same)} of {len(rows)} metric series identical (bitwise); {len(apart)} timing/memory series not compared")
    for r in rows:
        if not r["identical"]:
            print(f"  differs: {r['key']}: {r['differing']} of {r['points']} values, max |difference| {r['max_abs_diff']:.3g}")
    return 1 if args.strict and len(same) < len(rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
