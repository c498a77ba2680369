"""A stop inside the update (issue 48, part 3), in-process on the tiny model: a stop request during step 1's update
is honoured after the running optimiser step; the saved state holds the step's samples and the update so far, and the
resumed run ends with the same metric series and bit-identical weights as a run never stopped. (The same through
SIGTERM and the sweep command, with an update of over 30 s: tests/orchestrator/test_faults.py.)"""
import pytest
import torch
from omegaconf import OmegaConf

import tests.plugins.toy_slow_loss as toy  # noqa: F401  (registers the toy_slow loss)
from core.lifecycle import STOP_REQUESTED, Preempted
from training.engines import local

TIMES = ("time", "_s", "throughput", "tokens_per_s", "memory", "peak")


def _cfg():
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h", "algo.policy_loss.name=toy_slow",
                               "train.rollout.sampler=hf"])
    # GRPO-H's entropy bonus moves the weights though the random model earns no reward; 2 epochs x 4 minibatches
    return OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5, "kl_beta": 0.0}, "train": {
        "steps": 3, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5, "minibatch_size": 2,
        "ppo_epochs": 2, "lr": 1e-3, "micro_batch_tokens": None}})


def _run(cfg, run_dir, logged, stop_at=None):
    toy.STOP_AT.update({"pass": stop_at, "seen": 0})
    try:
        return local.train(cfg, run_dir, lambda m, s: logged.append((s, m)), max([s for s, _ in logged], default=-1))
    finally:
        toy.STOP_AT["pass"] = None
        STOP_REQUESTED.clear()


def _series(logged):
    keys = sorted({k for _, m in logged for k in m if not any(t in k for t in TIMES)})
    return {k: [m.get(k) for _, m in sorted(logged, key=lambda x: x[0])] for k in keys}


@pytest.mark.slow
def test_a_stop_inside_the_update_saves_its_progress_and_the_resumed_run_equals_an_unstopped_one(tmp_path):
    from safetensors.torch import load_file

    cfg = _cfg()
    straight = []
    _run(cfg, tmp_path / "straight", straight)
    stopped = []
    with pytest.raises(Preempted, match=r"stopped during step 2/3's update \(MLflow step 1\) on request, after 3 of its 8 optimiser steps"):
        _run(cfg, tmp_path / "stopped", stopped, stop_at=8 + 3)  # step 1's third optimiser step (one pass each)
    assert [s for s, _ in stopped] == [0]  # step 0 logged; step 1 not yet
    st = local.load_state(tmp_path / "stopped")
    assert st["step"] == 0 and st["inflight"]["step"] == 1 and st["inflight"]["done"] == 3
    assert len(st["inflight"]["metrics"]) == 3 and st["inflight"]["batch"]["response_ids"].shape[0] == 8
    _run(cfg, tmp_path / "stopped", stopped)  # resumed: finishes step 1 from its 4th optimiser step, then step 2
    assert [s for s, _ in stopped] == [0, 1, 2] == [s for s, _ in straight]
    got, want = _series(stopped), _series(straight)
    assert got.keys() == want.keys() and "train/grad_norm" in got
    for k in want:
        assert got[k] == want[k], k  # exactly: the same samples, the same optimiser steps in the same order
    a = load_file(str(tmp_path / "stopped" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "straight" / "checkpoint" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_stop_after_the_last_optimiser_step_ends_the_step_as_before(tmp_path):
    """A request in the step's last optimiser step: nothing is left of the update, so the step ends, is logged and
    the state after it is saved (no partial update)."""
    cfg = _cfg()
    logged = []
    with pytest.raises(Preempted, match=r"stopped after step 1/3 \(MLflow step 0\) on request"):
        _run(cfg, tmp_path / "r", logged, stop_at=8)
    st = local.load_state(tmp_path / "r")
    assert st["step"] == 0 and st["inflight"] is None and [s for s, _ in logged] == [0]
