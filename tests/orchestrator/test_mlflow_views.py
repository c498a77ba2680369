"""orchestrator/store/mlflow_views.py: the experiment's kind, datasets and the parent's status, on a real SQLite store."""
import json

import pytest
from omegaconf import OmegaConf

from orchestrator.store import mlflow_views, tracking


def test_experiment_kind_is_set_once_and_a_users_kind_is_kept(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = tracking.setup_experiment(uri, "fresh", str(tmp_path / "art"))
    client = MlflowClient(uri)
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment("made-by-hand")  # before this suite set kinds: tagged on first use
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    tracking.setup_experiment(uri, "made-by-hand", str(tmp_path / "art"))
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    genai = client.create_experiment("genai", tags={"mlflow.experimentKind": "genai_development"})
    tracking.setup_experiment(uri, "genai", str(tmp_path / "art"))
    assert client.get_experiment(genai).tags["mlflow.experimentKind"] == "genai_development"


def _inputs(train_rows, bench_rows, data_dir=None):
    train_cfg = OmegaConf.create({"name": "arithmetic", "seed": 0})
    eval_cfg = OmegaConf.create({"data_dir": data_dir, "max_prompts": None})
    out = {}
    for d in mlflow_views.datasets(train_cfg, train_rows, bench_rows, eval_cfg):
        ctx = {t.key: t.value for t in d.tags}["mlflow.data.context"]
        out[(d.dataset.name, ctx)] = d.dataset
    return out


def test_datasets_name_context_rows_and_a_digest_that_follows_the_data(tmp_path):
    rows = [{"id": f"p{i}", "prompt": f"Compute {i} + 1.", "gold": str(i + 1), "task": "arithmetic"} for i in range(5)]
    bench = {"math500": [{"id": "m0", "prompt": "1+1?", "gold": "2", "meta": {"level": 1}}]}
    (tmp_path / "math500").mkdir()
    (tmp_path / "math500" / "test.jsonl").write_text(json.dumps(bench["math500"][0]) + "\n")
    a = _inputs(rows, bench, str(tmp_path))
    assert set(a) == {("arithmetic/train", "training"), ("math500", "evaluation")}
    train, ev = a[("arithmetic/train", "training")], a[("math500", "evaluation")]
    assert json.loads(train.profile)["num_rows"] == 5 and json.loads(ev.profile)["num_rows"] == 1
    assert ev.source_type == "local" and str(tmp_path / "math500" / "test.jsonl") in ev.source
    assert train.source_type == "code" and '"seed": 0' in json.loads(train.source)["tags"]["rlvr.data"]
    same = _inputs([dict(r) for r in rows], bench, str(tmp_path))
    assert same[("arithmetic/train", "training")].digest == train.digest  # same rows, same digest
    changed = [dict(r) for r in rows]
    changed[3]["gold"] = "99"
    assert _inputs(changed, bench, str(tmp_path))[("arithmetic/train", "training")].digest != train.digest
    assert _inputs(rows[:4], bench, str(tmp_path))[("arithmetic/train", "training")].digest != train.digest


@pytest.mark.parametrize("statuses,want", [
    (["FINISHED", "DUPLICATE"], "FINISHED"), ([], "FINISHED"), (["FINISHED", "KILLED"], "KILLED"),
    (["KILLED", "FAILED", "FINISHED"], "FAILED"), (["FINISHED", "NO OUTCOME"], "FAILED"), (["RUNNING"], "FAILED"),
])
def test_the_parent_ends_like_its_worst_child(statuses, want):
    assert mlflow_views.worst_status(statuses) == want
