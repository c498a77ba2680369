"""Bounded rollout staleness on the local engine (``train.rollout.staleness``, issue 58), sequential emulation on the
tiny model: step t trains on the samples the policy after step t-k-1 generated. Checked against a second method:
the kept checkpoints of the same run rebuild a step's samples (the weights after step t-k-1, the same prompts and
sampling seeds) and its proximal log-probs (the weights after step t-1); a stop anywhere with rollouts queued resumes
to the uninterrupted run's series and weights."""
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from core.lifecycle import step_checkpoint_dir
from training.engines import local
from training.engines.local import local_generation, local_queue, local_setup, local_step
from training.settings import RunSettings

K, STEPS = 2, 5
THREADS = []  # (target step, the thread that generated its rollout)
TIMES = ("time", "_s", "throughput", "tokens_per_s", "memory", "peak")


def _cfg(**rollout):
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h", "train.rollout.sampler=hf"])
    # GRPO-H's entropy bonus moves the weights though the random model earns no reward
    return OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5}, "train": {
        "steps": STEPS, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 5, "minibatch_size": 2,
        "lr": 1e-2, "save_every": 1, "checkpoint_every": 1, "rollout": {"staleness": K, **rollout}}})


def _train(cfg, run_dir, monkeypatch, logged=None, stop=None):
    """Train; returns {step: (response_ids, old_logprobs, behaviour_logprobs, policy_version)} as each update saw
    them. ``stop``: (phase, step) to request a stop in ("update" of step, "generate" of target step)."""
    seen, update, generate, calls = {}, local_step.update_policy, local_queue.generate, []
    logged = [] if logged is None else logged

    def watch(model, opt, batch, *a, **kw):
        step = int(a[-1].generator.initial_seed() - int(cfg.seed) * 7919)  # UpdateControl's seed names the step
        if stop == ("update", step):
            local.STOP_REQUESTED.set()  # honoured after the update's running optimiser step
        out = update(model, opt, batch, *a, **kw)
        # the old log-probs as the loss's ratio divided by (the update fills p before its first optimiser step)
        seen[step] = tuple(t.clone() for t in (batch.response_ids, batch.old_logprobs,
                                               batch.behaviour_logprobs if batch.behaviour_logprobs is not None else batch.old_logprobs,
                                               batch.policy_version))
        return out

    def gen(run, target, version=None, side=None):
        calls.append(target)
        THREADS.append((target, threading.current_thread().name))
        if stop == ("generate", target) and calls.count(target) == 1:
            from core.lifecycle import request_stop

            request_stop()  # inside the abortable phase: StepAborted at once
        return generate(run, target, version, side)

    monkeypatch.setattr(local_step, "update_policy", watch)
    monkeypatch.setattr(local_queue, "generate", gen)
    try:
        local.train(cfg, run_dir, lambda m, s: logged.append((s, m)), max([s for s, _ in logged], default=-1))
    finally:
        local.STOP_REQUESTED.clear()
        monkeypatch.undo()
    return seen


def _close(got: list, want: list) -> bool:
    """Two metric series equal to float tolerance (rel 1e-5, abs 1e-6), a missing value where the other's is."""
    import math

    return len(got) == len(want) and all(
        (a is None) == (b is None) and (a is None or (math.isnan(a) and math.isnan(b))
                                         or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6))
        for a, b in zip(got, want))


def _weights(run, folder):
    missing, unexpected = run.model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings, saved once


