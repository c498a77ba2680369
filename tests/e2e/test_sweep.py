"""The README's sweep command, end to end through subprocess, logged to a real MLflow tracking server over HTTP
(``mlflow server`` on 127.0.0.1) and read back over its REST API: the path the README gives cluster users. The
SQLite path is what the other sweep tests take."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import matplotlib.image as mpimg
import pandas as pd
import pytest

from tests.conftest import REPO
from tests.prewarmed import python

TINY = ["model=tiny-random", "eval=smoke", "train.steps=2", "train.prompts_per_step=2", "train.group_size=4",
        "train.minibatch_size=4", "train.max_new_tokens=8"]


def _sweep(cwd, *args, timeout=900, env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **(env or {}))
    return subprocess.run([*python(), str(REPO / "sweep.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _runs(cwd, uri=None):
    """The experiment's runs but the sweeps' parent runs (tested on their own below)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri or f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("rlvr")
    runs = [] if exp is None else client.search_runs([exp.experiment_id], max_results=100)
    return client, [r for r in runs if r.data.tags.get("rlvr.kind") != "sweep"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on a free port of 127.0.0.1 (SQLite behind it, proxied artifacts), job execution off, as
    the README starts it; stopped after the module."""
    d = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{d}/mlflow.db",
         "--artifacts-destination", str(d / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=d, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(uri + "/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail("mlflow server exited: " + (d / "server.log").read_text()[-2000:])
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not answer /health in 120 s: " + (d / "server.log").read_text()[-2000:])
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _rest(uri, endpoint, body=None):
    """One call of MLflow's REST API (GET with query parameters in ``endpoint``, or POST with a JSON body)."""
    req = urllib.request.Request(uri + endpoint, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


SERVER_ARGS = ["tracking.artifact_root=mlflow-artifacts:/", "tracking.system_metrics_interval_s=1"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, server):
    cwd = tmp_path_factory.mktemp("sweep")
    proc = _sweep(cwd, "-m", "algo=quatro,gspo", "delta=0.01,0.1", *TINY, f"tracking.uri={server}", *SERVER_ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cwd / "server_uri").write_text(server)
    (cwd / "sweep_stdout.txt").write_text(proc.stdout)
    (cwd / "sweep_stderr.txt").write_text(proc.stderr)
    return cwd


def _served(sweep_dir):
    return _runs(sweep_dir, (sweep_dir / "server_uri").read_text())


def test_sweep_records_three_trained_runs_and_one_duplicate(sweep_dir):
    client, runs = _served(sweep_dir)
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
    client, runs = _served(sweep_dir)
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
        # auto on a machine without CUDA: transformers, unless the run's vLLM rollouts left the engine holding the
        # final policy (then it samples there, nothing to start)
        assert r.data.tags["rlvr.sampler"] == ("vllm" if r.data.tags["rlvr.rollout_sampler"] == "vllm" else "hf")
        # the grader audit: a share in [0, 1] per benchmark and its mean
        for key in ("eval/arithmetic/verifier_disagreement", "eval/mean/verifier_disagreement"):
            assert 0.0 <= r.data.metrics[key] <= 1.0, key
        if r.data.params["algo.name"] == "quatro":
            assert client.get_metric_history(r.info.run_id, "train/zero_variance_share")
        else:
            assert client.get_metric_history(r.info.run_id, "train/clip_fraction")


def test_samples_parquet_is_an_artifact_with_the_documented_columns(sweep_dir, tmp_path):
    import mlflow

    client, runs = _served(sweep_dir)
    run = next(r for r in runs if r.data.tags.get("rlvr.kind") == "trained")
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples.parquet", "passk.csv", "config.yaml", "verifier.csv", "verifier_disagreements.csv",
            "protocol.json"} <= names
    mlflow.set_tracking_uri((sweep_dir / "server_uri").read_text())
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
    # the answer form's verdict on every sample (issue 55): the format-miss share logged is the share recomputed here
    assert set(df["answer_status"]) <= {"stated", "missing", "restated", "not_a_value"}
    assert run.data.metrics["eval/arithmetic/format_miss"] == pytest.approx((df["answer_status"] == "missing").mean())


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
    # checkpoint selection (orchestrator.point.run_evaluation.select_on_validation)
    (["eval.select_on=validation", "train.save_every=1"], "eval.select_on=validation: no validation split"),
    (["eval.select_on=validation", "data.validation_prompts=4"], "eval.select_on=validation: only the final"),
    (["train.keep_top_k=2"], "train.keep_top_k=2: checkpoints are ranked on the validation split"),
    (["eval.select_on=validation", "data.validation_prompts=4", "train.save_every=1", "eval.validation.k=8"],
     "eval.validation.k=8: larger than eval.validation.n=4"),
    # validation along training (issue 60): a split to validate on (both engines validate inside their loop: issue 69)
    (["train.validate_every=2"], "train.validate_every=2: no validation split"),
    (["train.validate_every=-1"], "train.validate_every=-1"),
    (["eval.sampler=magic"], "eval.sampler='magic'"),
    # values that once slipped past pre-flight (the schema of orchestrator/checks/schema.py now types every key)
    (["seed=abc"], "seed='abc': expected an integer"),
    (["eval.ucc_threshold=5"], "eval.ucc_threshold=5: out of range"),
    (["train.device=tpu"], "train.device='tpu'"),
    # against the model (the tiny model holds 2,048 tokens) and settings under which the policy cannot change
    (["train.max_new_tokens=2048"], "train.max_new_tokens=2048: the model tiny-random holds 2048 tokens of context"),
    (["+eval.decoding.arithmetic.max_new_tokens=4000"], "eval.decoding.arithmetic.max_new_tokens=4000: the model"),
    (["eval.vllm.max_model_len=4096"], "eval.vllm.max_model_len=4096: the model tiny-random holds 2048"),
    (["engine=verl", "engine.device=cpu", "engine.max_prompt_length=2000", "train.max_new_tokens=64"],
     "engine.max_prompt_length=2000: with train.max_new_tokens=64 that is 2064 tokens, and the model tiny-random holds"),
    (["algo=grpo,exppo", "train.group_size=1"], "train.group_size=1: grpo's advantages are all 0"),
])
def test_bad_input_stops_before_training(tmp_path, monkeypatch, capsys, args, fragment):
    """sweep.py's first step (orchestrator.checks.preflight.check_command_line) in-process, one case per bad value; the
    command itself is run with one of them below."""
    from orchestrator.checks.preflight import check_command_line

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        check_command_line(["-m", *TINY, *args])  # the case's values last: they replace TINY's
    assert exit_.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "mlflow.db").exists()  # stopped before the store was touched


