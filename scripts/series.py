"""Record every metric series a set of reference sweeps logs, and compare two recordings value for value.

A refactoring that must not change behaviour is checked by running the same sweeps before and after it and comparing
what they logged: every training, validation and evaluation series of every run, step by step, timings aside (phase
times, throughput, memory peaks and system metrics vary from run to run on the same code).

    python scripts/series.py record before.json                  # every job below, in temporary folders
    python scripts/series.py record after.json --only tiny_local,verl
    python scripts/series.py record old.json --code /path/to/an/older/checkout   # that checkout's code, this machine
    python scripts/series.py compare before.json after.json      # exit 1 on any difference; prints each

The jobs: ``main`` (the README's main job: ``algo=quatro,gspo delta=0.01,0.1`` on SmolLM2-135M, about 6 min on 2
cores), and on the tiny random model and ``toy_parity`` (tests/plugins/toy_tasks.py: rewards vary within a group) the
sweeps the tests run in small: ``staleness`` (k = 2, token TIS, emulated and overlapped, with validation along
training), ``lora`` (rank 4, three losses), ``dapo`` (dynamic sampling and overlong shaping, micro-batches under a
token budget, a stop-free checkpointed run) and ``verl`` (``experiment=verl_smoke`` with ExPPO and DAPO, verl's real
trainer on the CPU; skipped where verl or vLLM is not installed). verl's trainer on the CPU does not draw the same
samples twice (its rollout server schedules requests as they come: two runs of 147c0b6's code differed in 162 of its
series; docs/changelog.md), so for ``verl`` the comparison holds the metric names and the steps each was logged at, not the
values (its translation into verl's overrides is pinned value for value by
tests/training/test_verl_translation_fixture.py instead).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = ["model=tiny-random", "eval=smoke", "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=4",
        "train.max_new_tokens=8", "plugins=[tests.plugins.toy_tasks]", "data.name=toy_parity", "+data.n_prompts=16",
        "eval.benchmarks=[toy_parity]", "report.enabled=false"]
JOBS = {
    "main": ["-m", "algo=quatro,gspo", "delta=0.01,0.1"],
    "staleness": ["-m", "algo=grpo,quatro", *TINY, "train.steps=4", "train.rollout.staleness=2",
                  "train.rollout.correction=token_tis", "train.rollout.overlap=false,true", "train.rollout.sampler=hf",
                  "train.validate_every=2", "data.validation_prompts=4", "train.checkpoint_every=1"],
    "lora": ["-m", "algo=grpo,tr_grpo,cispo", *TINY, "train.steps=2", "train.lora.rank=4"],
    "dapo": ["-m", "algo=dapo,exppo", *TINY, "train.steps=3", "train.micro_batch_tokens=60",
             "train.checkpoint_every=2", "train.ppo_epochs=2"],
    "verl": ["-m", "experiment=verl_smoke", "algo=exppo,dapo", "train.steps=2", "report.enabled=false"],
}
#: jobs whose values differ between two runs of the same code: compared by their metric names and steps only
STRUCTURE_ONLY = ("verl",)
#: metric names whose values are timings, throughput, memory or machine readings: not compared
UNSTABLE = re.compile(r"(time|_s$|_s_|seconds|per_s|throughput|/wait|memory/|_gb$|^system/|peak|perf/|timing|mfu|"
                      r"overlap_wait|estimate|calibration|_ms$)")


def _available(job: str) -> str | None:
    """Why ``job`` cannot run here, or None."""
    if job == "verl":
        import importlib.util

        for mod in ("verl", "vllm", "ray"):
            if importlib.util.find_spec(mod) is None:
                return f"{mod} is not installed"
    return None


def run_job(job: str, code: Path, work: Path) -> dict:
    """Run ``job``'s sweep with the code of ``code`` in a new folder under ``work``; its runs' metric series."""
    cwd = work / job
    cwd.mkdir(parents=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])]))
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(code / "sweep.py"), *JOBS[job]], cwd=cwd, env=env,
                          capture_output=True, text=True)
    (cwd / "sweep.out").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{job}: the sweep failed (exit {proc.returncode}); its output: {cwd / 'sweep.out'}\n"
                         + proc.stderr[-3000:])
    print(f"{job}: {time.time() - t0:.0f} s", file=sys.stderr)
    return read_series(cwd / "mlflow.db")


def read_series(db: Path) -> dict:
    """``{run key: {metric: [[step, value], ...]}}`` of every run in the store at ``db`` but the sweeps' parents; a
    run's key is its kind and point name (the Initialization run: ``base``), each history in logged order."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    out: dict = {}
    for exp in client.search_experiments():
        for r in client.search_runs([exp.experiment_id], max_results=1000):
            kind = r.data.tags.get("rlvr.kind", "")
            if kind == "sweep":
                continue
            name = "report" if kind == "report" else r.info.run_name  # (a report's name carries its time)
            key = f"{exp.name}/{kind}/{name}"
            while key in out:  # two runs of one name (a re-run's): numbered in the store's order
                key += "+"
            series = {}
            for name in sorted(r.data.metrics):
                hist = client.get_metric_history(r.info.run_id, name)
                series[name] = [[int(m.step), float(m.value)] for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
            out[key] = series
    return out


def compare(a: dict, b: dict, rel: float = 1e-6) -> list[str]:
    """Every difference between two recordings (timings aside: :data:`UNSTABLE`), one line each."""
    diffs = []
    for job in sorted(set(a) | set(b)):
        if job not in a or job not in b:
            diffs.append(f"{job}: only in {'the first' if job in a else 'the second'} recording")
            continue
        for run in sorted(set(a[job]) | set(b[job])):
            ra, rb = a[job].get(run), b[job].get(run)
            if ra is None or rb is None:
                diffs.append(f"{job} {run}: only in {'the first' if rb is None else 'the second'}")
                continue
            for name in sorted(set(ra) | set(rb)):
                if UNSTABLE.search(name):
                    continue
                sa, sb = ra.get(name), rb.get(name)
                if sa is None or sb is None:
                    diffs.append(f"{job} {run} {name}: only in {'the first' if sb is None else 'the second'}")
                    continue
                if [s for s, _ in sa] != [s for s, _ in sb]:
                    diffs.append(f"{job} {run} {name}: steps {[s for s, _ in sa]} vs {[s for s, _ in sb]}")
                    continue
                if job in STRUCTURE_ONLY:
                    continue
                for (step, x), (_, y) in zip(sa, sb):
                    same = (math.isnan(x) and math.isnan(y)) or x == y or abs(x - y) <= rel * max(abs(x), abs(y), 1e-12)
                    if not same:
                        diffs.append(f"{job} {run} {name} step {step}: {x!r} vs {y!r}")
                        break
    return diffs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="run the jobs and write their series to OUT (JSON)")
    r.add_argument("out", type=Path)
    r.add_argument("--only", default=",".join(JOBS), help=f"comma-separated jobs of {list(JOBS)}")
    r.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs (default: this one)")
    c = sub.add_parser("compare", help="compare two recordings; exit 1 on a difference")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--rel", type=float, default=1e-6, help="relative tolerance (default 1e-6)")
    args = p.parse_args(argv)
    if args.cmd == "compare":
        diffs = compare(json.loads(args.a.read_text()), json.loads(args.b.read_text()), args.rel)
        for d in diffs:
            print(d)
        print(f"{len(diffs)} difference(s)", file=sys.stderr)
        return 1 if diffs else 0
    jobs = [j.strip() for j in args.only.split(",") if j.strip()]
    bad = [j for j in jobs if j not in JOBS]
    if bad:
        print(f"--only: unknown job(s) {bad}; jobs: {list(JOBS)}", file=sys.stderr)
        return 2
    out = json.loads(args.out.read_text()) if args.out.is_file() else {}
    work = Path(tempfile.mkdtemp(prefix="rlvr-series-"))
    for job in jobs:
        why = _available(job)
        if why:
            print(f"{job}: skipped ({why})", file=sys.stderr)
            continue
        out[job] = run_job(job, args.code.resolve(), work)
        args.out.write_text(json.dumps(out, indent=0, sort_keys=True))
    print(f"written: {args.out} (sweeps in {work})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