@pytest.mark.slow
def test_k2_samples_come_from_the_policy_three_steps_back_and_the_ratio_divides_by_the_current_one(tmp_path, monkeypatch):
    cfg = _cfg()
    logged = []
    seen = _train(cfg, tmp_path / "run", monkeypatch, logged)
    ages = {s: (m["train/staleness_mean"], m["train/staleness_max"]) for s, m in logged}
    assert ages == {0: (0, 0), 1: (1, 1), 2: (2, 2), 3: (2, 2), 4: (2, 2)}  # warm-up: the start policy's samples
    assert all(int(v.unique()) == max(0, s - K) for s, (_, _, _, v) in seen.items())
    assert "train/staleness_logprob_gap" in logged[3][1] and "train/staleness_logprob_gap" not in logged[0][1]

    # a second method: a fresh run with the weights after step t-k-1 (kept checkpoint t-k), the prompt order at
    # step t and t's sampling seeds generates the same samples; the proximal pass is the weights after step t-1
    run = local_setup.setup(RunSettings.of(cfg), tmp_path / "rebuild", tools={})
    run.rollout = local_setup.open_rollout(run, 1)
    t = 3
    for _ in range(t):
        run.prompts.next_rows(int(cfg.train.prompts_per_step))
    _weights(run, step_checkpoint_dir(tmp_path / "run", t - K))
    again = generate_plain(run, t)
    ids, old, behaviour, _ = seen[t]
    assert torch.equal(again.batch.response_ids, ids)
    mask = again.batch.response_mask.bool()
    assert torch.allclose(again.batch.behaviour_logprobs[mask], behaviour[mask], atol=1e-6)
    _weights(run, step_checkpoint_dir(tmp_path / "run", t))
    b = again.batch
    with torch.no_grad():
        p, _ = run.scorer.score(run.model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                float(cfg.train.temperature))
    assert torch.allclose(p[mask], old[mask], atol=1e-6)  # recompute: the ratio's denominator is the current policy
    assert (p[mask] - behaviour[mask]).abs().max() > 1e-4  # ... which is not the behaviour policy (the test can fail)


def generate_plain(run, step):
    return local_generation.generate(run, step, version=step - K)


@pytest.mark.slow
def test_behaviour_divides_by_the_generating_policy(tmp_path, monkeypatch):
    """``old_policy=behaviour``: the old log-probs the update sees are b, the generating policy's (the weights after
    step t-k-1, rebuilt from the kept checkpoint), not the current policy's."""
    cfg = _cfg(old_policy="behaviour")
    seen = _train(cfg, tmp_path / "run", monkeypatch)
    t = 3
    ids, old, behaviour, _ = seen[t]
    assert torch.equal(old, behaviour)
    run = local_setup.setup(RunSettings.of(cfg), tmp_path / "rebuild", tools={})
    for _ in range(t):
        run.prompts.next_rows(int(cfg.train.prompts_per_step))
    run.rollout = local_setup.open_rollout(run, 1)
    _weights(run, step_checkpoint_dir(tmp_path / "run", t - K))
    b = generate_plain(run, t).batch
    assert torch.equal(b.response_ids, ids)
    mask = b.response_mask.bool()
    assert torch.allclose(b.old_logprobs[mask], old[mask], atol=1e-6)
    _weights(run, step_checkpoint_dir(tmp_path / "run", t))
    with torch.no_grad():
        p, _ = run.scorer.score(run.model, b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask,
                                float(cfg.train.temperature))
    assert (p[mask] - old[mask]).abs().max() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("stop", [("update", 2), ("generate", 3), ("generate", 4)])
