"""Numeric faults on the local engine (issue 48, part 2): a non-finite loss term skips that optimiser step with its
term logged; steps in a row with a skip stop the run at train.max_nonfinite_steps, its last state finite."""
import pytest
import torch
from omegaconf import OmegaConf

import tests.plugins.toy_nan_loss as toy  # noqa: F401  (registers the toy_nan loss)
from training.engines import local


def _cfg(steps):
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h", "algo.policy_loss.name=toy_nan",
                               "train.rollout.sampler=hf"])
    # GRPO-H's entropy bonus moves the weights though the random model earns no reward
    return OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5, "kl_beta": 0.0}, "train": {
        "steps": steps, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 5, "minibatch_size": 2,
        "lr": 1e-3, "max_nonfinite_steps": 2}})


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _poisoned_at_step_1(cfg, run_dir):
    logged = []

    def log(m, s):
        logged.append((s, m))
        toy.POISON["on"] = s == 0  # poison step 1 only

    try:
        return local.train(cfg, run_dir, log), dict(logged), [s for s, _ in logged]
    finally:
        toy.POISON["on"] = False


@pytest.mark.slow
def test_a_nan_loss_at_one_step_skips_that_update_and_the_run_goes_on(tmp_path):
    """NaN at step 1 only: its two optimiser steps are skipped and logged (the policy loss named), its loss logged as
    NaN, not dropped; the weights after step 1 equal those before it (a one-step run's), and step 2 trains."""
    two, _, _ = _poisoned_at_step_1(_cfg(2), tmp_path / "two")
    three, m, steps = _poisoned_at_step_1(_cfg(3), tmp_path / "three")
    one = local.train(_cfg(1), tmp_path / "one")
    assert steps == [0, 1, 2]
    assert m[0]["train/nonfinite_skips"] == 0 and m[2]["train/nonfinite_skips"] == 0
    assert m[1]["train/nonfinite_skips"] == 2 and m[1]["train/nonfinite_policy_loss"] == 2
    assert m[1]["train/loss"] != m[1]["train/loss"]  # NaN, logged as such
    w1, w2, w3 = _weights(one), _weights(two), _weights(three)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # step 1 changed nothing
    assert m[2]["train/grad_norm"] > 0 and any(not torch.equal(w1[k], w3[k]) for k in w1)  # step 2 trained


@pytest.mark.slow
def test_nan_from_some_step_on_stops_the_run_with_one_line_and_a_finite_resumable_state(tmp_path):
    """NaN from step 1 on with train.max_nonfinite_steps=2: the run stops at step 2 naming the step and the term;
    its saved state is finite and resumes (the weights are step 0's)."""
    cfg = OmegaConf.merge(_cfg(4), {"train": {"checkpoint_every": 1}})
    logged = []

    def log(m, s):
        logged.append(s)
        toy.POISON["on"] = True  # from step 1 on

    try:
        with pytest.raises(local.NumericFault, match=r"^step 2: non-finite policy_loss in 2 steps in a row "
                                                     r"\(train.max_nonfinite_steps=2\)"):
            local.train(cfg, tmp_path / "a", log)
    finally:
        toy.POISON["on"] = False
    state = local.load_state(tmp_path / "a")
    assert state["step"] == 2 and all(bool(torch.isfinite(v).all()) for v in state["model"].values())
    one = _weights(local.train(_cfg(1), tmp_path / "one"))
    for k, v in one.items():  # steps 1 and 2 changed nothing (the saved file leaves out the tied output head)
        assert torch.equal(state["model"][k], v), k
    resumed = []
    local.train(cfg, tmp_path / "a", lambda m, s: resumed.append(s), logged_through=2)  # no poison: it finishes
    assert resumed == [3]
