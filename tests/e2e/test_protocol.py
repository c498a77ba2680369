"""One evaluation protocol per sweep, end to end (issue 55): a sweep whose points roll out with transformers and with
vLLM evaluates both with one sampler and the base model once; a report over that sweep and one evaluated with vLLM
pairs no run across the two protocols."""
import pandas as pd
import pytest

from core.sampling import SAMPLERS
from tests.e2e.test_sweep import _runs, _sweep

pytestmark = pytest.mark.skipif(SAMPLERS["vllm"].missing() is not None,
                                reason="vLLM is not installed (scripts/install.sh installs its CPU build)")
POINT = ["algo=grpo", "model=tiny-random", "eval=smoke", "train.steps=1", "report.enabled=false"]


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("protocol")
    first = _sweep(cwd, "-m", *POINT, "train.rollout.sampler=hf,vllm")
    assert first.returncode == 0, first.stderr[-3000:]
    client, after_first = _runs(cwd)
    # the same training evaluated by vLLM: the hf point's checkpoint is reused, evaluated again; a base model of its own
    second = _sweep(cwd, "-m", *POINT, "train.rollout.sampler=hf", "eval.sampler=vllm")
    assert second.returncode == 0, second.stderr[-3000:]
    return cwd, client, after_first


def test_points_trained_with_different_rollout_samplers_are_evaluated_alike(two_sweeps):
    _, _, runs = two_sweeps
    trained = [r for r in runs if r.data.tags["rlvr.kind"] == "trained"]
    base = [r for r in runs if r.data.tags["rlvr.kind"] == "base"]
    assert sorted(r.data.tags["rlvr.rollout_sampler"] for r in trained) == ["hf", "vllm"]
    assert len(base) == 1  # one base-model evaluation for the sweep
    evaluated = trained + base
    assert {r.data.tags["rlvr.sampler"] for r in evaluated} == {"hf"}  # auto on a CPU: transformers, for every point
    assert len({r.data.tags["rlvr.eval_protocol_id"] for r in evaluated}) == 1
    assert len({r.data.tags["rlvr.env.eval_identity"] for r in evaluated}) == 1
    assert all(r.data.tags["rlvr.base_run_id"] == base[0].info.run_id for r in trained)
    assert all("eval/arithmetic/flip/very_hard/n_prompts" in r.data.metrics for r in trained)


def test_a_report_over_sweeps_of_two_protocols_pairs_nothing_across_them(two_sweeps, tmp_path):
    from reports.build import build

    cwd, client, _ = two_sweeps
    _, runs = _runs(cwd)
    sweeps = sorted({r.data.tags["rlvr.sweep_id"] for r in runs if r.data.tags.get("rlvr.kind") in ("trained", "base")})
    assert len(sweeps) == 2
    by_sampler = {}
    for r in runs:
        if r.data.tags.get("rlvr.kind") in ("trained", "base"):
            by_sampler.setdefault(r.data.tags["rlvr.sampler"], []).append(r)
    assert sorted(by_sampler) == ["hf", "vllm"] and len(by_sampler["vllm"]) == 2  # a trained run and its own base
    uri = f"sqlite:///{cwd}/mlflow.db"
    out = tmp_path / "against_base"
    build("rlvr", uri, out_dir=out, log_to_mlflow=False, sweeps=sweeps)
    diffs = pd.read_csv(out / "paper" / "baseline_differences.csv", index_col=0)
    summary = pd.read_csv(out / "paper" / "summary.csv", index_col=0)
    runs_table = pd.read_csv(out / "paper" / "runs.csv", index_col=0)
    sampler_of = dict(zip(runs_table.index, runs_table["eval sampler"]))
    for label, row in diffs.iterrows():  # each run against the base model evaluated under its own protocol
        assert sampler_of[label] == sampler_of[row["against"]], (label, row["against"])
    assert len(diffs) == 3 and len(summary) == 5  # two trained runs, their base, a third run and its own base
    # against a trained run of the other protocol: refused, named in one line
    hf_label = next(lab for lab, s in sampler_of.items() if s == "hf" and not lab.startswith("Initialization")
                    and runs_table.loc[lab, "rollout"] == "hf")
    out = tmp_path / "against_run"
    build("rlvr", uri, out_dir=out, log_to_mlflow=False, sweeps=sweeps, baseline=hf_label)
    diffs = pd.read_csv(out / "paper" / "baseline_differences.csv", index_col=0)
    assert {sampler_of[lab] for lab in diffs.index} == {"hf"}
    html = (out / "report.html").read_text()
    # the trained runs of the other protocol (a base model is a reference, never compared with a trained baseline)
    refused = [lab for lab, s in sampler_of.items() if s == "vllm" and not lab.startswith("Initialization")]
    for lab in refused:
        assert f"{lab} is not compared with {hf_label}: evaluated under another protocol (sampler: vllm vs hf" in html
