"""The CI twin of ``experiment=cpu_study`` (issue 32): the preset's pipeline on the tiny model, two methods x two
seeds (GRPO with its checkpoint trajectory, QUATRO at delta 0.1), 2 steps, 4 prompts x 4 samples. The report's study
section is checked against ``python -m evaluation.recompute --study`` (the numbers docs/study.md quotes come from it)
and against a second computation: the pass@k, UCC@k and entropy each evaluation logged to MLflow at evaluation time
(evaluation.tables), averaged over the seeds by hand here."""
import json
import subprocess

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from tests.e2e.test_presets import _run_twins_script
from tests.prewarmed import python

TWIN = ["model=tiny-random", "study_arm=grpo,quatro_d0.1", "train.steps=2", "train.save_every=1",
        "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=8", "train.max_new_tokens=16",
        "eval.max_prompts=4", "eval.n=4", "eval.ks=[1,2,4]", "eval.flip_k=2", "eval.max_new_tokens=16",
        "train.validate_every=1", "data.validation_prompts=4", "eval.validation.n=2", "eval.validation.k=2"]


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    work = tmp_path_factory.mktemp("study")
    problems, trained = _run_twins_script().run_twin("cpu_study", work, TWIN, capture=True)
    return work / "cpu_study", problems, trained


def test_the_twin_trains_each_method_with_two_seeds_and_reports_the_study(twin):
    cwd, problems, trained = twin
    assert problems == []
    assert sorted((r.data.params["algo.name"], r.data.params["seed"]) for r in trained) == [
        ("grpo", "0"), ("grpo", "1"), ("quatro", "0"), ("quatro", "1")]
    study = cwd / "reports_out" / "cpu_study" / "latest" / "study"
    for name in ("runs.json", "comparisons.csv", "base_curves.csv", "crossings.csv", "training.csv"):
        assert (study / name).is_file(), name
    html = (cwd / "reports_out" / "cpu_study" / "latest" / "report.html").read_text()
    assert "Study: methods over seeds against the baseline and the base model" in html
    assert "Holm (4 comparisons)" in html  # QUATRO x 4 metrics against GRPO: one family (issue 60)
    # the preset validates along training: each run's validation at steps 0, 1, 2, drawn against compute
    assert "Compute-performance curves (validation along training)" in html
    curves = json.loads((cwd / "reports_out" / "cpu_study" / "latest" / "curves" / "runs.json").read_text())
    assert curves["methods"] == {"grpo": ["grpo seed=0", "grpo seed=1"], "quatro": ["quatro seed=0", "quatro seed=1"]}
    fits = pd.read_csv(cwd / "reports_out" / "cpu_study" / "latest" / "curves" / "run_fits.csv", index_col=0)
    assert sorted(fits.index) == ["grpo seed=0", "grpo seed=1", "quatro seed=0", "quatro seed=1"]  # each run alone too
    assert fits["note"].str.startswith("too few points: 2").all()  # steps 1 and 2 after step 0: no line drawn
    # the preset's paper tables (run_twin checked each is non-empty): titled, first
    assert html.index('id="paper-training_seeds"') < html.index("Study: methods over seeds")
    assert (cwd / "reports_out" / "cpu_study" / "latest" / "figures" / "study_base_crossing.png").is_file()
    paper = cwd / "reports_out" / "cpu_study" / "latest" / "paper"  # for a paper: the figure as PDF and SVG, the table in LaTeX
    assert {"study_base_crossing.pdf", "study_base_crossing.svg", "study_comparisons.tex", "study_training.pdf"} <= {
        p.name for p in paper.iterdir()}
    man = json.loads((study / "runs.json").read_text())
    assert man["methods"] == {"grpo": ["grpo seed=0", "grpo seed=1"], "quatro": ["quatro seed=0", "quatro seed=1"]}
    assert (man["baseline"], man["base"], man["ks"]) == ("grpo", "Initialization", [1, 2, 4])
    # GRPO's arm keeps and evaluates its step-1 checkpoint: a trajectory 1, 2
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    for r in trained:
        steps = sorted({m.step for m in client.get_metric_history(r.info.run_id, "eval/arithmetic/pass_at_4")})
        assert steps == ([1, 2] if r.data.params["algo.name"] == "grpo" else [2])


def test_recompute_gives_the_reports_numbers_and_they_match_the_logged_metrics(twin, tmp_path):
    cwd, problems, trained = twin
    assert problems == []
    study = cwd / "reports_out" / "cpu_study" / "latest" / "study"
    proc = subprocess.run([*python(), "-m", "evaluation.recompute", "--study", str(study / "runs.json"),
                           "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("comparisons", "base_curves", "crossings"):
        report, again = pd.read_csv(study / f"{name}.csv"), pd.read_csv(tmp_path / f"{name}.csv")
        pd.testing.assert_frame_equal(report, again)
    comp = pd.read_csv(study / "comparisons.csv", index_col=[0, 1])
    curves = pd.read_csv(study / "base_curves.csv", index_col=[0, 1])
    # a second computation: each run's metrics as its evaluation logged them, averaged over the two seeds
    logged = {}
    for r in trained:
        logged.setdefault(r.data.params["algo.name"], []).append(r.data.metrics)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("cpu_study")
    [base] = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("rlvr.kind") == "base"]

    def mean(algo, key):
        return float(np.mean([m[key] for m in logged[algo]]))

    for metric, key in (("pass@1", "eval/arithmetic/pass_at_1"), ("pass@4", "eval/arithmetic/pass_at_4"),
                        ("ucc@4", "eval/arithmetic/ucc_at_4"), ("entropy", "eval/arithmetic/entropy")):
        row = comp.loc[("quatro", metric)]
        assert row["mean"] == pytest.approx(mean("quatro", key), abs=1e-9), metric
        assert row["baseline_mean"] == pytest.approx(mean("grpo", key), abs=1e-9), metric
        assert row["diff"] == pytest.approx(mean("quatro", key) - mean("grpo", key), abs=1e-9), metric
        assert row["ci_low"] <= row["diff"] <= row["ci_high"]
    for k in (1, 2, 4):
        assert curves.loc[("grpo", k), "base"] == pytest.approx(base.data.metrics[f"eval/arithmetic/pass_at_{k}"], abs=1e-9)
        assert curves.loc[("grpo", k), "mean"] == pytest.approx(mean("grpo", f"eval/arithmetic/pass_at_{k}"), abs=1e-9)


def test_a_rebuilt_report_without_baseline_takes_the_sweeps_own(twin, tmp_path):
    """python -m reports --experiment cpu_study (no --baseline) rebuilds the same study section: report.baseline=grpo
    is read back from the runs' logged config."""
    from reports.build import build

    cwd, problems, _ = twin
    assert problems == []
    res = build("cpu_study", f"sqlite:///{cwd}/mlflow.db", out_dir=tmp_path / "again", log_to_mlflow=False)
    assert "Against <code>grpo</code>" in res["html"].read_text()
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / "study" / "comparisons.csv"),
                                  pd.read_csv(cwd / "reports_out" / "cpu_study" / "latest" / "study" / "comparisons.csv"))
