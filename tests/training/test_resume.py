"""Preemption and resume of the local engine: the resumed run equals the uninterrupted one."""
import pytest
import torch
from omegaconf import OmegaConf

from core.models import load_policy
from training.engines import local
from training.engines.local import local_step


def _cfg(tiny_cfg):
    # GRPO-H's entropy bonus moves the weights even though the random model earns no reward, so the
    # optimiser's moments and the prompt order must be restored exactly for the runs to agree
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h"])
    return OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5}, "train": {
        "steps": 4, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 5, "minibatch_size": 2, "lr": 1e-3,
        "checkpoint_every": 1}})


@pytest.mark.slow
@pytest.mark.parametrize("where", ["between steps", "during the update"])
def test_preempted_and_resumed_training_matches_an_uninterrupted_run(tiny_cfg, tmp_path, monkeypatch, where):
    """A stop requested once step 1 is logged is honoured before step 2 generates anything (the state after step 1
    is saved: core.lifecycle.abortable); one requested during step 2's update after its first of two optimiser steps
    (the state after step 1 with step 2's samples and that optimiser step: issue 48). Either way the resumed run logs
    every step once and ends with the uninterrupted run's weights."""
    cfg = _cfg(tiny_cfg)
    straight = []
    ckpt_a = local.train(cfg, tmp_path / "a", lambda m, s: straight.append((s, m)))

    resumed = []

    def log_and_preempt(m, s):
        resumed.append((s, m))
        if s == 1 and where == "between steps":
            local.STOP_REQUESTED.set()  # as the SIGUSR2 handler does

    if where == "during the update":
        update, calls = local_step.update_policy, []

        def update_and_preempt(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:  # step 2's update
                local.STOP_REQUESTED.set()
            return update(*args, **kwargs)

        monkeypatch.setattr(local_step, "update_policy", update_and_preempt)
    try:
        with pytest.raises(local.Preempted):
            local.train(cfg, tmp_path / "b", log_and_preempt)
    finally:
        local.STOP_REQUESTED.clear()
        monkeypatch.undo()
    done = [0, 1]
    assert [s for s, _ in resumed] == done
    state = local.load_state(tmp_path / "b")
    assert state["step"] == done[-1]
    assert (state["inflight"] or {}).get("done") == (None if where == "between steps" else 1)
    ckpt_b = local.train(cfg, tmp_path / "b", lambda m, s: resumed.append((s, m)), logged_through=done[-1])
    assert [s for s, _ in resumed] == [0, 1, 2, 3]  # every step exactly once
    for (_, ma), (_, mb) in zip(straight, resumed):
        for key in ("train/entropy", "train/entropy_bonus", "train/grad_norm", "train/response_length_mean"):
            assert ma[key] == pytest.approx(mb[key], rel=1e-6), key
    from safetensors.torch import load_file

    wa, wb = load_file(ckpt_a / "model.safetensors"), load_file(ckpt_b / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert not torch.equal(wa["model.embed_tokens.weight"], load_policy(cfg.model)[0].state_dict()["model.embed_tokens.weight"])
    # the sampled tokens' counts and mean probabilities (TR-GRPO's Fig. 1) survive the stop: the resumed run's file is
    # the uninterrupted one's, and its counts add up to the response tokens the steps logged (a second count)
    import pandas as pd

    ta, tb = (pd.read_csv(tmp_path / d / "token_probs.csv", keep_default_na=False) for d in ("a", "b"))
    pd.testing.assert_frame_equal(ta, tb, rtol=1e-6)
    tokens = sum(m["train/response_length_mean"] * m["train/batch_responses"] for _, m in straight)
    assert ta["count"].sum() == round(tokens) and ((ta["mean_prob"] > 0) & (ta["mean_prob"] <= 1)).all()


def test_metrics_saved_before_a_crash_are_logged_once_on_resume(tiny_cfg, tmp_path):
    cfg = OmegaConf.merge(_cfg(tiny_cfg), {"train": {"steps": 3, "checkpoint_every": 2}})
    first = []
    local.train(cfg, tmp_path / "c", lambda m, s: first.append(s))
    assert first == [0, 1, 2]  # logged in two flushes, with the saves at steps 1 and 2
    state = torch.load(tmp_path / "c" / "state" / "train_state.pt", weights_only=False)
    assert state["step"] == 2 and [s for s, _ in state["pending"]] == [2]
    # a job killed after saving step 2 but before the tracker got it (the tracker holds steps 0-1):
    # the restart logs step 2 from the saved state, once, and trains nothing again
    again = []
    local.train(cfg, tmp_path / "c", lambda m, s: again.append((s, m)), logged_through=1)
    assert [s for s, _ in again] == [2] and again[0][1] == state["pending"][0][1]
    # and when the tracker already holds step 2, nothing is logged twice
    none = []
    local.train(cfg, tmp_path / "c", lambda m, s: none.append(s), logged_through=2)
    assert none == []