@pytest.mark.parametrize("case,fragment", [
    ("empty_benchmark", "eval.benchmarks: ['math500'] has no rows"),
    ("empty_training_file", "data=math: its training prompts cannot be read: data: no MATH training rows left from"),
    ("training_file_missing", "none.jsonl': data.source=local needs an existing JSONL file"),
    ("hub_data_offline", "the hub is offline (HF_HUB_OFFLINE) and it is not in the local cache: download it first, "
                         "or set data.source=local data.path=FILE"),
    ("model_folder_missing", "model.path='/nonexistent/model': no such folder"),
    ("hub_model_offline", "model.path='no-such-org/no-such-model': not in the local cache and the hub is offline"),
    ("minibatch_over_batch", "train.minibatch_size=16: larger than the batch (train.prompts_per_step=2 x "
                             "train.group_size=4 = 8 responses)"),
])
def test_inputs_are_read_before_any_work(tmp_path, monkeypatch, capsys, case, fragment):
    """Issue 46: an empty benchmark file passed pre-flight and failed after a step had trained ("cannot convert float
    NaN to integer"); an empty training file, a missing model folder and, offline, a hub dataset or model that is not
    cached started the sweep and left FAILED runs. Each now stops pre-flight with one line, exit 2, before the store
    is touched."""
    from orchestrator.checks.preflight import check_command_line

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench" / "math500").mkdir(parents=True)
    (tmp_path / "bench" / "math500" / "test.jsonl").write_text("")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "one" / "math500").mkdir(parents=True)
    (tmp_path / "one" / "math500" / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n')
    math = ["data=math", "eval.benchmarks=[math500]", f"eval.data_dir={tmp_path / 'one'}"]
    args = {"empty_benchmark": ["eval.benchmarks=[math500]", f"eval.data_dir={tmp_path / 'bench'}"],
            "empty_training_file": [*math, "data.source=local", f"data.path={tmp_path / 'empty.jsonl'}"],
            "training_file_missing": [*math, "data.source=local", f"data.path={tmp_path / 'none.jsonl'}"],
            "hub_data_offline": math,
            "model_folder_missing": ["model=qwen2.5-math-1.5b", "model.path=/nonexistent/model", "train.memory_check=false"],
            "hub_model_offline": ["model=qwen2.5-math-1.5b", "model.path=no-such-org/no-such-model",
                                  "train.memory_check=false"],
            "minibatch_over_batch": ["train.minibatch_size=16"]}[case]
    with pytest.raises(SystemExit) as exit_:
        check_command_line(["-m", *TINY, *args])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "mlflow.db").exists()


def test_bad_input_on_the_command_line_exits_2_with_one_line(tmp_path):
    proc = _sweep(tmp_path, "-m", "algo=quatro,gspo", "delta=-1", *TINY, timeout=120)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "delta=-1" in lines[0], proc.stderr
    _, runs = _runs(tmp_path)
    assert runs == []


