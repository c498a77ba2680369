"""Validation along training and the compute-performance curves (issues 60 and 69), end to end: one sweep of two
points that differ only in ``train.validate_every`` (0 and 2) over 6 steps on the tiny model, both keeping the
policy every 2 steps (``train.save_every=2``). The validated run validates inside its training loop: it logs
``val/<task>/*`` at steps 0, 2, 4 and 6 (the final policy), each before the next step's training metrics, with the
compute spent before each (the sum of the steps' ``train/flops`` by hand), and keeps no policy on disk for it; its
training series equal the other run's; step 2's validation equals an offline evaluation of the policy kept at step 2
under the same protocol and seeds; the report draws the curve section (here refusing the fit: 3 points after step
0); ``python -m evaluation.recompute --curves`` gives back the logged pass@1 of every point and the report's fit
table."""
import subprocess

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.e2e.test_sweep import _runs, _sweep
from tests.prewarmed import python

ARGS = ["-m", "algo=grpo", "train.validate_every=0,2", "model=tiny-random", "eval=smoke", "train.steps=6",
        "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=4", "train.max_new_tokens=8",
        "data.validation_prompts=4", "eval.validation.n=4", "eval.validation.k=2", "train.save_every=2"]
TIMING = ("time", "_s", "peak_", "per_s", "memory")


@pytest.fixture(scope="module")
def curves_dir(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("curves")
    proc = _sweep(cwd, *ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cwd / "console.txt").write_text(proc.stdout + proc.stderr)
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
    folders = sorted(p.name for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert folders == ["checkpoint", "checkpoints", "eval", "validation"]  # no policy kept for the validation
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_2", "step_4"]  # train.save_every's only
    # live: each point reached the store before the next step's training metrics (the metric queue keeps the order)
    stamp = {(m.step, k): m.timestamp for k in ("val/arithmetic/pass_at_1", "train/reward_mean")
             for m in client.get_metric_history(run.info.run_id, k)}
    for s in (0, 2, 4):
        assert stamp[(s, "val/arithmetic/pass_at_1")] <= stamp[(s, "train/reward_mean")], s
    assert run.data.tags["rlvr.val_protocol"].startswith(f"rollout:{run.data.tags['rlvr.rollout_sampler']} (")


def test_a_steps_validation_equals_an_offline_evaluation_of_its_kept_policy(curves_dir, tmp_path):
    """The policy kept at step 2 (``train.save_every``), loaded from disk into a fresh rollout sampler of the kind the
    run chose, evaluated under the validation's protocol (:func:`orchestrator.point.validation.validation_job`, the
    same seeds): the same responses, verdicts and pass@1 as the validation the loop ran at step 2."""
    import json

    import torch
    from omegaconf import OmegaConf

    from core.models import load_checkpoint
    from core.sampling import RolloutOptions, RolloutSampler, build_rollout
    from evaluation.pipeline import EvalJob, evaluate
    from orchestrator.point.validation import validation_job

    cwd, client, trained = curves_dir
    run = trained["2"]
    run_dir = (cwd / run.data.tags["rlvr.checkpoint"]).parent
    cfg = OmegaConf.load(run_dir / "config.yaml")
    task, rows, vcfg = validation_job(cfg, [1, 2])
    policy = run_dir / "checkpoints" / "step_2"
    model, tok = load_checkpoint(str(policy), "cpu", torch.float32)
    budget = json.loads((run_dir / "memory.json").read_text())["rollout_tokens"]
    rollout = build_rollout(run.data.tags["rlvr.rollout_sampler"], model, tok, str(policy),
                            RolloutOptions(dtype=run.data.tags["rlvr.rollout_dtype"], token_budget=budget))
    metrics, _ = evaluate(RolloutSampler(rollout, tok), EvalJob(vcfg, chat_template=bool(cfg.model.get("chat_template", True)), rows=rows), tmp_path)
    mine = pd.read_parquet(run_dir / "validation" / "step_2" / "samples.parquet")
    offline = pd.read_parquet(tmp_path / "samples.parquet")
    assert len(mine) == 16
    for col in ("prompt_id", "sample_idx", "response", "correct", "seed"):
        assert mine[col].tolist() == offline[col].tolist(), col
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"val/{task}/pass_at_1")}
    assert metrics[f"eval/{task}/pass_at_1"] == pytest.approx(logged[2])


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
    proc = subprocess.run([*python(), "-m", "evaluation.recompute", "--curves", str(latest / "curves" / "runs.json"),
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


def test_a_report_made_while_a_run_trains_draws_its_curve_so_far(curves_dir, tmp_path):
    """Issue 69, live: the validated run as a report made during the sweep sees it, still training (its MLflow status
    RUNNING, on a copy of the store): ``python -m reports`` draws its curve from the points logged so far (the
    ``validation.parquet`` artifact is rewritten after each) and says the run is still training."""
    import shutil

    from mlflow.tracking import MlflowClient

    cwd, _, trained = curves_dir
    shutil.copy(cwd / "mlflow.db", tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).update_run(trained["2"].info.run_id, status="RUNNING")
    proc = subprocess.run([*python(), "-m", "reports", "--experiment", "rlvr", "--tracking-uri", uri, "--out",
                           str(tmp_path / "report"), "--no-mlflow"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = next((tmp_path / "report").rglob("report.html")).read_text()
    assert "Still training, drawn up to their latest validation point" in html
    assert "Compute-performance curves (validation along training)" in html
    assert next((tmp_path / "report").rglob("compute_curves.png")).is_file()


def test_the_console_ends_each_evaluation_with_its_pass_at_1(curves_dir):
    """Issue 70: every benchmark evaluation (the base model's and each trained run's) ends with one console line giving
    its pass@1, the number its run logs; the sweep summary numbers the points only."""
    import re

    cwd, client, _ = curves_dir
    _, runs = _runs(cwd)
    logged = sorted(round(r.data.metrics["eval/arithmetic/pass_at_1"], 4) for r in runs
                    if r.data.tags.get("rlvr.kind") in ("base", "trained"))
    text = (cwd / "console.txt").read_text()
    said = re.findall(r"evaluation of \S+ done in \d+ s: arithmetic pass@1 ([0-9.]+)", text)
    assert len(logged) == 3 and sorted(float(x) for x in said) == logged
    # the summary numbers the sweep's points 0 and 1; the base model's row is none of them
    rows = [ln for ln in text.split("Sweep summary")[1].splitlines() if re.search(r"\s[0-9a-f]{32}\s", ln)]
    assert [ln.split()[0] for ln in rows if "base model (Initialization)" in ln] == ["-"]
    assert sorted(ln.split()[0] for ln in rows if "Initialization" not in ln) == ["0", "1"]
