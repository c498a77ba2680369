"""Rollout scoring and the local engine on the tiny random model."""
import pytest
import torch

from core.scoring import Sequences
from training.collect import RolloutRequest, collect_rollouts, compute_logprobs

ROWS = [{"id": "a", "prompt": "Compute 3 + 4.", "gold": "7", "task": "arithmetic"},
        {"id": "b", "prompt": "Compute 12 + 30. Answer with just the number.", "gold": "42", "task": "arithmetic"}]


def test_left_padded_logprobs_equal_unpadded_per_sequence(tiny_policy):
    """Second method: score each response alone (no padding at all) and compare."""
    model, tok = tiny_policy
    batch, _ = collect_rollouts(model, tok, ROWS, RolloutRequest(3, 1.0, 1.0, 6, seed=0))
    assert batch.response_ids.shape[0] == 6 and batch.prompt_mask[0].sum() < batch.prompt_mask.shape[1]
    for i in range(6):
        p = batch.prompt_ids[i][batch.prompt_mask[i].bool()].unsqueeze(0)
        L = int(batch.response_mask[i].sum())
        r = batch.response_ids[i, :L].unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=torch.cat([p, r], 1)).logits[0, p.shape[1] - 1:-1]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, r[0].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(batch.old_logprobs[i, :L], ref, atol=1e-4)
        # entropy from the same distribution, by its definition
        lp = torch.log_softmax(logits.float(), -1)
        assert torch.allclose(batch.entropy[i, :L], -(lp.exp() * lp).sum(-1), atol=1e-4)


def test_group_samples_differ_and_rollouts_are_reproducible(tiny_policy):
    model, tok = tiny_policy
    b1, texts = collect_rollouts(model, tok, ROWS[:1], RolloutRequest(4, 1.0, 1.0, 8, seed=7))
    b2, _ = collect_rollouts(model, tok, ROWS[:1], RolloutRequest(4, 1.0, 1.0, 8, seed=7))
    assert torch.equal(b1.response_ids, b2.response_ids)
    assert len(set(texts)) > 1
    assert b1.group_index.tolist() == [0, 0, 0, 0]


