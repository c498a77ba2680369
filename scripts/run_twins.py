"""Run the CPU twins of the paper presets at their full size (SmolLM2-135M) and check what each one produced.

The test suite runs every twin through this script on the tiny random model (tests/e2e/test_twins.py); this script is
for the real twins, which take 3-15 minutes each on two CPU cores (docs/performance.md, "Paper presets' CPU twins"), too long for CI.

    python scripts/run_twins.py                          # the five twins whose times docs/performance.md quotes
    python scripts/run_twins.py trgrpo_kk_cpu --work DIR # one twin, its store and report under DIR/<twin>
    python scripts/run_twins.py quatro_log_ratio_ablation_cpu --set model=tiny-random   # what the tests run
    python scripts/run_twins.py cpu_study                # the CPU study (about an hour, docs/study.md)

For each twin: ``python sweep.py -m experiment=<twin>`` in its own folder, then checks that the sweep exited 0,
that every distinct effective config (``orchestrator.point.identity.config_hash`` over the preset's points) has a
FINISHED trained run, that the report was written with every paper table its ``report.sections`` names, non-empty,
and the twin's own checks below. Prints the wall time of
each. Exit status: 0 when every twin passed, 1 otherwise, 2 for an unknown twin name (before any work).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT = ["quatro_main_cpu", "quatro_staleness_cpu", "exppo_core_cpu", "trgrpo_kk_cpu",
           "quatro_log_ratio_ablation_cpu"]


def _kk_sizes(trained, cfgs):
    want = {"eval/kk/2_people/accuracy", "eval/kk/3_people/accuracy", "eval/kk/4_people/accuracy"}
    return [f"{r.info.run_id}: missing {sorted(want - set(r.data.metrics))}" for r in trained if not want <= set(r.data.metrics)]


def _staleness_epochs(trained, cfgs):
    want = sorted({int(c.train.ppo_epochs) for c in cfgs})  # the preset's 1, 2, 4, 8 unless overridden
    epochs = sorted(int(r.data.params["train.ppo_epochs"]) for r in trained if r.data.params["algo.name"] == "gspo")
    return [] if epochs == want else [f"GSPO's inner epochs {epochs}, expected {want}"]


def _study(trained, cfgs):
    """cpu_study: every method with two or more FINISHED seeds (the study's comparisons pool over them)."""
    seeds: dict = {}
    for r in trained:
        if r.info.status == "FINISHED":
            seeds.setdefault((r.data.params["algo.name"], r.data.params.get("delta")), set()).add(r.data.params["seed"])
    return [f"{algo} has seeds {sorted(s)}, expected two or more" for algo, s in seeds.items() if len(s) < 2]


CHECKS = {"trgrpo_kk_cpu": _kk_sizes, "quatro_staleness_cpu": _staleness_epochs, "cpu_study": _study}


def run_twin(name: str, work: Path, overrides=(), capture: bool = False, python=None) -> tuple[list[str], list]:
    """Run one twin in ``work/<name>`` (``overrides``: extra command-line overrides after the preset; ``python``: the
    command that starts Python, ``[sys.executable]`` unless given: the tests give their fork server's,
    tests/prewarmed.py).

    Returns:
        (problems found, empty when it passed; the twin's trained MLflow runs).
    """
    from mlflow.tracking import MlflowClient

    from orchestrator import ConfigError
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.point.identity import config_hash
    from orchestrator.store.tracking import TAG_HASH, TAG_KIND

    try:
        points = sweep_points([f"experiment={name}", *overrides], multirun=True)
    except ConfigError as e:
        return [f"does not compose: {e}"], []
    expected = {config_hash(cfg) for _, cfg in points}
    sections = list(points[0][1].report.get("sections") or [])  # the paper's tables the report must show
    cwd = work / name
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*(python or [sys.executable]), str(REPO / "sweep.py"), "-m", f"experiment={name}", *overrides], cwd=cwd,
                          capture_output=capture, text=True)
    if proc.returncode != 0:
        return [f"sweep exited {proc.returncode}: " + (proc.stderr[-3000:] if capture else "its log is above")], []
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name(name)
    runs = client.search_runs([exp.experiment_id], max_results=500) if exp else []
    trained = [r for r in runs if r.data.tags.get(TAG_KIND) == "trained"]
    problems = []
    finished = {r.data.tags.get(TAG_HASH) for r in trained if r.info.status == "FINISHED"}
    if expected - finished:
        problems.append(f"{len(expected - finished)} of the {len(expected)} distinct configs have no FINISHED "
                        f"trained run (trained runs: {sorted(r.info.status for r in trained)})")
    report = cwd / "reports_out" / name / "latest" / "report.html"
    if not report.is_file():
        problems.append("no report.html")
    else:
        html = report.read_text(encoding="utf-8")
        problems += [f"the report's paper section {s!r} is missing or empty" for s in sections
                     if f'class="paper-table" data-section="{s}"' not in html]
    return problems + CHECKS.get(name, lambda *_: [])(trained, [cfg for _, cfg in points]), trained


def main(argv=None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("twins", nargs="*", default=DEFAULT, help=f"twin presets (default: {' '.join(DEFAULT)})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="an override after the preset, for every twin (repeatable)")
    ap.add_argument("--work", type=Path, default=Path("twins_out"), help="folder for the twins' stores and reports")
    args = ap.parse_args(argv)
    known = sorted(p.stem for p in (REPO / "sweeps" / "experiment").glob("*_cpu.yaml")) + ["cpu_study"]
    bad = [t for t in args.twins if t not in known]
    if bad:
        print(f"unknown twin(s) {bad}; the CPU twins are: {', '.join(known)}", file=sys.stderr)
        return 2
    failed = 0
    for name in args.twins:
        t0 = time.monotonic()
        problems, _ = run_twin(name, args.work.resolve(), args.overrides)
        wall = time.monotonic() - t0
        print(f"{name}: {'passed' if not problems else 'FAILED'} in {int(wall // 60)} min {wall % 60:.0f} s"
              + "".join(f"\n  - {p}" for p in problems), flush=True)
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
