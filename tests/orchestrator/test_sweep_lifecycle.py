"""Failure isolation, idempotent re-runs, +force, and parallel jobs on one SQLite store."""
import json
import shutil

import pytest

from tests.conftest import require_benchmarks
from tests.e2e.test_sweep import TINY, _runs, _sweep

FAST = TINY + ["train.steps=2", "report.enabled=false"]


def _bench_dirs(tmp_path):
    src = require_benchmarks() / "aime24" / "test.jsonl"
    lines = src.read_text().splitlines()[:2]
    dirs = {}
    for name in ("good1", "good2", "bad"):
        d = tmp_path / "data" / name / "aime24"
        d.mkdir(parents=True)
        rows = [json.loads(x) for x in lines]
        if name == "bad":
            rows[1].pop("answer")
            rows[1].pop("solution")  # a row without a gold answer: the loader raises at evaluation time
        d.joinpath("test.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        dirs[name] = d.parent
    return dirs


def test_one_failing_point_does_not_stop_the_others_and_a_rerun_trains_only_it(tmp_path):
    dirs = _bench_dirs(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    args = ["-m", "algo=gspo", f"eval.data_dir={dirs['good1']},{dirs['good2']},{dirs['bad']}",
            "eval.benchmarks=[arithmetic,aime24]", *FAST]
    proc = _sweep(work, *args)
    assert proc.returncode != 0
    assert "Sweep summary" in proc.stdout and "1 point(s) failed" in proc.stdout
    client, runs = _runs(work)
    status = {r.data.params["eval.data_dir"]: r.info.status for r in runs}
    assert status == {str(dirs["good1"]): "FINISHED", str(dirs["good2"]): "FINISHED", str(dirs["bad"]): "FAILED"}
    failed = next(r for r in runs if r.info.status == "FAILED")
    tb = client.download_artifacts(failed.info.run_id, "traceback.txt", str(tmp_path))
    assert "no gold answer" in open(tb).read()

    shutil.copy(dirs["good1"] / "aime24" / "test.jsonl", dirs["bad"] / "aime24" / "test.jsonl")  # fix the cause
    proc = _sweep(work, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, runs = _runs(work)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    assert len(trained) == 4  # the three of the first sweep, plus only the fixed point
    assert sorted(r.info.status for r in trained) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "duplicate"]) == 2

    proc = _sweep(work, "-m", "algo=gspo", f"eval.data_dir={dirs['good1']}", "eval.benchmarks=[arithmetic,aime24]",
                  "+force=true", *FAST)
    assert proc.returncode == 0
    _, runs = _runs(work)
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]) == 5  # +force trains again


def test_parallel_jobs_on_one_new_sqlite_store_lose_no_metric(tmp_path):
    proc = _sweep(tmp_path, "-m", "hydra/launcher=local", "algo=quatro,grpo", *TINY, "train.steps=3", "report.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(tmp_path)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    assert len(trained) == 2 and all(r.info.status == "FINISHED" for r in trained)
    for r in trained:
        for key in ("train/reward_mean", "train/entropy", "train/grad_norm", "train/step_time_s"):
            assert sorted(m.step for m in client.get_metric_history(r.info.run_id, key)) == [0, 1, 2], key
        assert "eval/mean/pass_at_4" in r.data.metrics