@pytest.mark.slow
def test_local_engine_updates_the_policy_and_logs_every_step(tiny_cfg, tmp_path):
    from omegaconf import OmegaConf

    from core.lifecycle import saved_checkpoints
    from core.models import load_checkpoint, load_policy
    from training.engines.local import train

    cfg = OmegaConf.merge(tiny_cfg, {"train": {"steps": 2, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6,
                                               "minibatch_size": 4, "lr": 1e-2, "save_every": 1}, "algo": {"kl_beta": 0.001}})
    logged = []
    ckpt = train(cfg, tmp_path, lambda m, s: logged.append((s, m)))
    assert [s for s, _ in logged] == [0, 1]
    assert [s for s, _ in saved_checkpoints(tmp_path)] == [1]  # step 2 is the final checkpoint itself
    for key in ("train/reward_mean", "train/entropy", "train/grad_norm", "train/kl_ref", "train/step_time_s",
                "train/tokens_per_s", "train/zero_variance_share", "train/response_length_mean"):
        assert key in logged[-1][1], key
    assert all(m["train/reward_mean"] == 0.0 for _, m in logged)  # the random model never answers right
    # so A = 0 everywhere. With the KL term the policy sits at the reference only up to float rounding (the
    # reference pass scores the whole batch, the update each minibatch: rows of other shapes, other rounding), which
    # AdamW at lr 1e-2 amplifies; without it the loss's gradient is exactly 0: every weight stays unchanged
    cfg = OmegaConf.merge(cfg, {"algo": {"kl_beta": 0.0}, "train": {"save_every": 0}})
    ckpt = train(cfg, tmp_path / "no_kl", lambda m, s: None)
    trained, _ = load_checkpoint(ckpt)
    initial, _ = load_policy(cfg.model)
    for (name, a), b in zip(trained.named_parameters(), initial.parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("algo", ["quatro", "gspo", "grpo"])
def test_one_update_moves_logprobs_in_the_direction_of_the_advantage(tiny_policy, algo):
    import copy

    from orchestrator.checks.preflight import sweep_points
    from training.algorithms import BoundLoss
    from training.update import update_policy

    [(_, cfg)] = sweep_points([f"algo={algo}"])
    params = {k: v for k, v in dict(cfg.algo.policy_loss).items() if k != "name"}
    model, tok = tiny_policy
    model = copy.deepcopy(model)
    batch, _ = collect_rollouts(model, tok, ROWS[:1], RolloutRequest(2, 1.0, 1.0, 6, seed=3))
    adv = torch.tensor([1.0, -1.0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)  # plain gradient step: sign follows the loss
    metrics = update_policy(model, opt, batch, adv, BoundLoss.named(cfg.algo.policy_loss.name, params))
    assert len(metrics) == 1 and metrics[0]["grad_norm"] > 0
    with torch.no_grad():
        new, _ = compute_logprobs(model, Sequences.of(batch))
    change = ((new - batch.old_logprobs) * batch.response_mask).sum(-1)
    assert change[0] > 0 > change[1]


def test_the_auto_choice_is_checked_against_what_happened_and_calibrated_by_it(tmp_path, monkeypatch):
    """Issue 56: ``auto`` estimated 20 s of sampling for a point that took 255 s, and nothing compared the two. The
    run records both (a tag), warns once when they are more than 3x apart naming both figures, and keeps the ratio
    for this machine: the next choice weighs each sampler's estimate by the median of its last 5 ratios."""
    from core import console
    from core.sampling import SAMPLERS, RolloutPlan, choose_rollout_sampler
    from core.sampling.rollout import calibration_factor, record_sampling_time
    from orchestrator.point.run import estimate_check

    monkeypatch.setattr(console, "_said", set())
    tags, warning = estimate_check("train.rollout.sampler=auto", "chose vllm, estimating", 20.0, 255.0,
                                   "s of sampling", "its speeds: ROLLOUT_SPEED")
    assert tags == {"rlvr.estimate.train.rollout.sampler": "estimate 20 s of sampling, measured 255 (12.75x)"}
    assert warning == ("train.rollout.sampler=auto chose vllm, estimating 20 s of sampling; it took 255 (12.8x the "
                       "estimate; its speeds: ROLLOUT_SPEED)")
    assert estimate_check("k=auto", "chose hf, estimating", 20.0, 50.0, "s", "")[1] is None  # 2.5x: within 3x
    assert estimate_check("k=auto", "chose hf, estimating", None, 50.0, "s", "") is None
    monkeypatch.setenv("RLVR_ROLLOUT_CALIBRATION", str(tmp_path / "speeds.json"))
    assert calibration_factor("hf", False) == 1.0
    for ratio in (2.0, 10.0, 3.0):
        record_sampling_time("hf", False, 10.0, 10.0 * ratio)
    assert calibration_factor("hf", False) == 3.0 and calibration_factor("vllm", False) == 1.0
    for ratio in (4.0, 4.0, 5.0, 6.0):  # the last 5 count: 10, 3, 4, 4, 5, 6 -> 3, 4, 4, 5, 6
        record_sampling_time("hf", False, 10.0, 10.0 * ratio)
    assert calibration_factor("hf", False) == 4.0
    # issue 70: a time measured while other work kept the machine busy (load 2.5 per core) is not kept
    assert not record_sampling_time("hf", False, 10.0, 780.0, load_per_core=2.5)
    assert calibration_factor("hf", False) == 4.0
    assert record_sampling_time("hf", False, 10.0, 40.0, load_per_core=0.9) and calibration_factor("hf", False) == 4.0
    plan = RolloutPlan(steps=1, sequences=8, max_new_tokens=8, n_params=135_000_000)
    name, reason = choose_rollout_sampler("auto", plan)
    assert "calibrated by this machine's earlier runs: hf x4" in reason
    if SAMPLERS["vllm"].missing() is None:
        # transformers (and any plug-in sampler another test of this process registered, such as the toy one that
        # samples as transformers does) took 1000x its estimate here
        for other in [spec.name for spec in SAMPLERS.values() if spec.name != "vllm"]:
            for _ in range(5):
                record_sampling_time(other, False, 1.0, 1000.0)
        assert choose_rollout_sampler("auto", plan)[0] == "vllm"
    monkeypatch.setenv("RLVR_ROLLOUT_CALIBRATION", "off")
    assert calibration_factor("hf", False) == 1.0


def test_auto_rollout_sampler_weighs_engine_start_against_faster_sampling():
    """train.rollout.sampler=auto: the lower estimated sampling time, from the measured speeds in ROLLOUT_SPEED
    (per 100M parameters) and vLLM's start (none when this process's engine already serves the run), recomputed
    here from the constants; named samplers pass through; an unknown one is refused naming the key."""
    from core.sampling import ROLLOUT_SPEED, SAMPLERS, RolloutPlan, choose_rollout_sampler

    cpu = ROLLOUT_SPEED["cpu"]
    params = 135_000_000

    def by_hand(plan):
        scale = 1e8 / plan.n_params
        costs = {"hf": plan.tokens / (cpu["hf"] * scale)}
        if SAMPLERS["vllm"].missing() is None:
            costs["vllm"] = ((0 if plan.engine_ready else cpu["vllm_start_s"]) + plan.tokens / (cpu["vllm"] * scale)
                             + plan.steps * plan.n_params * 4 / 2e9)
        return min(costs, key=costs.get)

    one_step = RolloutPlan(steps=1, sequences=8, max_new_tokens=8, n_params=params)
    long_run = RolloutPlan(steps=200, sequences=32, max_new_tokens=256, n_params=params)
    ready = RolloutPlan(steps=4, sequences=32, max_new_tokens=48, n_params=params, engine_ready=True)
    for plan in (one_step, long_run, ready):
        name, reason = choose_rollout_sampler("auto", plan)
        assert name == by_hand(plan) and reason.startswith("auto: estimated sampling time") and "hf" in reason
    assert choose_rollout_sampler("auto", one_step)[0] == "hf"  # a start that a short run never earns back
    if SAMPLERS["vllm"].missing() is None:
        assert choose_rollout_sampler("auto", long_run)[0] == "vllm"
        assert choose_rollout_sampler("auto", ready)[0] == "vllm"
    assert choose_rollout_sampler("hf", long_run) == ("hf", "asked for")
    from orchestrator.checks.preflight import sweep_points
    from training.engines.local import validate

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "train.rollout.sampler=vlm"])
    with pytest.raises(ValueError, match="train.rollout.sampler"):
        validate(cfg)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "train.rollout.sampler=hf",
                               "train.rollout.correction=token_tis"])
    with pytest.raises(ValueError, match="train.rollout.correction=token_tis"):
        validate(cfg)


