"""Validation along training and the compute-performance curves (issue 60), end to end: one sweep of two points
that differ only in ``train.validate_every`` (0 and 2) over 6 steps on the tiny model. The validated run logs
``val/<task>/*`` at steps 0, 2, 4 and 6 (the final policy) with the compute spent before each (the sum of the
steps' ``train/flops`` by hand); its training series equal the other run's; the report draws the curve section
(here refusing the fit: 3 points after step 0); ``python -m evaluation.recompute --curves`` gives back the logged
pass@1 of every point and the report's fit table."""
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.e2e.test_sweep import _runs, _sweep

ARGS = ["-m", "algo=grpo", "train.validate_every=0,2", "model=tiny-random", "eval=smoke", "train.steps=6",
        "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=4", "train.max_new_tokens=8",
        "data.validation_prompts=4", "eval.validation.n=4", "eval.validation.k=2"]
TIMING = ("time", "_s", "peak_", "per_s", "memory")


@pytest.fixture(scope="module")
def curves_dir(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("curves")
    proc = _sweep(cwd, *ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(cwd)
    trained = {r.data.params["train.validate_every"]: r for r in runs if r.data.tags.get("rlvr.kind") == "trained"}
    assert sorted(trained) == ["0", "2"]
    return cwd, client, trained


def test_validation_is_logged_at_0_2_4_and_the_final_step_with_the_compute_before_it(curves_dir):
    cwd, client, trained = curves_dir
    run = trained["2"]
    hist = {k: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)]
            for k in ("val/arithmetic/pass_at_1", "val/arithmetic/maj_at_2", "val/compute_flops", "train/flops")}
    assert [s for s, _ in hist["val/arithmetic/pass_at_1"]] == [0, 2, 4, 6]
    assert [s for s, _ in hist["val/arithmetic/maj_at_2"]] == [0, 2, 4, 6]
    flops = dict(hist["train/flops"])
    assert sorted(flops) == list(range(6)) and all(v > 0 for v in flops.values())
    assert dict(hist["val/compute_flops"]) == {s: sum(v for t, v in flops.items() if t < s) for s in (0, 2, 4, 6)}
    assert not any(k.startswith("val/") for k in trained["0"].data.metrics)
    run_dir = (cwd / run.data.tags["rlvr.checkpoint"]).parent  # an absolute tag stays itself under /
    assert not list((run_dir / "val_checkpoints").glob("step_*"))  # each removed once validated


def test_a_validated_run_trains_exactly_as_one_without(curves_dir):
    _, client, trained = curves_dir
    keys = sorted(k for k in trained["0"].data.metrics if k.startswith("train/") and not any(t in k for t in TIMING))
    assert "train/loss" in keys and "train/reward_mean" in keys and "train/flops" in keys
    for k in keys:
        a = [(m.step, m.value) for m in client.get_metric_history(trained["0"].info.run_id, k)]
        b = [(m.step, m.value) for m in client.get_metric_history(trained["2"].info.run_id, k)]
        assert sorted(a) == sorted(b), k


def test_the_report_draws_the_curves_and_recompute_gives_back_its_numbers(curves_dir, tmp_path):
    cwd, client, trained = curves_dir
    latest = next((cwd / "reports_out").glob("*/latest"))
    html = (latest / "report.html").read_text()
    assert "Compute-performance curves (validation along training)" in html
    assert "too few points: 3 after the first stretch" in html  # no line drawn on 3 points
    assert (latest / "figures" / "compute_curves.png").is_file()
    out = tmp_path / "re"
    proc = subprocess.run([sys.executable, "-m", "evaluation.recompute", "--curves", str(latest / "curves" / "runs.json"),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    val = pd.read_csv(out / "val_metrics.csv", index_col=[0, 1])
    logged = {m.step: m.value for m in client.get_metric_history(trained["2"].info.run_id, "val/arithmetic/pass_at_1")}
    label = val.index.get_level_values("run")[0]
    assert {int(s): v for (_, s), v in val["val/arithmetic/pass_at_1"].items()} == pytest.approx(logged)
    assert {int(s): v for (_, s), v in val["compute_flops"].items()} == {
        m.step: m.value for m in client.get_metric_history(trained["2"].info.run_id, "val/compute_flops")}
    assert label.endswith("validate_every=2")
    mine, theirs = pd.read_csv(latest / "curves" / "fits.csv"), pd.read_csv(out / "fits.csv")
    pd.testing.assert_frame_equal(mine, theirs)
