"""A sweep point trained in micro-batches logs what the same point trained in one pass per minibatch logs.

One sweep, two points: ``train.micro_batch_tokens=null`` (each minibatch in one pass) and a budget that splits every
minibatch into several passes, the second forced to train (the budget is not part of a run's identity: it changes how
the same numbers are computed, not which). GRPO with its KL term, transformers rollouts, float32, the tiny model.
The rollouts of the first step are the same in both runs (same seed, same weights); each logged step's gradient norm,
policy loss and KL must agree to 1e-4 relative (float32 sums in another order), and the run tags its layout, budget
and memory plan.
"""
import pytest

from tests.e2e.test_sweep import TINY, _sweep


def test_micro_batched_point_logs_the_one_pass_points_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    budget = 56  # tokens per pass: a prompt of about 40 tokens and a few 8-token responses
    proc = _sweep(tmp_path, "-m", *TINY, "algo=grpo", "train.rollout.sampler=hf", "eval.sampler=hf", "eval.n=2",
                  "eval.ks=[1,2]", "eval.max_prompts=2", "report.enabled=false", "+force=true",
                  f"train.micro_batch_tokens=null,{budget}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "memory plan:" in proc.stderr  # printed at pre-flight
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("rlvr")
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("rlvr.micro_batch_tokens")]
    by_budget = {r.data.tags["rlvr.micro_batch_tokens"]: r for r in runs}
    assert set(by_budget) == {"None", str(budget)}, sorted(by_budget)
    one, split = by_budget["None"], by_budget[str(budget)]

    def history(run, key):
        return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

    assert max(history(split, "train/micro_batches")) > max(history(one, "train/micro_batches")) >= 2  # 2 minibatches
    for key in ("train/grad_norm", "train/policy_loss", "train/kl_ref"):
        a, b = history(one, key), history(split, key)
        assert len(a) == len(b) == 2, key
        assert b == pytest.approx(a, rel=1e-4, abs=1e-9), key
    for run in (one, split):
        tags = run.data.tags
        assert tags["rlvr.packing"] in ("tree", "packed", "padded") and tags["rlvr.packing_reason"]
        assert run.data.metrics["memory/plan_total_gb"] > 0
        assert 0 <= run.data.metrics["train/padding_share"] < 1
