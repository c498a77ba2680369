"""The local engine's memory and precision options: chunked log-probs, bf16 with exact first-minibatch ratios,
gradient checkpointing, peak memory and phase-time metrics, and the GPU check script's CPU path."""
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from core.scoring import Sequences, compute_logprobs
from tests.conftest import REPO
from tests.prewarmed import python
from training.engines import local
from training.engines.local import local_generation
from training.settings import OldLogprobs
from training.update import UpdateControl, UpdateSettings, update_policy


def _cfg(tiny_cfg, **train):
    return OmegaConf.merge(tiny_cfg, {"algo": {"kl_beta": 0.0}, "train": {
        "steps": 2, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12, "minibatch_size": 4, "lr": 1e-3,
        **train}})


def test_chunked_head_gives_the_one_call_log_probs_entropies_and_gradients(tiny_policy):
    model, tok = tiny_policy
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 200, (3, 4), generator=g)
    resp = torch.randint(5, 200, (3, 7), generator=g)
    pmask, rmask = torch.ones_like(prompt), torch.ones_like(resp)
    pmask[0, :2] = 0  # left padding
    rmask[1, 5:] = 0
    outs = {}
    for chunk in (None, 3):
        model.zero_grad()
        lp, ent = compute_logprobs(model, Sequences(prompt, pmask, resp, rmask), 0.7, with_entropy=True, chunk_tokens=chunk)
        ((lp * rmask).sum() + (ent * rmask).sum()).backward()
        outs[chunk] = (lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()])
    (lp1, e1, g1), (lp2, e2, g2) = outs[None], outs[3]
    m = rmask.bool()  # the chunked head scores the kept positions only (the others hold zeros)
    assert torch.allclose(lp1[m], lp2[m], atol=1e-5) and torch.allclose(e1[m], e2[m], atol=1e-5)
    for a, b in zip(g1, g2):  # float32 sums in another order: equal to ~1e-6 of each gradient's norm
        assert (a - b).norm() <= 1e-5 * a.norm() + 1e-9
    model.zero_grad()


@pytest.mark.slow
def test_bf16_first_minibatch_ratio_is_exactly_one_and_tracks_fp32(tiny_cfg, tmp_path):
    runs = {}
    for precision in ("fp32", "bf16"):
        logged = []
        local.train(_cfg(tiny_cfg, precision=precision), tmp_path / precision, lambda m, s: logged.append(m))
        runs[precision] = logged
    assert [m["train/first_minibatch_ratio_dev"] for m in runs["bf16"]] == [0.0, 0.0]
    assert all(m["train/first_minibatch_ratio_dev"] < 1e-5 for m in runs["fp32"])
    for a, b in zip(runs["fp32"], runs["bf16"]):  # the documented tolerance (docs/training.md): 2% on entropy over two steps
        assert b["train/entropy"] == pytest.approx(a["train/entropy"], rel=0.02)
    for m in runs["bf16"]:
        for key in ("train/peak_memory_gb", "train/samples_per_s", "train/generate_time_s", "train/reward_time_s",
                    "train/logprob_time_s", "train/update_time_s"):
            assert m[key] > 0, key