def test_an_unknown_report_section_stops_the_sweep_before_any_work(tmp_path):
    """report.sections names registered paper tables: a typo is refused at pre-flight (exit 2, one line naming it
    and the known names), not discovered in the report after the sweep has run."""
    proc = _sweep(tmp_path, "-m", *TINY, "report.sections=[quatro_passk,quatro_pask]", timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "report.sections: ['quatro_pask'] is not a paper section" in lines[0] and "quatro_passk" in lines[0]
    assert _runs(tmp_path)[1] == []


def _section(html: str, heading_id: str) -> str:
    """The report's section whose heading's id starts with ``heading_id``, up to the next section's heading (sections
    with nothing to show are folded into one line at the end, so the next heading depends on the sweep)."""
    start = html.index(f'id="{heading_id}')
    end = html.find("<h2", start)
    return html[start:end if end > 0 else None]


def _assert_clean_notebook(path):
    import nbformat

    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert not [o for o in outputs if o.output_type == "stream" and o.name == "stderr"], "stderr noise in the report"


def test_sweep_ends_with_an_executed_report_whose_passk_table_matches_mlflow(sweep_dir):
    html_path = sweep_dir / "reports_out" / "rlvr" / "latest" / "report.html"
    assert html_path.exists(), "the Hydra callback did not build the report"
    html = html_path.read_text()
    _assert_clean_notebook(html_path.with_suffix(".ipynb"))
    err = (sweep_dir / "sweep_stderr.txt").read_text()  # issue 46: the report's kernel left noise at the sweep's end
    assert "Could not destroy zmq context" not in err and "Parent appears to have exited" not in err
    assert "<td>NaN</td>" not in html and "<td>None</td>" not in html and "<td>nan</td>" not in html  # issue 46
    client, runs = _served(sweep_dir)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    # the pass@k section: every logged pass@k value of every run appears, to 4 decimals, after that heading
    section = _section(html, "pass@k")
    for run in trained:
        for key, value in run.data.metrics.items():
            if re.match(r"eval/(arithmetic|mean)/pass_at_\d+$", key):
                assert f"{value:.4f}" in section, key
    reports = [r for r in runs if r.data.tags.get("rlvr.kind") == "report"]
    assert len(reports) == 1
    artifacts = {a.path for a in client.list_artifacts(reports[0].info.run_id)}
    assert {"report.html", "report.ipynb"} <= artifacts
    figures = [a.path for a in client.list_artifacts(reports[0].info.run_id, "figures")]
    assert {"figures/training_curves.png", "figures/passk_curves.png", "figures/flip_rates.png",
            "figures/quatro_advantage.png"} <= set(figures)
    # the base model's row opens the pass@k tables, with its logged values; flip rates name their rule
    base = next(r for r in runs if r.data.tags.get("rlvr.kind") == "base")
    assert "Initialization" in section and f"{base.data.metrics['eval/mean/pass_at_1']:.4f}" in section
    flips = _section(html, "Flip-rates-against-the-base-model")
    assert "literal: unsolved = no correct sample among all n" in flips
    # with no --baseline, the paired differences are against the base model
    diffs = _section(html, "Differences-against-the-baseline")
    assert "minus baseline <code>Initialization</code>" in diffs
    # ExPPO's Shared-set disagreement against the base model, and qualitative examples naming every run
    modes = _section(html, "Answer-modes")
    assert "Delta-D against <code>Initialization</code>" in modes or "The Shared set is empty" in modes
    examples = _section(html, "Qualitative-examples") if 'id="Qualitative-examples' in html else html[html.index(
        'class="rlvr-empty"'):]
    assert "<table" in examples or "No run has a correct sample" in examples
    # the grader audit's table: every run's logged disagreement share, to 4 decimals
    grader = _section(html, "Grader-check")
    for run in trained + [base]:
        assert f"{run.data.metrics['eval/arithmetic/verifier_disagreement']:.4f}" in grader
    assert "verifier_disagreement" in grader
    for png in (sweep_dir / "reports_out" / "rlvr" / "latest" / "figures").glob("*.png"):
        img = mpimg.imread(png)
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0  # a real, non-blank picture


def _search(uri, exp_id):
    return _rest(uri, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id], "max_results": 200}).get("runs", [])