def test_a_stop_with_rollouts_queued_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch, stop):
    """A stop inside step 2's update (rollouts of steps 3 and 4 queued, saved with the state), in step 1's
    generation of step 3's rollout, in step 2's of step 4's: the resumed run logs every step once, with the
    uninterrupted run's series and final weights."""
    cfg = _cfg()
    straight = []
    _train(cfg, tmp_path / "a", monkeypatch, straight)
    stopped = []
    with pytest.raises(local.Preempted):
        _train(cfg, tmp_path / "b", monkeypatch, stopped, stop=stop)
    st = local.load_state(tmp_path / "b")
    if stop[0] == "update":
        assert st["inflight"]["step"] == 2 and sorted(st["queue"]) == [3, 4]
    else:  # what the stopped step generated ahead is dropped: the state is the step before's, queue and all
        assert sorted(st["queue"]) == list(range(stop[1] - K, stop[1]))
    _train(cfg, tmp_path / "b", monkeypatch, stopped)
    assert [s for s, _ in stopped] == list(range(STEPS))
    keys = sorted({k for _, m in straight for k in m if not any(x in k for x in TIMES)})
    for k in keys:
        assert [m.get(k) for _, m in stopped] == [m.get(k) for _, m in straight], k
    a, b = (load_file(str(tmp_path / d / "checkpoint" / "model.safetensors")) for d in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_k0_is_the_on_policy_loop(tmp_path, monkeypatch):
    """k = 0: no queue, every sample from the policy the step starts from, no staleness series."""
    cfg = _cfg()
    cfg.train.rollout.staleness = 0
    logged = []
    seen = _train(cfg, tmp_path / "run", monkeypatch, logged)
    assert sorted(seen) == list(range(STEPS)) and all(int(v.unique()) == s for s, (_, _, _, v) in seen.items())
    assert not any("staleness" in k for _, m in logged for k in m)


ALGOS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "sweeps" / "algo").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_trains_on_a_stale_rollout_with_a_correction(algo, tmp_path):
    """k = 1 with token-level TIS by p/b (b: the trainer's pass on the generating weights, the transformers sampler):
    step 1 trains on step 0's policy's samples, through each algorithm's estimator and loss, and logs the correction's
    weights and the p-vs-b gap (finite)."""
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.checks.validate import validate_config

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", f"algo={algo}", "train.rollout.sampler=hf",
                               "train.rollout.staleness=1", "train.rollout.correction=token_tis"])
    cfg = OmegaConf.merge(cfg, {"train": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                                          "minibatch_size": None, "lr": 1e-3}})
    validate_config(cfg)
    logged = []
    local.train(cfg, tmp_path, lambda m, s: logged.append((s, m)))
    last = dict(logged)[1]
    assert last["train/staleness_mean"] == 1.0
    if last.get("train/batch_responses", 0) > 0:  # DAPO's dynamic sampling may keep no group of the random model
        assert 0 < last["train/tis_weight_mean"] <= float(cfg.train.rollout.correction_cap)
        assert last["train/staleness_logprob_gap"] == last["train/staleness_logprob_gap"]  # finite, logged


