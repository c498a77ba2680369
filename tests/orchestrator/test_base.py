"""The base model's evaluation: its identity, and the claim protocol on a real MLflow store with the tiny model."""
import subprocess
import threading
import time

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from orchestrator.checks.preflight import sweep_points
from orchestrator.point import base_model as B
from orchestrator.store import tracking


def _cfg(*overrides):
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", *overrides])
    return cfg


def _hash(*overrides, sampler=None):
    from evaluation import protocol as P

    cfg = _cfg(*overrides)
    proto = P.resolve(cfg.eval)
    return B.base_hash(B.base_identity(cfg, {**proto, **({"sampler": sampler} if sampler else {})}))


@pytest.mark.slow
def test_base_identity_is_what_determines_the_base_samples():
    h = _hash()
    for same in (["algo=gspo"], ["train.lr=1e-3", "train.steps=9"], ["eval.flip_k=2"], ["eval.base=false"],
                 ["eval.checkpoints=all", "train.save_every=1"], ["seed=5"], ["delta=0.5"]):
        assert _hash(*same) == h, same  # the starting model's samples do not depend on these
    for other in (["eval.n=8", "eval.ks=[1,2]"], ["eval.temperature=0.7"], ["eval.max_new_tokens=9"], ["model=smollm2-135m"],
                  ["data.n_eval=10"]):
        assert _hash(*other) != h, other  # the held-out arithmetic split comes from the data config
    assert _hash(sampler="vllm") != h  # the evaluation protocol: another sampler samples otherwise
    assert _hash("eval.dtype=bfloat16") != h  # another dtype (auto is float32 on the tests' CPU flags)
    math_eval = ["eval.benchmarks=[aime24]"]
    assert _hash(*math_eval, "data.n_eval=10") == _hash(*math_eval)  # no held-out split: the data set is irrelevant


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = tracking.setup_experiment(uri, "base-test", str(tmp_path / "art"))
    return exp_id, MlflowClient(tracking_uri=uri)


def _base(cfg, exp_id, tmp_path, job="0"):
    from core.tasks import load_prompts

    return B.BaseEvaluation(cfg, exp_id, "sweep-A", job, tmp_path / "sweep", load_prompts(cfg.data, "eval"),
                            tracking.Store())


def _fake_claim(client, exp_id, h, **tags):
    base_tags = {tracking.TAG_HASH: h, tracking.TAG_KIND: "base", "rlvr.heartbeat": f"{time.time():.3f}",
                 "rlvr.host": "another-host", "rlvr.sweep_id": "sweep-B", "rlvr.job_num": "3"}
    return client.create_run(exp_id, run_name="Initialization", tags={**base_tags, **tags}).info.run_id


def _base_runs(client, exp_id):
    return client.search_runs([exp_id], filter_string="tags.`rlvr.kind` = 'base'")


@pytest.mark.slow
def test_a_live_claim_defers_and_a_silent_one_is_taken_over(store, tmp_path):
    exp_id, client = store
    cfg = _cfg()
    be = _base(cfg, exp_id, tmp_path)
    other = _fake_claim(client, exp_id, be.hash)
    assert be.ensure(wait=False) is None  # another job is evaluating it: train meanwhile
    assert [r.info.run_id for r in _base_runs(client, exp_id)] == [other]
    client.set_tag(other, "rlvr.heartbeat", f"{time.time() - B.STALE_S - 5:.3f}")  # its holder went silent
    samples = be.ensure(wait=False)
    assert len(samples) == 4 * 4 and samples["mean_token_entropy"].notna().all()
    assert client.get_run(other).info.status == "KILLED"
    done = [r for r in _base_runs(client, exp_id) if r.info.status == "FINISHED"]
    assert len(done) == 1 and done[0].info.run_id == be.run_id
    assert done[0].data.metrics["eval/arithmetic/pass_at_1"] == pytest.approx(samples["correct"].mean())
    # later points find the finished run: nothing is evaluated again
    again = _base(cfg, exp_id, tmp_path, job="1")
    pd.testing.assert_frame_equal(again.ensure(wait=True), samples)
    assert again.run_id == be.run_id and len(_base_runs(client, exp_id)) == 2


def test_a_claim_on_this_host_whose_process_is_gone_is_not_live(store):
    import socket

    exp_id, client = store
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_id = _fake_claim(client, exp_id, "h", **{"rlvr.host": socket.gethostname(), "rlvr.pid": str(dead.pid)})
    assert not B.claim_is_live(client.get_run(run_id))
    alive = _fake_claim(client, exp_id, "h", **{"rlvr.host": socket.gethostname(), "rlvr.pid": str(__import__("os").getpid())})
    assert B.claim_is_live(client.get_run(alive))


@pytest.mark.slow
def test_waiting_for_another_jobs_claim_returns_its_samples(store, tmp_path):
    exp_id, client = store
    be = _base(_cfg(), exp_id, tmp_path)
    other = _fake_claim(client, exp_id, be.hash)
    table = pd.DataFrame({"benchmark": ["arithmetic"], "prompt_id": ["x"], "sample_idx": [0], "correct": [True]})
    path = tmp_path / "other" / "samples.parquet"
    path.parent.mkdir()
    table.to_parquet(path)

    def finish():
        time.sleep(1.0)
        client.log_artifact(other, str(path))
        client.set_terminated(other, "FINISHED")

    threading.Thread(target=finish).start()
    t0 = time.time()
    got = be.ensure(wait=True)
    assert time.time() - t0 >= 1.0 and be.run_id == other
    pd.testing.assert_frame_equal(got, table)
    assert len(_base_runs(client, exp_id)) == 1  # it never claimed one of its own


@pytest.mark.slow
def test_a_failed_base_evaluation_is_recorded_and_the_point_goes_on(store, tmp_path):
    exp_id, client = store
    cfg = OmegaConf.merge(_cfg(), {"eval": {"benchmarks": ["aime24"], "data_dir": str(tmp_path / "missing")}})
    be = _base(cfg, exp_id, tmp_path)
    assert be.ensure(wait=False) is None
    [run] = _base_runs(client, exp_id)
    assert run.info.status == "FAILED" and "traceback.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert _base(cfg, exp_id, tmp_path, job="1").ensure(wait=True) is None  # not retried within the same sweep
    assert len(_base_runs(client, exp_id)) == 1
