"""How many sweep jobs at once a tracking store holds: SQLite on a shared folder against an MLflow server.

    python -m benchmarks.store_concurrency [--jobs 4,8,16,32] [--steps 20] [--interval 0.5]
                                           [--folder DIR] [--server-uri http://HOST:PORT]

Starts N processes at once, each writing what one sweep job writes to MLflow: a run with 150 parameters and 20
tags, then per training step a batch of 40 metrics and a heartbeat tag, every ``--interval`` seconds, each call
through the suite's own :func:`orchestrator.store.tracking.retry` (it waits out "database is locked"). The SQLite store
is one ``sqlite:///FOLDER/mlflow.db`` file that every process opens itself, as jobs on a shared folder do
(``--folder``: put it on the shared file system to measure that); ``--server-uri`` also measures an ``mlflow
server`` (for example over PostgreSQL: scripts/postgres/start.sh, then ``mlflow server --backend-store-uri
postgresql+psycopg://...``). Prints per store and N: calls that failed after retrying, metric points missing
when read back, and the per-call latency (median, 99th percentile, maximum) in seconds. A store holds N jobs
when nothing fails or goes missing and the 99th-percentile call stays under a second (a job's heartbeat and its
metric batches then never fall behind its steps).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

METRICS_PER_STEP, PARAMS, TAGS = 40, 150, 20
OUTAGE_S = 120.0  # how long each writer's store call waits out an unreachable store (a sweep's tracking.outage_s)


def _job(uri: str, exp_id: str, steps: int, interval: float, start_at: float, out) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    from orchestrator.store import tracking

    client = MlflowClient(tracking_uri=uri)
    lat, errors = [], []

    def call(fn, *a, **k):
        t0 = time.perf_counter()
        try:
            return tracking.retry(fn, *a, outage_s=OUTAGE_S, **k)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        finally:
            lat.append(time.perf_counter() - t0)

    time.sleep(max(0.0, start_at - time.time()))
    run = call(client.create_run, exp_id, tags={f"rlvr.tag{i}": "x" * 40 for i in range(TAGS)})
    run_id = run.info.run_id if run is not None else None
    if run_id:
        call(client.log_batch, run_id, params=[Param(f"p{i}", str(i)) for i in range(PARAMS)],
             tags=[RunTag("rlvr.kind", "bench")])
        for step in range(steps):
            ts = int(time.time() * 1000)
            call(client.log_batch, run_id, metrics=[Metric(f"train/m{i}", float(step * i), ts, step)
                                                    for i in range(METRICS_PER_STEP)])
            call(client.set_tag, run_id, "rlvr.heartbeat", f"{time.time():.3f}")
            time.sleep(interval)
        call(client.set_terminated, run_id, "FINISHED")
    out.put((run_id, lat, errors))


def measure(uri: str, jobs: int, steps: int, interval: float) -> dict:
    """Run ``jobs`` writer processes against ``uri`` at once; their failures, missing points and call latencies."""
    from mlflow.tracking import MlflowClient

    from orchestrator.store import tracking

    tracking.ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp_id = client.create_experiment(f"bench-{jobs}-{time.time_ns()}")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0 + 0.15 * jobs  # every process imported and waiting before the first call
    procs = [ctx.Process(target=_job, args=(uri, exp_id, steps, interval, start_at, out)) for _ in range(jobs)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    lat = sorted(x for _, ls, _ in results for x in ls)
    errors = [e for _, _, es in results for e in es]
    missing = 0
    for run_id, _, _ in results:
        if run_id is None:
            missing += steps * METRICS_PER_STEP
            continue
        run = client.get_run(run_id)
        for i in range(METRICS_PER_STEP):
            missing += steps - len(client.get_metric_history(run_id, f"train/m{i}")) if f"train/m{i}" in run.data.metrics \
                else steps
    return {"jobs": jobs, "failed_calls": len(errors), "missing_points": missing,
            "p50_s": statistics.median(lat), "p99_s": lat[int(0.99 * (len(lat) - 1))], "max_s": lat[-1],
            "first_error": errors[0] if errors else ""}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="4,8,16,32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between a job's steps")
    ap.add_argument("--folder", default=None, help="where the SQLite file goes (default: a temporary folder)")
    ap.add_argument("--server-uri", default=None, help="also measure this MLflow server")
    args = ap.parse_args(argv)
    stores = []
    for n in (int(x) for x in args.jobs.split(",")):
        folder = Path(args.folder or tempfile.mkdtemp(prefix="rlvr-store-bench-")) / f"sqlite-{n}"
        folder.mkdir(parents=True, exist_ok=True)
        stores.append(("sqlite file", f"sqlite:///{folder}/mlflow.db", n))
        if args.server_uri:
            stores.append(("server", args.server_uri, n))
    print(f"{'store':<12} {'jobs':>4} {'failed':>6} {'missing':>7} {'p50 s':>7} {'p99 s':>7} {'max s':>7}  holds")
    for name, uri, n in stores:
        r = measure(uri, n, args.steps, args.interval)
        holds = r["failed_calls"] == 0 and r["missing_points"] == 0 and r["p99_s"] < 1.0
        print(f"{name:<12} {n:>4} {r['failed_calls']:>6} {r['missing_points']:>7} {r['p50_s']:>7.3f} "
              f"{r['p99_s']:>7.3f} {r['max_s']:>7.3f}  {'yes' if holds else 'no'}  {r['first_error']}", flush=True)


if __name__ == "__main__":
    main()