def test_the_cpu_engine_cache_is_sized_for_the_step_by_hand():
    """Issue 59: the vLLM CPU engine's key/value cache holds one generation call of the step (whole 128-position
    blocks, x 1.25), at least one sequence of the model's context plus a block, at most the 2 GiB it replaces; the
    README main job's shape on SmolLM2-135M (30 layers, 3 key/value heads of 64, float32: 46,080 bytes a position;
    32 sequences of 76 + 48 positions; context 8192): 32 x 1 block x 128 x 46,080 x 1.25 = 235,929,600 bytes, below
    the floor of 65 blocks x 128 x 46,080 = 383,385,600."""
    from core.sampling.vllm import CPU_KV_CACHE_BYTES, kv_cache_bytes

    per = 2 * 30 * 3 * 64 * 4
    assert per == 46_080
    assert kv_cache_bytes(per, 32, 76 + 48, 8192) == 65 * 128 * 46_080 == 383_385_600
    assert kv_cache_bytes(per, 64, 300, 8192) == int(1.25 * 64 * 3 * 128 * 46_080) == 1_415_577_600  # 3 blocks each
    assert kv_cache_bytes(per, 4096, 300, 8192) == CPU_KV_CACHE_BYTES  # capped at the old reserve
    assert kv_cache_bytes(per, 1, 10, 128 * 400) == 401 * 128 * 46_080 > CPU_KV_CACHE_BYTES  # vLLM's floor wins


def test_a_running_engine_serves_a_request_for_a_smaller_cache_or_any_when_unsized():
    """core.vllm_engine.serves: the same architecture, dtype and arguments, except the key/value cache, which may be
    larger than asked (a training run's sized engine serves a later, smaller need), or anything for a caller that
    did not size it (the evaluation); a larger request, or another argument, needs a new engine."""
    from types import SimpleNamespace

    from core import vllm_engine

    path = "tiny-model-id"  # a hub id: its key is the id
    engine = SimpleNamespace(llm=object(), model_path=path, dtype="float32",
                             kwargs={"enforce_eager": True, "kv_cache_memory_bytes": 1000})
    ok = lambda kw, **a: vllm_engine.serves(engine, path, "float32", kw, **a)  # noqa: E731
    assert ok({"enforce_eager": True, "kv_cache_memory_bytes": 1000})
    assert ok({"enforce_eager": True, "kv_cache_memory_bytes": 600})
    assert not ok({"enforce_eager": True, "kv_cache_memory_bytes": 1001})
    assert ok({"enforce_eager": True, "kv_cache_memory_bytes": 5000}, any_cache=True)
    assert not ok({"enforce_eager": False, "kv_cache_memory_bytes": 600})
    assert not vllm_engine.serves(engine, path, "bfloat16", {"enforce_eager": True, "kv_cache_memory_bytes": 600})