def _tags(run):
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def test_over_http_the_sweep_is_one_parent_with_datasets_system_metrics_and_downloadable_artifacts(sweep_dir):
    """Read back over MLflow's REST API, as the UI does: the experiment opens on the training view; one parent run
    per sweep with every point, the duplicate record, the base-model run and the report run beneath it; each run
    shows its datasets; trained runs carry system metrics and a description; artifacts download over HTTP."""
    from core.tasks import load_prompts
    from orchestrator.checks.preflight import sweep_points

    uri = (sweep_dir / "server_uri").read_text()
    exp = _rest(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=rlvr")["experiment"]
    assert {t["key"]: t["value"] for t in exp.get("tags", [])}["mlflow.experimentKind"] == "custom_model_development"
    runs = _search(uri, exp["experiment_id"])
    kinds = [_tags(r).get("rlvr.kind") for r in runs]
    assert sorted(kinds) == ["base", "duplicate", "report", "sweep", "trained", "trained", "trained"]
    [parent] = [r for r in runs if _tags(r)["rlvr.kind"] == "sweep"]
    ptags = _tags(parent)
    assert parent["info"]["status"] == "FINISHED" and "algo=quatro,gspo" in ptags["rlvr.command"]
    assert ptags["rlvr.git_commit"] and "| point | status |" in ptags["mlflow.note.content"]
    for r in runs:
        if r is not parent:
            assert _tags(r)["mlflow.parentRunId"] == parent["info"]["run_id"], _tags(r)["rlvr.kind"]

    [(_, cfg)] = sweep_points(TINY)
    n_train = len(load_prompts(cfg.data, "train"))
    for r in runs:
        kind = _tags(r)["rlvr.kind"]
        if kind == "report":
            continue
        inputs = {(d["dataset"]["name"], {t["key"]: t["value"] for t in d.get("tags", [])}["mlflow.data.context"]):
                  json.loads(d["dataset"]["profile"])["num_rows"] for d in r.get("inputs", {}).get("dataset_inputs", [])}
        want = {("arithmetic", "evaluation"): 4}  # eval=smoke: 4 held-out prompts
        if kind != "base":  # the parent: the union of its children's
            want[("arithmetic/train", "training")] = n_train
        assert inputs == want, (kind, inputs)
        if kind in ("trained", "base"):
            metrics = {m["key"] for m in r["data"].get("metrics", [])}
            assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= metrics, kind
        if kind == "trained":
            note = _tags(r)["mlflow.note.content"]
            algo = _tags(r)["rlvr.algo"]
            assert f"**{algo}**" in note and "Swept values: `algo=" in note and "pass@1" in note and "report.html" in note

    trained = next(r for r in runs if _tags(r)["rlvr.kind"] == "trained")
    with urllib.request.urlopen(f"{uri}/get-artifact?path=samples.parquet&run_uuid={trained['info']['run_id']}") as f:
        import io

        assert len(pd.read_parquet(io.BytesIO(f.read()))) == 4 * 4
    with urllib.request.urlopen(f"{uri}/get-artifact?path=summary.csv&run_uuid={parent['info']['run_id']}") as f:
        summary = pd.read_csv(f)
    assert sorted(summary["status"]) == ["DUPLICATE", "FINISHED", "FINISHED", "FINISHED", "FINISHED"]
    by_run = {r["info"]["run_id"]: {m["key"]: m["value"] for m in r["data"].get("metrics", [])} for r in runs}
    for _, row in summary[summary["status"] == "FINISHED"].iterrows():
        assert row["eval/mean/pass_at_1"] == pytest.approx(by_run[row["run_id"]]["eval/mean/pass_at_1"])
    with urllib.request.urlopen(f"{uri}/get-artifact?path=report.html&run_uuid={parent['info']['run_id']}") as f:
        assert b"RLVR sweep report" in f.read()


#: the report's result tables (not the run table, whose status, ids and wall times say which run made the numbers)
RESULT_TABLES = ("summary", "passk_arithmetic", "baseline_differences", "flip_rates", "verifier", "entropy", "ucc",
                 "modes", "training_summary")


def _report_folder(sweep_dir, sweep_id):
    return sweep_dir / "reports_out" / "rlvr" / Path(sweep_id).name


def test_a_rerun_is_a_new_parent_whose_children_are_the_duplicate_records(sweep_dir):
    """A plain re-run: every point recorded as a duplicate of the first sweep's runs, and its report shows them whole:
    the same result tables as the first sweep's report, no note of failures, and ``latest`` moved to it."""
    uri = (sweep_dir / "server_uri").read_text()
    proc = _sweep(sweep_dir, "-m", "algo=quatro,gspo", "delta=0.01,0.1", *TINY, f"tracking.uri={uri}", *SERVER_ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exp = _rest(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=rlvr")["experiment"]
    runs = _search(uri, exp["experiment_id"])
    parents = sorted((r for r in runs if _tags(r)["rlvr.kind"] == "sweep"), key=lambda r: int(r["info"]["start_time"]))
    assert len(parents) == 2 and all(p["info"]["status"] == "FINISHED" for p in parents)
    children = [r for r in runs if _tags(r).get("mlflow.parentRunId") == parents[1]["info"]["run_id"]]
    assert sorted(_tags(r)["rlvr.kind"] for r in children) == ["duplicate"] * 4 + ["report"]
    ids = {p["info"]["run_id"] for p in parents}
    assert all(_tags(r).get("mlflow.parentRunId") in ids for r in runs if r not in parents)  # no run is orphaned
    first, again = (_report_folder(sweep_dir, _tags(p)["rlvr.sweep_id"]) for p in parents)
    for name in RESULT_TABLES:
        a, b = (pd.read_csv(f / "paper" / f"{name}.csv", index_col=0) for f in (first, again))
        pd.testing.assert_frame_equal(a, b, obj=name)
    html = (again / "report.html").read_text()
    assert "No run of this experiment finished" not in html and "for the failures" not in html
    assert (sweep_dir / "reports_out" / "rlvr" / "latest").resolve() == again.resolve()
    status = pd.read_csv(again / "paper" / "runs.csv", index_col=0)["status"]
    # each point names the run whose numbers it shows, and a run is one row (issue 70): the four points show three
    # runs, as gspo's two deltas are one run (delta is QUATRO's alone)
    assert sum(s.startswith("reuses ") for s in status) == 3 and len(status) == 4  # and the base model's row


PROBE = """<script>
window.__rlvrErrors = [];
window.addEventListener('error', function (e) {
  window.__rlvrErrors.push(e.message || ('failed to load ' + ((e.target && (e.target.src || e.target.href)) || '?')));
}, true);
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var out = document.createElement('pre'); out.id = 'rlvr-browser-check';
  out.textContent = JSON.stringify({images: imgs.length, errors: window.__rlvrErrors, title: document.title,
    paper: Array.prototype.map.call(document.querySelectorAll('.paper-table'), function (d) {
      return [d.getAttribute('data-section'), d.querySelectorAll('td').length, d.getBoundingClientRect().height > 0]; }),
    shown: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0 && i.getBoundingClientRect().width > 0; }).length,
    alt: imgs.filter(function (i) { return (i.getAttribute('alt') || '').trim().length > 0; }).length,
    viewport: [window.innerWidth, window.innerHeight],
    summary: (function (s) { if (!s) return null; var r = s.getBoundingClientRect();
      return [r.top + window.scrollY, r.bottom + window.scrollY, s.querySelectorAll('tbody tr').length]; })(
      document.getElementById('rlvr-summary')),
    wide: Array.prototype.filter.call(document.querySelectorAll('.rlvr-table, .rlvr-table table'), function (d) {
      return d.scrollWidth > d.clientWidth; }).map(function (d) { return getComputedStyle(d).overflowX; })});
  document.body.appendChild(out);
});
</script>"""


def render_in_browser(report: Path, tmp_path: Path, screenshot: str) -> dict:
    """Open ``report`` (a report.html) offline in headless Chromium (Debian's ``chromium``, installed by .ci/run;
    the test is skipped without it): returns what the page saw once loaded (``errors``: script and resource errors;
    ``images``/``shown``/``alt``: <img> elements, those decoded and laid out, those with alt text; ``paper``: [section, cells, visible] per paper
    table; ``title``; at a 1280x800 window, ``viewport``, ``summary``: [top, bottom, rows] of the summary table in page
    pixels; ``wide``: the overflow style of each table (or its box) whose content is wider than it), and keeps a full-width screenshot as ``screenshot`` in test-artifacts/ (or
    $RLVR_TEST_ARTIFACTS)."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    html = report.read_text(encoding="utf-8")
    assert not re.findall(r'<script[^>]*src="https?:', html)  # nothing fetched from a CDN
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}"]
    proc = subprocess.run([browser, *flags, "--window-size=1280,800", "--dump-dom", "--virtual-time-budget=10000",
                           probe.as_uri()],
                          capture_output=True, text=True, timeout=180)
    m = re.search(r'<pre id="rlvr-browser-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, proc.stderr[-2000:]
    out = Path(os.environ.get("RLVR_TEST_ARTIFACTS", REPO / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    shot = out / screenshot
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=1280,3000", "--hide-scrollbars",
                    report.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.is_file() and shot.stat().st_size > 10_000
    return json.loads(m.group(1))


def test_the_report_renders_in_a_real_browser_with_every_figure_shown(sweep_dir, tmp_path):
    """Headless Chromium opens report.html offline: no script or resource error, every <img> decoded and laid out,
    as many images as the report's figures folder holds. A screenshot is kept in test-artifacts/report.png."""
    report = sweep_dir / "reports_out" / "rlvr" / "latest" / "report.html"
    check = render_in_browser(report, tmp_path, "report.png")
    figures = sorted((report.parent / "figures").glob("*.png"))
    assert check["errors"] == [] and check["title"] == "RLVR sweep report: rlvr"
    assert check["images"] == len(figures) >= 3 and check["shown"] == check["images"], check
    assert check["alt"] == check["images"], check  # issue 46: every figure has alt text (what it shows)
    # issue 55: the first screen of a 1280x800 window (its page area: 1280 x 657 in headless Chromium) holds the
    # summary table, every run a row; a wide table scrolls, never cut
    width, height = check["viewport"]
    assert width == 1280 and 600 < height <= 800 and check["summary"] is not None, check
    top, bottom, rows = check["summary"]
    # the base model and the three trained runs (the reused point is GSPO at delta 0.01's run: one row, issue 70)
    assert 0 < top < bottom <= height and rows == 4, check
    assert check["wide"] and set(check["wide"]) <= {"auto", "scroll"}, check  # the run table is wider than the page


def test_mlflow_ui_opens_the_sweep_on_its_runs_table(sweep_dir, tmp_path):
    """MLflow's own UI (served by the test's tracking server), rendered in headless Chromium at the link the sweep
    prints: the runs table (not the GenAI overview), the sweep's parent row, its datasets. A screenshot is kept in
    test-artifacts/ (or $RLVR_TEST_ARTIFACTS)."""
    import shutil

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    uri = (sweep_dir / "server_uri").read_text()
    exp = _rest(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=rlvr")["experiment"]
    url = f"{uri}/#/experiments/{exp['experiment_id']}/runs?workflowType=machine_learning"
    assert f"MLflow: {url}" in (sweep_dir / "sweep_stdout.txt").read_text()  # the sweep says where to look
    parent = min((r for r in _search(uri, exp["experiment_id"]) if _tags(r)["rlvr.kind"] == "sweep"),
                 key=lambda r: int(r["info"]["start_time"]))  # the fixture's sweep (the re-run test may add one)
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1600,1000",
                           "--virtual-time-budget=30000", "--dump-dom", url], capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    assert parent["info"]["run_name"] in dom, dom[-2000:]  # one parent row per sweep (its points nested beneath)
    assert "arithmetic/train" in dom and "matching runs" in dom and "Detect Issues" not in dom
    # the screenshot docs/img/mlflow_runs.png is taken from (as docs/img/report.png from the report test's)
    out = Path(os.environ.get("RLVR_TEST_ARTIFACTS", REPO / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "mlflow_runs.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1600,900", "--hide-scrollbars",
                    "--virtual-time-budget=30000", f"--screenshot={shot}", url], capture_output=True, text=True, timeout=180)
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_every_run_records_what_decides_its_numbers(sweep_dir):
    """Provenance (orchestrator/point/provenance.py) on every trained and base run, read back over the server, against
    what this test process finds itself: the installed distributions' versions, torch's CUDA build, git's commit."""
    import importlib.metadata
    import platform

    import torch

    from orchestrator.point.identity import git_commit

    _, runs = _served(sweep_dir)
    recorded = [r for r in runs if r.data.tags.get("rlvr.kind") in ("trained", "base")]
    assert len(recorded) == 4
    expected = {"python": platform.python_version(), "torch": torch.__version__,
                "math_verify": importlib.metadata.version("math-verify"), "hydra": importlib.metadata.version("hydra-core"),
                "mlflow": importlib.metadata.version("mlflow"), "cuda": torch.version.cuda or "none",
                "gpu_count": str(torch.cuda.device_count()), "git_commit": git_commit()}
    for r in recorded:
        env = {k.removeprefix("rlvr.env."): v for k, v in r.data.tags.items() if k.startswith("rlvr.env.")}
        assert {k: env.get(k) for k in expected} == expected
        assert env["vllm"] != "" and env["cpu"] and env["git_dirty"] in ("true", "false")
        assert env["bf16_units"].startswith("no (") and "no bf16 units" in env["bf16_units"]  # tests/conftest.py
    # one protocol for the whole sweep (the evaluation identity), the base model's included
    assert len({r.data.tags["rlvr.env.eval_identity"] for r in recorded}) == 1


def test_the_report_warns_when_compared_runs_differ_in_versions():
    from orchestrator.point.provenance import changes
    from reports.data import provenance_warnings

    tags = {"rlvr.env.vllm": "0.24.0", "rlvr.env.torch": "2.11.0"}
    runs = pd.DataFrame({"label": ["a", "b", "c", "d"], "kind": ["trained", "base", "trained", "duplicate"],
                         "status": ["FINISHED"] * 4,
                         "tags": [tags, tags | {"rlvr.env.vllm": "0.8.5"}, {}, tags | {"rlvr.env.vllm": "0.9"}]})
    [line] = provenance_warnings(runs)
    assert "differ in vllm: 0.24.0 (a); 0.8.5 (b)" in line  # c logged none, d is a duplicate record: not compared
    assert provenance_warnings(runs.iloc[:1]) == []
    # a run resumed on another machine: the change is recorded on the run, and the report says so
    moved = changes(tags, tags | {"rlvr.env.torch": "2.12.0"})
    assert moved == {"rlvr.env_changed": "torch: 2.11.0 -> 2.12.0"} and changes(tags, tags) == {}
    runs.at[0, "tags"] = tags | moved
    assert any("Run a changed environment while it ran: torch: 2.11.0 -> 2.12.0" in x for x in provenance_warnings(runs))


def test_reproduce_reruns_a_finished_run_bitwise_on_the_cpu(sweep_dir):
    """``python -m orchestrator.reproduce RUN_ID`` on one of the sweep's runs: a new run from its logged config, and
    every training metric, step by step, and every pass@k identical to the original's, compared here through MLflow
    independently of the command's own comparison. Last in the module: it adds a run to the store."""
    uri = (sweep_dir / "server_uri").read_text()
    client, runs = _served(sweep_dir)
    [original] = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"
                  and (r.data.params["algo.name"], r.data.params["delta"]) == ("quatro", "0.1")]
    run_id = original.info.run_id
    proc = subprocess.run([*python(), "-m", "orchestrator.reproduce", run_id, "--tracking-uri", uri, "--strict"],
                          cwd=sweep_dir, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    new_id = re.search(r"re-run of \w+: run (\w+)", proc.stdout).group(1)
    # issue 56: it speaks while it works (the training's and evaluation's progress lines), and its run is where it
    # says: outputs/reproduce/<id>-<time>/run, the final checkpoint in it, the libraries' output in reproduce.log
    assert "train quatro: step 1/" in proc.stdout and "eval sampling" in proc.stdout, proc.stdout[-2000:]
    [folder] = (sweep_dir / "outputs" / "reproduce").glob(f"{run_id[:8]}-*")
    assert str(folder.resolve()) in proc.stdout and (folder / "run" / "checkpoint" / "config.json").is_file()
    assert (folder / "reproduce.log").is_file() and "Attempted to load weight" not in proc.stdout + proc.stderr
    again = client.get_run(new_id)
    assert again.data.tags["rlvr.reproduces"] == run_id and again.info.status == "FINISHED" and new_id != run_id
    keys = [k for k in original.data.metrics if k.startswith("train/") or "pass_at" in k]
    assert any(k.startswith("train/") for k in keys) and any("pass_at" in k for k in keys)
    for key in keys:
        if any(t in key for t in ("time", "_s", "_ms", "per_s", "memory")):  # the machine's speed, not the results
            continue
        a = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        b = sorted((m.step, m.value) for m in client.get_metric_history(new_id, key))
        assert a == b, key
    from reports.load import load_runs  # a reproduction is a check, not a second copy of its point in the report

    shown = set(load_runs(uri, "rlvr")["run_id"])
    assert run_id in shown and new_id not in shown
    # bad input: one line, exit 2, before any work
    bad = subprocess.run([*python(), "-m", "orchestrator.reproduce", "0" * 32, "--tracking-uri", uri],
                         cwd=sweep_dir, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "RUN_ID=" + "0" * 32 in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_report_baseline_that_names_no_run_of_the_sweep_stops_it_before_training(tmp_path, monkeypatch, capsys):
    """Issue 46: ``report.baseline`` with a typo trained the whole sweep and then said "no samples.parquet among the
    finished runs". The names it may take are those the report shows: the base model's row, an algorithm of the
    sweep, or a run label (the algorithm and the swept values that tell its runs apart)."""
    from orchestrator.checks.preflight import check_command_line
    from reports.callback import check_report_baseline

    monkeypatch.chdir(tmp_path)
    sweep = ["-m", *TINY, "algo=quatro,grpo", "delta=0.01,0.1"]
    for good in ("grpo", "Initialization", "quatro delta=0.1"):
        assert check_command_line([*sweep, f"report.baseline='{good}'"], sweep_checks=(check_report_baseline,)) == 4
    capsys.readouterr()
    # a preset's baseline in a sweep narrowed to other algorithms (exppo_decoding_seeds_cpu's twin runs exppo alone
    # under the preset's report.baseline=grpo): a warning, and the report compares against the base model
    narrowed = ["-m", "experiment=exppo_decoding_seeds_cpu", "algo=exppo", "model=tiny-random"]
    assert check_command_line(narrowed, sweep_checks=(check_report_baseline,)) == 3  # the preset's three decoding seeds
    assert "WARNING: report.baseline='grpo': this sweep runs no grpo" in capsys.readouterr().err
    # the same typed on the command line (issue 70): refused, one line, exit 2
    with pytest.raises(SystemExit) as exit_:
        check_command_line([*sweep, "report.baseline=dapo"], sweep_checks=(check_report_baseline,))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: report.baseline='dapo': this sweep runs no dapo (its names: Initialization, quatro")
    with pytest.raises(SystemExit) as exit_:
        check_command_line([*sweep, "report.baseline=gpro"], sweep_checks=(check_report_baseline,))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert "report.baseline='gpro': not a run of this sweep (its names: Initialization, quatro, grpo, " in lines[0]


def test_the_slurm_launcher_without_slurm_is_one_line(tmp_path, monkeypatch, capsys):
    """Issue 46: ``hydra/launcher=slurm`` on a machine without SLURM was a 26-line traceback from submitit. A PATH
    without the SLURM client stands for such a machine (CI's own cluster is on the real PATH)."""
    from orchestrator.checks.preflight import check_command_line

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable))
    with pytest.raises(SystemExit) as exit_:
        check_command_line(["-m", *TINY, "hydra/launcher=slurm"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert "hydra/launcher=slurm: sbatch and sinfo not found on this machine" in lines[0]


@pytest.mark.parametrize("uri,fragment", [
    ("mysql://u@127.0.0.1:1/db", "its database driver is not installed (MySQLdb;"),
    ("postgresql+psycopg://u@127.0.0.1:1/db", "the database does not answer (connection failed:"),
    ("mlruns", "a folder store, which this MLflow refuses"),
    ("databricks", "no Databricks credentials here"),
])
def test_a_tracking_uri_that_cannot_be_used_is_one_line_before_any_work(tmp_path, monkeypatch, capsys, uri, fragment):
    """Issue 46: these URIs passed pre-flight and the sweep failed later (a missing driver's traceback in the report,
    MLflow's retries for minutes against a database that is not there, its refusal of the folder store). Pre-flight
    now opens the store's connection once, checks the driver, the credentials and the folder store's status."""
    from orchestrator.checks.preflight import check_command_line

    monkeypatch.chdir(tmp_path)
    for k in ("DATABRICKS_HOST", "DATABRICKS_TOKEN", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.databrickscfg
    t0 = time.time()
    with pytest.raises(SystemExit) as exit_:
        check_command_line(["-m", *TINY, f"tracking.uri={uri}"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and f"tracking.uri={uri!r}: {fragment}" in lines[0], lines
    assert time.time() - t0 < 30 and not (tmp_path / "multirun").exists()


def test_a_sweep_extended_by_a_point_reports_the_reused_points_beside_the_new_one(sweep_dir, monkeypatch):
    """The fixture's sweep extended by GRPO: only GRPO trains; its report's pass@k table has the reused points' rows
    with the numbers of the first sweep's report beside GRPO's own. Rebuilding the first sweep's report afterwards
    leaves ``latest`` on the newest sweep's. Last in the module with the reproduce test: it adds runs to the store."""
    from reports.build import build

    uri = (sweep_dir / "server_uri").read_text()
    proc = _sweep(sweep_dir, "-m", "algo=quatro,gspo,grpo", "delta=0.01,0.1", *TINY, f"tracking.uri={uri}", *SERVER_ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exp = _rest(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=rlvr")["experiment"]
    runs = _search(uri, exp["experiment_id"])
    parents = sorted((r for r in runs if _tags(r)["rlvr.kind"] == "sweep"), key=lambda r: int(r["info"]["start_time"]))
    children = [r for r in runs if _tags(r).get("mlflow.parentRunId") == parents[-1]["info"]["run_id"]]
    assert sorted(_tags(r)["rlvr.algo"] for r in children if _tags(r)["rlvr.kind"] == "trained") == ["grpo"]
    first, extended = (_report_folder(sweep_dir, _tags(p)["rlvr.sweep_id"]) for p in (parents[0], parents[-1]))
    old = pd.read_csv(first / "paper" / "passk_arithmetic.csv", index_col=0)
    new = pd.read_csv(extended / "paper" / "passk_arithmetic.csv", index_col=0)
    # GRPO's two deltas are one run (delta is QUATRO's alone): one row (issue 70), named by the algorithm
    assert len(new) == len(old) + 1 and "grpo" in new.index, list(new.index)
    pd.testing.assert_frame_equal(new.loc[old.index], old)  # the reused points' numbers, as the first report has them
    monkeypatch.chdir(sweep_dir)
    build("rlvr", uri, sweeps=[_tags(parents[0])["rlvr.sweep_id"]], log_to_mlflow=False)  # an older sweep's report
    assert (sweep_dir / "reports_out" / "rlvr" / "latest").resolve() == extended.resolve()