@pytest.mark.slow
def test_gradient_checkpointing_changes_memory_not_results(tiny_cfg, tmp_path):
    runs = {}
    for ckpt in (False, True):
        logged = []
        local.train(_cfg(tiny_cfg, gradient_checkpointing=ckpt), tmp_path / str(ckpt), lambda m, s: logged.append(m))
        runs[ckpt] = logged
    for a, b in zip(runs[False], runs[True]):
        for key in ("train/entropy", "train/grad_norm", "train/loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key


def test_preflight_refuses_gradient_checkpointing_on_a_model_without_it(tiny_cfg, monkeypatch):
    from transformers import LlamaForCausalLM

    from orchestrator import ConfigError
    from orchestrator.checks.validate import validate_config

    cfg = OmegaConf.merge(tiny_cfg, {"train": {"gradient_checkpointing": True}})
    validate_config(cfg)
    monkeypatch.setattr(LlamaForCausalLM, "supports_gradient_checkpointing", False)
    with pytest.raises(ConfigError, match=r"train.gradient_checkpointing=true: model 'tiny-random' \(LlamaForCausalLM\)"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=r"^train.precision='fp8': expected one of \['auto', 'fp32', 'bf16'\]"):
        validate_config(OmegaConf.merge(tiny_cfg, {"train": {"precision": "fp8"}}))


@pytest.mark.slow
def test_gpu_train_check_script_runs_its_path_on_the_cpu(tmp_path):
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_train.py"), "--device", "cpu", "--hidden",
                           "128", "--layers", "2", "--prompts", "4", "--tokens", "16", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "gpu_check_train: OK" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert '"first_minibatch_ratio_dev": [0.0, 0.0]' in proc.stdout


@pytest.mark.slow
def test_gpu_async_check_script_runs_its_path_on_the_cpu(tmp_path):
    """scripts/gpu_check_async.py (stale rollouts, emulated and overlapped, for a lent GPU) on the CPU with a small
    model: its checks pass (the overlapped run draws the emulated run's samples) and the float32 CPU path gives the
    same loss and gradient-norm series to float tolerance (the update runs beside the generation thread: a CI run's
    grad norms differed by 6e-10)."""
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_async.py"), "--device", "cpu", "--hidden",
                           "128", "--layers", "2", "--prompts", "2", "--tokens", "8", "--steps", "3", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "gpu_check_async: OK" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    import json

    report = json.loads(proc.stdout.split("gpu_check_async: ", 1)[1].splitlines()[0])
    diffs = report["overlapped_vs_emulated_max_abs_diff"]
    assert diffs and all(v < 1e-5 for v in diffs.values()), diffs


@pytest.mark.slow
def test_train_step_benchmark_runs_both_engines_on_the_same_prompts(tmp_path, tiny_cfg):
    """benchmarks/train_step.py on the tiny model (2 steps, 8 tokens): both engines step in turn, each reports
    the split and its own peak memory, with and without LoRA (--lora: the local engine's adapters beside TRL's peft); and TRL's dataset is exactly the prompt sequence the local engine draws."""
    pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[bench]')")
    import json

    from core.sampling import SAMPLERS

    rollout = "vllm" if SAMPLERS["vllm"].missing() is None else "hf"  # vLLM's rollouts where installed (CI: yes)
    out = tmp_path / "bench.json"
    proc = subprocess.run([*python(), "-m", "benchmarks.train_step", "--model", "tiny-random", "--steps", "2",
                           "--max-new-tokens", "8", "--rollout", rollout, "--packing", "tree", "--lora", "4",
                           "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local_name, trl_name = f"local, {rollout} rollouts, packing tree", "TRL GRPOTrainer (beside packing tree)"
    assert f"{local_name} / TRL: step time" in proc.stdout
    res = json.loads(out.read_text())
    for name in (local_name, trl_name):
        s = res["summary"][name]
        assert s["total"] > 0 and s["peak_rss_gb"] > 0 and s["steps_timed"] == 1
        assert s["generate"] + s["scoring"] + s["forward"] + s["weight_sync"] <= s["total"] * 1.05
    s, r = res["summary"][local_name], res["ratios"][local_name]
    assert 0 <= s["padding_share"] < 0.5  # the tree layout: only the rows' tails are padding
    assert s["rollout_tokens_per_s"] > 0 and r["step_vs_trl"] == pytest.approx(s["total"] / res["summary"][trl_name]["total"])
    if rollout == "vllm":  # the same engine's raw LLM.generate, and the weight sync's share of the step
        assert s["raw_vllm_tokens_per_s"] > 0 and s["weight_sync"] > 0 and s["rollout_call_tokens_per_s"] > 0
        # issue 59: raw vLLM on each step's own requests right after them (the same samples), step by step
        assert r["rollout_vs_raw_vllm"] == pytest.approx(s["rollout_vs_raw_same_work"]) and r["rollout_vs_raw_vllm"] > 0
        assert r["raw_vllm_vs_plain"] > 0
        assert r["sync_share_of_step"] == pytest.approx(s["weight_sync"] / s["total"])
    # LoRA beside TRL's peft LoRA: the same adapters (rank 4 on every linear layer) counted by two trainers, a small
    # share of what full fine-tuning trains; the ratios against full fine-tuning from the same run
    lora, trl_lora = f"local LoRA r4, {rollout} rollouts", "TRL GRPOTrainer + peft LoRA r4"
    assert res["summary"][lora]["trainable_params"] == res["summary"][trl_lora]["trainable_params"] > 0
    assert res["summary"][lora]["trainable_params"] < 0.05 * res["summary"][local_name]["trainable_params"]
    assert res["summary"][trl_name]["trainable_params"] == res["summary"][local_name]["trainable_params"]
    assert res["ratios"][lora]["step_vs_full"] == pytest.approx(res["summary"][lora]["total"] / s["total"])
    assert f"{lora} / TRL: step time" in proc.stdout and "against full fine-tuning" in proc.stdout
    # the prompts: the local engine's draw order, reproduced for TRL
    from benchmarks.train_step import _compose, prompt_sequence
    from training.engines import local

    class A:
        model, steps, max_new_tokens, local_overrides = "tiny-random", 2, 8, []
    cfg = _compose(A)
    seen = []
    real = local_generation.collect_rollouts

    def spy(model, tok, rows, *a, **k):
        seen.extend(r["prompt"] for r in rows)
        return real(model, tok, rows, *a, **k)
    local_generation.collect_rollouts = spy
    try:
        local.train(cfg, tmp_path / "run")
    finally:
        local_generation.collect_rollouts = real
    assert seen == [r["prompt"] for r in prompt_sequence(cfg)]


@pytest.mark.parametrize("epochs,minibatch", [(1, 4), (2, 3), (1, None)])
def test_deferred_old_log_probs_equal_the_rollout_pass(tiny_policy, epochs, minibatch):
    """On the DEFERRED path the rollout scores nothing and the update fills the old log-probs and entropies,
    minibatch by minibatch, the first from its own forward pass. Second method: the eager rollout pass over the
    same samples (same seed). Old log-probs and entropies agree to float rounding, every row is filled, the
    first minibatch's ratio is exactly 1, and the updated weights agree with the eager run's."""
    import copy

    from training.algorithms import BoundLoss, get_advantage_fn
    from training.collect import RolloutRequest, collect_rollouts

    base, tok = tiny_policy
    rows = [{"id": "a", "prompt": "Compute 3 + 4.", "gold": "7", "task": "arithmetic"},
            {"id": "b", "prompt": "Compute 1 + 1.", "gold": "2", "task": "arithmetic"}]
    out = {}
    for deferred in (False, True):
        model = copy.deepcopy(base).train()
        batch, _ = collect_rollouts(model, tok, rows, RolloutRequest(4, 1.0, 1.0, 6, seed=11, old_logprobs=not deferred))
        assert torch.isnan(batch.old_logprobs).all() == deferred
        eager = batch.old_logprobs.clone(), batch.entropy.clone()
        adv, _ = get_advantage_fn("grpo")(batch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        path = OldLogprobs.DEFERRED if deferred else OldLogprobs.KEPT
        ms = update_policy(model, opt, batch, adv, BoundLoss.named("grpo"),
                           UpdateSettings(ppo_epochs=epochs, minibatch_size=minibatch, old_logprobs=path),
                           control=UpdateControl(torch.Generator().manual_seed(3)))
        out[deferred] = (batch, eager, ms, [p.detach().clone() for p in model.parameters()])
    (b0, (old0, ent0), ms0, w0), (b1, _, ms1, w1) = out[False], out[True]
    m = b0.response_mask.bool()
    assert not torch.isnan(b1.old_logprobs[m]).any() and not torch.isnan(b1.entropy[m]).any()
    assert torch.allclose(b1.old_logprobs[m], old0[m], atol=1e-5)
    assert torch.allclose(b1.entropy[m], ent0[m], atol=1e-5)
    assert ms1[0]["first_minibatch_ratio_dev"] == 0.0
    assert [x["loss"] for x in ms1] == pytest.approx([x["loss"] for x in ms0], rel=1e-4, abs=1e-6)
    for a, b in zip(w0, w1):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_gpu_scale_check_script_runs_its_path_on_the_cpu():
    """scripts/gpu_check_scale.py (quatro_main's batch shape on a 1.5B-shaped model, for a lent GPU) on the CPU with
    a small model: one update in several passes, none over the auto budget, the weights changed, the plan printed."""
    import json

    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_scale.py"), "--device", "cpu", "--hidden",
                           "64", "--layers", "2", "--vocab", "1000", "--prompts", "8", "--prompt-tokens", "16",
                           "--response-tokens", "16", "--precision", "fp32"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "gpu_check_scale: OK" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("gpu_check_scale: {"))
    report = json.loads(line.split(": ", 1)[1])
    assert report["responses"] == 64 and report["micro_batches"] >= 1 and report["plan_gb"] > 0
    assert report["layout"] == "tree"


def test_a_dapo_step_that_keeps_no_group_says_so_and_leaves_the_weights(tmp_path, caplog):
    """Issue 46: a DAPO step whose dynamic sampling keeps nothing made no update and only PyTorch's scheduler warning
    said so. The tiny random model never answers an arithmetic prompt right, so every group has reward 0 throughout
    and none is kept: the step logs one warning naming itself, ``updated`` is 0, the weights do not move, and
    PyTorch's warning is not shown."""
    import logging
    import warnings

    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=dapo", "train.steps=1", "train.prompts_per_step=2",
                               "train.group_size=2", "train.max_new_tokens=4", "train.minibatch_size=null",
                               "algo.dynamic_sampling.max_num_gen_batches=1", "train.rollout.sampler=hf"])
    logged = []
    with caplog.at_level(logging.WARNING, logger="rlvr"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = local.train(cfg, tmp_path / "run", lambda m, s: logged.append(m))
    assert [m["train/updated"] for m in logged if "train/updated" in m] == [0.0]
    assert logged[0]["train/accuracy"] == 0.0  # every group all wrong: none has mixed rewards
    assert any("step 0: dynamic sampling kept no group with mixed rewards in 1 generation round(s)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]
    from core.models import load_checkpoint, load_policy

    start, _ = load_policy(cfg.model)
    after, _ = load_checkpoint(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), after.state_dict().values()))


@pytest.mark.slow
def test_gpu_rollout_check_script_runs_its_path_on_the_cpu(tmp_path):
    """scripts/gpu_check_rollout.py (benchmarks.sampling --breakdown on a 1.5B-shaped model, for a GPU with vLLM) on
    vLLM's CPU build with a small model: the rows that make the suite's requests draw the same samples, and the
    breakdown's table and ratio come out."""
    from core.sampling import SAMPLERS

    if SAMPLERS["vllm"].missing() is not None:
        pytest.skip("vLLM is not installed (scripts/install.sh installs its CPU build)")
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_rollout.py"), "--hidden", "128", "--layers",
                           "2", "--prompts", "4", "--n", "2", "--max-new-tokens", "8", "--repeats", "1", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0 and "gpu_check_rollout: OK" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "the suite's rollout / raw vLLM on the same requests: " in proc.stdout
