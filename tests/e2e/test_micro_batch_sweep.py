"""A sweep point trained in micro-batches logs what the same point trained in one pass per minibatch logs.

One sweep, two points: ``train.micro_batch_tokens=null`` (each minibatch in one pass) and a budget that splits every
minibatch into several passes, the second forced to train (the budget is not part of a run's identity: it changes how
the same numbers are computed, not which). GRPO with its KL term, transformers rollouts, float32, the tiny model, on
``toy_parity`` (a reward that varies under any model: the tiny random model answers no arithmetic prompt in the
asked form, so there its gradients are zero and the comparison would compare zeros).
The rollouts of the first step are the same in both runs (same seed, same weights); that step's gradient norm, policy
loss and KL must agree to float32's precision over sums in another order (the gradient of the near-uniform tiny
model is a sum of nearly cancelling terms: 3e-4 relative measured on its norm; tests/training/test_micro_batches.py
shows the accumulated gradient equal to 1e-6 in float64). The second step's rollouts come from the two runs' slightly
different weights, so they are not compared. The run tags its layout, budget and memory plan.
"""
import pytest

from tests.e2e.test_sweep import TINY, _sweep

PARITY = ["plugins=[tests.plugins.toy_tasks]", "data.name=toy_parity", "+data.n_prompts=16", "eval.benchmarks=[toy_parity]"]


def test_micro_batched_point_logs_the_one_pass_points_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    budget = 56  # tokens per pass: a prompt of about 40 tokens and a few 8-token responses
    proc = _sweep(tmp_path, "-m", *TINY, "algo=grpo", "train.rollout.sampler=hf", "eval.sampler=hf", "eval.n=2",
                  "eval.ks=[1,2]", "eval.max_prompts=2", "report.enabled=false", "+force=true",
                  f"train.micro_batch_tokens=null,{budget}", *PARITY)
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
    assert history(one, "train/reward_mean")[0] == history(split, "train/reward_mean")[0]  # the same first rollouts
    assert history(one, "train/grad_norm")[0] > 0.1  # a real gradient to compare
    for key, tol in (("train/grad_norm", dict(rel=2e-3)), ("train/policy_loss", dict(abs=1e-4)),
                     ("train/kl_ref", dict(abs=1e-6))):
        a, b = history(one, key), history(split, key)
        assert len(a) == len(b) == 2, key
        assert b[0] == pytest.approx(a[0], **tol), key
    for run in (one, split):
        tags = run.data.tags
        assert tags["rlvr.packing"] in ("tree", "packed", "padded") and tags["rlvr.packing_reason"]
        assert run.data.metrics["memory/plan_total_gb"] > 0
        assert 0 <= run.data.metrics["train/padding_share"] < 1