@pytest.mark.slow
@pytest.mark.parametrize("stop", [None, ("update", 2)])
def test_overlapped_generation_gives_the_emulated_run(tmp_path, monkeypatch, stop):
    """``train.rollout.overlap``: step t+k generated in a thread during step t's update, by a copy of the weights
    the step starts from, gives the emulated run's samples, metric series and final weights (the transformers
    sampler: its samples depend only on the seeds and weights); a stop inside step 2's update waits for the
    generation of step 4 and saves it with the queue, and the resumed run ends as the uninterrupted one."""
    emulated, overlapped = [], []
    THREADS.clear()
    seen_e = _train(_cfg(), tmp_path / "a", monkeypatch, emulated)
    cfg = _cfg(overlap=True)
    if stop:
        with pytest.raises(local.Preempted):
            _train(cfg, tmp_path / "b", monkeypatch, overlapped, stop=stop)
        st = local.load_state(tmp_path / "b")
        assert st["inflight"]["step"] == 2 and sorted(st["queue"]) == [3, 4]
    seen_o = _train(cfg, tmp_path / "b", monkeypatch, overlapped)
    assert [s for s, _ in overlapped] == list(range(STEPS))
    assert all("train/overlap_wait_s" in m for _, m in overlapped)
    # steps 0 and 1 generated at step 0's start, each later one in a thread of its own during an update
    assert sorted(t for t, name in THREADS[-(STEPS - K):] if name == f"rollout-step-{t}") == list(range(K, STEPS))
    # to float tolerance: the update runs beside the generation, and a math library that picks its thread count by
    # the load (MKL's dynamic threads) may sum in another order (a CI run: grad norms 6e-10 apart); the samples equal
    for s in range(STEPS):
        if stop is None or s > 2:  # (the stopped run's watch saw step 2 before the stop)
            ids_e, old_e, b_e, v_e = seen_e[s]
            ids_o, old_o, b_o, v_o = seen_o[s]
            assert torch.equal(ids_e, ids_o) and torch.equal(v_e, v_o), s
            assert torch.allclose(old_e, old_o, atol=1e-5, equal_nan=True) and torch.allclose(b_e, b_o, atol=1e-5,
                                                                                               equal_nan=True), s
    keys = sorted({k for _, m in emulated for k in m if not any(x in k for x in TIMES)})
    assert "train/staleness_logprob_gap" in keys and "train/mismatch_logprob_abs_diff" not in keys  # (hf: no own)
    for k in keys:
        assert _close([m.get(k) for _, m in overlapped], [m.get(k) for _, m in emulated]), k
    a, b = (load_file(str(tmp_path / d / "checkpoint" / "model.safetensors")) for d in ("a", "b"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


class _Recorder:
    """A validator (:class:`training.engines.LoopValidation`, ``every`` 2) that samples two prompts through the
    engine's sampler and records (step, the rollout threads alive while it ran, the responses, the compute before)."""

    every = 2

    def __init__(self):
        self.calls = []

    def __call__(self, step, sampler, compute_flops):
        from core.sampling import SamplingSettings

        alive = [t.name for t in threading.enumerate() if t.name.startswith("rollout-step-")]
        out = sampler.sample(["What is 1 + 1?", "What is 2 + 3?"], 2, [7, 8], SamplingSettings(1.0, 1.0, 5))
        self.calls.append((step, alive, [x.response for o in out for x in o], compute_flops))


@pytest.mark.slow
def test_validation_inside_the_loop_waits_for_the_overlapped_generation_and_changes_no_training(tmp_path):
    """Issue 69, with ``train.rollout.overlap``: the validation inside the loop (steps 0, 2, 4 and the last, 5) runs
    when no generation thread is alive (the generation started during a step's update is joined before the step
    ends), samples the policy of its step (the checkpoint kept at step 2, sampled again offline through a fresh
    rollout sampler: the same responses), is handed the compute of the steps before it, and leaves the run's
    series and weights as a run without validation has them."""
    from core.models import load_checkpoint
    from core.sampling import HFRollout, RolloutSampler, SamplingSettings

    cfg, plain, validated, rec = _cfg(overlap=True), [], [], _Recorder()
    local.train(cfg, tmp_path / "plain", lambda m, s: plain.append((s, m)))
    local.train(cfg, tmp_path / "val", lambda m, s: validated.append((s, m)), validator=rec)
    assert [c[0] for c in rec.calls] == [0, 2, 4, 5] and all(c[1] == [] for c in rec.calls)
    flops = {s: m["train/flops"] for s, m in validated}
    assert [c[3] for c in rec.calls] == pytest.approx([sum(v for t, v in flops.items() if t < s) for s in (0, 2, 4, 5)])
    keys = sorted({k for _, m in plain for k in m if not any(x in k for x in TIMES)})
    for k in keys:
        assert _close([m.get(k) for _, m in validated], [m.get(k) for _, m in plain]), k
    a, b = (load_file(str(tmp_path / d / "checkpoint" / "model.safetensors")) for d in ("plain", "val"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    model, tok = load_checkpoint(str(step_checkpoint_dir(tmp_path / "val", 2)), "cpu", torch.float32)
    out = RolloutSampler(HFRollout(model, tok), tok).sample(["What is 1 + 1?", "What is 2 + 3?"], 2, [7, 8],
                                                             SamplingSettings(1.0, 1.0, 5))
    assert [x.response for o in out for x in o] == rec.calls[1][2]


@pytest.mark.slow
def test_exppo_shuffle_with_overlap_and_checkpointing_gives_the_emulated_run(tmp_path, monkeypatch):
    """ExPPO's shuffled-surprisal control (``exppo_part=shuffled``) draws its permutations in the generation, which
    with overlap runs in a thread beside the update; with gradient checkpointing that update's backward resets torch's
    global generator. The permutations come from a generator seeded per step (the estimator declares ``generator``),
    so the overlapped run equals its emulation: the samples, the advantages and the ExPPO audit the estimator logs,
    every metric series and the final weights. On ``toy_parity`` (tests/plugins/toy_tasks.py) rewards vary within a
    group, so the permutation changes the advantages (checked: another seed, other advantages)."""
    from core.tasks import load_plugins
    from orchestrator.checks.preflight import sweep_points

    load_plugins(["tests.plugins.toy_tasks"])
    [(_, base)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=exppo", "+exppo_part=shuffled",
                                "train.rollout.sampler=hf", "plugins=[tests.plugins.toy_tasks]",
                                "data.name=toy_parity", "+data.n_prompts=16", "eval.benchmarks=[toy_parity]"])
    assert base.algo.advantage.shuffle_surprisal is True

    def cfg(overlap, seed=0):
        return OmegaConf.merge(base, {"seed": seed, "train": {
            "steps": STEPS, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6, "minibatch_size": 4,
            "lr": 1e-2, "gradient_checkpointing": True,
            "rollout": {"staleness": K, "overlap": overlap, "correction": "token_tis"}}})

    series = {}
    for name, c in (("emulated", cfg(False)), ("overlapped", cfg(True)), ("other seed", cfg(False, seed=1))):
        logged = []
        local.train(c, tmp_path / name.replace(" ", "_"), lambda m, s: logged.append((s, m)))
        series[name] = logged
    keys = sorted({k for _, m in series["emulated"] for k in m if not any(x in k for x in TIMES)})
    assert "train/audit_correct_rare" in keys or any(k.startswith("train/audit_") for k in keys), keys
    for k in keys:
        assert _close([m.get(k) for _, m in series["overlapped"]], [m.get(k) for _, m in series["emulated"]]), k
    a, b = (load_file(str(tmp_path / d / "checkpoint" / "model.safetensors")) for d in ("emulated", "overlapped"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    adv = [[m["train/advantage_abs_mean"] for _, m in series[n]] for n in ("emulated", "other seed")]
    assert adv[0] != adv[1]


OVERLAP_VLLM = """
import json, sys
from omegaconf import OmegaConf
from orchestrator.checks.preflight import sweep_points
from training.engines import local

series = {}
for overlap in (False, True):
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=grpo_h", "train.rollout.sampler=vllm"])
    cfg = OmegaConf.merge(cfg, {"algo": {"entropy_coef": 0.5}, "train": {
        "steps": 4, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 5, "minibatch_size": 2, "lr": 1e-2,
        "rollout": {"staleness": 1, "overlap": overlap, "correction": "token_tis"}}})
    logged = []
    local.train(cfg, sys.argv[1] + f"/{overlap}", lambda m, s: logged.append((s, m)), -1)
    series[str(overlap)] = logged
print("SERIES " + json.dumps(series))
"""


@pytest.mark.slow
def test_overlapped_vllm_generation_gives_the_emulated_run(tmp_path):
    """The vLLM sampler (its CPU build, in a process of its own): step t+1 generated by the engine during step t's
    update (the sync after the update waits for it), the behaviour log-probs and the mismatch from the copy of the
    weights the step started from, gives the emulated run's metric series, token TIS's weights and the mismatch on
    the generating weights included (vLLM's per-request seeds: its samples do not depend on scheduling)."""
    import json
    import os
    import subprocess
    import sys

    from core.sampling import SAMPLERS
    from tests.conftest import REPO

    if SAMPLERS["vllm"].missing() is not None:
        pytest.skip("vLLM is not installed (scripts/install.sh installs its CPU build)")
    proc = subprocess.run([sys.executable, "-c", OVERLAP_VLLM, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    series = json.loads(proc.stdout.split("SERIES ", 1)[1].splitlines()[0])
    emulated, overlapped = series["False"], series["True"]
    assert [s for s, _ in overlapped] == [0, 1, 2, 3]
    keys = sorted({k for _, m in emulated for k in m if not any(x in k for x in TIMES)})
    assert {"train/mismatch_logprob_abs_diff", "train/staleness_logprob_gap", "train/correction_weight_mean"} <= set(keys)
    for k in keys:  # to float tolerance (see the transformers test above)
        assert _close([m.get(k) for _, m in overlapped], [m.get(k) for _, m in emulated]), k
    assert all("train/overlap_wait_s" in m for _, m in overlapped)


def test_overlap_without_staleness_is_refused_in_one_line():
    """Nothing can be generated during an on-policy update: refused before any work, naming both keys."""
    from omegaconf import OmegaConf

    cfg = _cfg(overlap=True)
    assert local.validate(cfg) is not None  # k = 2 with overlap passes
    cfg = OmegaConf.merge(cfg, {"train": {"rollout": {"staleness": 0}}})
    with pytest.raises(ValueError, match=r"^train\.rollout\.overlap=true with train\.rollout\.staleness=0: "):
        local.validate(cfg)
