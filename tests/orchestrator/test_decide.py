"""The decision a point takes before training, against a real MLflow store, at the moments two processes race.

Seen in CI (two identical sweeps at once): a point waiting on another sweep's live run of it looked for a finished
run, found none, and in the next query (the unfinished runs) no longer saw the other run, which had finished in
between; it then trained the point a second time. These tests put the other run's end exactly in that window; the rules decide (orchestrator.point.decision), and
orchestrator.point.act.settle acts on their decisions until the point is settled."""
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from orchestrator.point import act, decision, integrity
from orchestrator.point.signals import StopSignals
from orchestrator.store import lease, tracking

CHASH, THASH = "c" * 16, "t" * 16


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp_id = MlflowClient().create_experiment("rlvr")
    monkeypatch.setattr(decision, "POLL_S", 0.05)
    # the finished run here is a bare MLflow run (no files): its integrity is not what these tests are about
    monkeypatch.setattr(integrity, "verify_run", lambda client, r: ([], True))
    yield exp_id
    mlflow.set_tracking_uri(None)


def _other_sweeps_live_run(exp_id):
    """A RUNNING trained run of the point, held (live lease) by this process for another sweep."""
    r = MlflowClient().create_run(exp_id, run_name="algo=gspo", tags={
        tracking.TAG_HASH: CHASH, tracking.TAG_TRAIN_HASH: THASH, tracking.TAG_KIND: "trained",
        "rlvr.sweep_id": "other-sweep", "rlvr.job_num": "1", **lease.owner_tags(lease.new_owner())})
    return r.info.run_id


def _point(exp_id, tmp_path):
    cfg = OmegaConf.create({"eval": {"base": False}, "data": {}})
    return decision.Point(cfg, exp_id, CHASH, "this-sweep", 1, "algo=gspo",
                      {tracking.TAG_HASH: CHASH, tracking.TAG_TRAIN_HASH: THASH, "rlvr.sweep_id": "this-sweep",
                       "rlvr.job_num": "1"}, {}, stale_s=300.0, force=False, run_dir=Path(tmp_path) / "run",
                      signals=StopSignals(), store=tracking.Store())


@pytest.mark.parametrize("finishes_after", ["finished_run", "_trained_checkpoint"])
def test_a_run_finishing_between_the_decisions_queries_is_taken_as_the_points_result(store, tmp_path, monkeypatch,
                                                                                      finishes_after):
    other = _other_sweeps_live_run(store)
    calls = {"n": 0}
    owner = tracking.Store if finishes_after == "finished_run" else decision
    real = getattr(owner, finishes_after)

    def then_the_other_finishes(*a, **k):
        out = real(*a, **k)
        calls["n"] += 1
        if calls["n"] == 2:  # the second poll: the other process ends its run right after this query
            MlflowClient().set_terminated(other, "FINISHED")
        return out

    monkeypatch.setattr(owner, finishes_after, then_the_other_finishes)
    decided = act.settle(_point(store, tmp_path))
    assert calls["n"] >= 2  # the race happened: the point waited on the live run, then it finished mid-decision
    assert decided.action is decision.Action.DUPLICATE and decided.summary["duplicate_of"] == other
    trained = tracking.Store().runs_with_hash(store, CHASH)
    assert [r.info.run_id for r in trained] == [other]  # no second trained run of the point


def test_a_stale_run_of_another_sweep_is_taken_over_not_waited_for(store, tmp_path, monkeypatch):
    other = _other_sweeps_live_run(store)
    pt = _point(store, tmp_path)
    assert lease.is_live(MlflowClient().get_run(other), pt.stale_s)
    MlflowClient().set_tag(other, "rlvr.heartbeat", "1.0")  # its owner stopped beating long ago: stale
    MlflowClient().set_tag(other, "rlvr.host", "another-host")  # (on this host a live PID would keep it)
    monkeypatch.setattr(lease, "SETTLE_S", 0.0)
    decided = act.settle(pt)
    # claimed by this process; with no run folder to resume from it is set aside and the point starts afresh
    r = MlflowClient().get_run(other)
    assert r.data.tags["rlvr.owner"] == decided.owner and decided.action is decision.Action.NEW and decided.run is None
    assert r.info.status == "KILLED" and "not resumed" in r.data.tags["rlvr.invalid"]
