"""The README's sweep command, end to end through subprocess, read back from MLflow."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO

TINY = ["model=tiny-random", "eval=smoke", "train.steps=2", "train.prompts_per_step=2", "train.group_size=4",
        "train.minibatch_size=4", "train.max_new_tokens=8"]


def _sweep(cwd, *args, timeout=900, env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, str(REPO / "sweep.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _runs(cwd):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("rlvr")
    return client, ([] if exp is None else client.search_runs([exp.experiment_id], max_results=100))


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("sweep")
    proc = _sweep(cwd, "-m", "algo=quatro,gspo", "delta=0.01,0.1", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd


def test_sweep_records_three_trained_runs_and_one_duplicate(sweep_dir):
    client, runs = _runs(sweep_dir)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    dups = [r for r in runs if r.data.tags.get("rlvr.kind") == "duplicate"]
    assert len(trained) == 3 and all(r.info.status == "FINISHED" for r in trained)
    assert len(dups) == 1
    bases = [r for r in runs if r.data.tags.get("rlvr.kind") == "base"]
    assert len(bases) == 1 and bases[0].info.status == "FINISHED"  # the base model, evaluated once for the sweep
    dup = dups[0]
    assert dup.data.params["algo.name"] == "gspo" and dup.data.params["delta"] == "0.1"
    original = client.get_run(dup.data.tags["rlvr.duplicate_of"])
    assert original.data.params["algo.name"] == "gspo" and original.data.params["delta"] == "0.01"
    assert sorted((r.data.params["algo.name"], r.data.params["delta"]) for r in trained) == [
        ("gspo", "0.01"), ("quatro", "0.01"), ("quatro", "0.1")]


def test_every_step_metric_and_the_eval_metrics_are_logged(sweep_dir):
    client, runs = _runs(sweep_dir)
    for r in runs:
        if r.data.tags.get("rlvr.kind") != "trained":
            continue
        history = client.get_metric_history(r.info.run_id, "train/reward_mean")
        assert sorted(m.step for m in history) == [0, 1]
        for k in (1, 2, 4):
            assert f"eval/arithmetic/pass_at_{k}" in r.data.metrics
            assert f"eval/mean/pass_at_{k}" in r.data.metrics
        assert "eval/arithmetic/avg_at_4" in r.data.metrics
        # flip rates against the base run: per benchmark and pooled, the literal rule by default
        assert r.data.tags["rlvr.flip_rule"].startswith("literal")
        for key in ("eval/arithmetic/flip/very_hard/solved_from_unsolved", "eval/all/flip/very_hard/n_prompts"):
            assert key in r.data.metrics, key
        assert r.data.tags["rlvr.sampler"] == "hf"  # auto on a machine without CUDA
        # the grader audit: a share in [0, 1] per benchmark and its mean
        for key in ("eval/arithmetic/verifier_disagreement", "eval/mean/verifier_disagreement"):
            assert 0.0 <= r.data.metrics[key] <= 1.0, key
        if r.data.params["algo.name"] == "quatro":
            assert client.get_metric_history(r.info.run_id, "train/zero_variance_share")
        else:
            assert client.get_metric_history(r.info.run_id, "train/clip_fraction")


def test_samples_parquet_is_an_artifact_with_the_documented_columns(sweep_dir, tmp_path):
    import mlflow

    client, runs = _runs(sweep_dir)
    run = next(r for r in runs if r.data.tags.get("rlvr.kind") == "trained")
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples.parquet", "passk.csv", "config.yaml", "verifier.csv", "verifier_disagreements.csv"} <= names
    mlflow.set_tracking_uri(f"sqlite:///{sweep_dir}/mlflow.db")
    path = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="samples.parquet", dst_path=str(tmp_path))
    df = pd.read_parquet(path)
    for col in ("benchmark", "prompt_id", "sample_idx", "response", "n_tokens", "finish_reason", "extracted_answer",
                "correct", "mean_token_entropy", "seed"):
        assert col in df.columns
    assert len(df) == 4 * 4  # smoke: 4 prompts x n = 4
    # pass@1 logged equals the mean correctness recomputed from the artifact, and the disagreement share
    # equals the share of samples whose two verdicts differ
    assert run.data.metrics["eval/arithmetic/pass_at_1"] == pytest.approx(df["correct"].mean())
    assert df["reference_correct"].notna().all()
    assert run.data.metrics["eval/arithmetic/verifier_disagreement"] == pytest.approx(
        (df["correct"] != df["reference_correct"].astype(bool)).mean())


@pytest.fixture(scope="module")
def without_vllm(tmp_path_factory):
    """A PYTHONPATH folder whose sitecustomize hides vLLM from the child process, as if it were not installed."""
    d = tmp_path_factory.mktemp("no-vllm")
    (d / "sitecustomize.py").write_text("import sys\nsys.modules['vllm'] = None\n")
    return {"PYTHONPATH": str(d)}


def test_vllm_sampler_without_vllm_stops_before_training(tmp_path, without_vllm):
    proc = _sweep(tmp_path, "-m", "eval.sampler=vllm", *TINY, timeout=120, env=without_vllm)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "eval.sampler='vllm': vLLM is not installed" in lines[0], proc.stderr
    assert _runs(tmp_path)[1] == []


@pytest.mark.parametrize("args,fragment", [
    (["algo=nonexistent"], "algo/nonexistent"),
    (["algo=quatro,gspo", "delta=-1"], "delta=-1"),
    (["eval.n=4", "eval.ks=[1,2,4,8]"], "eval.n=4"),
    # a bad value inside a preset's sweep, and in a sweep given as hydra.sweeper.params on the command line
    (["experiment=quatro_staleness_cpu", "train.ppo_epochs=1,0"], "train.ppo_epochs=0"),
    (["hydra.sweeper.params={train.ppo_epochs:'1,0'}"], "train.ppo_epochs=0"),
    (["eval.extra_temperatures=1.5"], "expected a list"),
    (["eval.flip_k=5"], "eval.flip_k=5: larger than eval.n=4"),
    (["eval.checkpoints=all"], "set train.save_every"),
    (["eval.sampler=magic"], "eval.sampler='magic'"),
    # values that once slipped past pre-flight (the schema of orchestrator/schema.py now types every key)
    (["seed=abc"], "seed='abc': expected an integer"),
    (["eval.ucc_threshold=5"], "eval.ucc_threshold=5: out of range"),
    (["train.device=tpu"], "train.device='tpu'"),
])
def test_bad_input_stops_before_training(tmp_path, args, fragment):
    proc = _sweep(tmp_path, "-m", *args, *TINY, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    _, runs = _runs(tmp_path)
    assert runs == []
