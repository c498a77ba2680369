"""The memory plan: model shapes without downloads, parameter counts against the model cards, the plan of every
preset offline, pre-flight's refusal of a run that cannot fit, a step at quatro_main's batch shape under a fixed peak,
and the benchmark's own path."""
import json
import os
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO
from tests.prewarmed import python
from training.memory_plan import (
    ModelShape,
    RunShape,
    auto_budget,
    device_memory_gb,
    model_shape,
    plan_memory,
    shipped_shapes,
)

# total parameters from each model card (Hugging Face hub pages, read 2026-12-05); the plan computes them from the
# shipped shapes
CARDS = {"Qwen/Qwen2.5-Math-1.5B": 1.54e9, "Qwen/Qwen2.5-Math-7B": 7.61e9, "Qwen/Qwen2.5-Coder-1.5B": 1.54e9,
         "Qwen/Qwen2.5-3B": 3.09e9, "Qwen/Qwen2.5-3B-Instruct": 3.09e9, "Qwen/Qwen2.5-7B": 7.61e9,
         "Qwen/Qwen2.5-7B-Instruct": 7.61e9, "Qwen/Qwen2.5-7B-Instruct-1M": 7.61e9, "Qwen/Qwen3-0.6B": 0.6e9,
         "Qwen/Qwen3-4B-Instruct-2507": 4.0e9, "microsoft/Phi-3.5-mini-instruct": 3.82e9,
         "mistralai/Mistral-7B-Instruct-v0.3": 7.25e9, "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
         "HuggingFaceTB/SmolLM2-135M-Instruct": 0.135e9}


def test_shipped_shapes_give_the_model_cards_parameter_counts():
    assert set(CARDS) == set(shipped_shapes())
    for hub_id, total in CARDS.items():
        n = ModelShape(name=hub_id, **shipped_shapes()[hub_id]).n_params
        assert n == pytest.approx(total, rel=0.01), hub_id


def test_a_loaded_models_shape_and_parameter_count(tiny_cfg, tiny_policy):
    """Second method: the parameters of real models (the tiny one and SmolLM2's converted config) counted by torch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.models import model_path

    model = tiny_policy[0]
    assert model_shape(tiny_cfg.model).n_params == sum(p.numel() for p in model.parameters())
    [(_, cfg)] = __import__("orchestrator.checks.preflight", fromlist=["x"]).sweep_points(["model=smollm2-135m"], multirun=False)
    config = AutoConfig.from_pretrained(model_path(cfg.model))
    with __import__("torch").device("meta"):
        real = AutoModelForCausalLM.from_config(config)
    assert ModelShape.from_config(config).n_params == sum(p.numel() for p in real.parameters())
    assert model_shape(cfg.model) == ModelShape(name=str(cfg.model.name), **shipped_shapes()["HuggingFaceTB/SmolLM2-135M-Instruct"])


@pytest.mark.slow
def test_every_preset_is_planned_offline():
    """Every experiment preset has a plan on an 80 GiB GPU from the shipped shapes (the suite runs offline here:
    HF_HUB_OFFLINE=1, no hub cache of these models), and every paper preset's points are in the docs' table."""
    from orchestrator.checks.preflight import CONFIG_DIR, sweep_points
    from orchestrator.memory import paper_presets, preset_plan, presets_table
    from training.memory_plan import plan_for
    from training.settings import RunSettings

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    for path in sorted((CONFIG_DIR / "experiment").glob("*.yaml")):  # each preset's own settings (the twins too)
        (_, cfg) = sweep_points([f"experiment={path.stem}"])[0]  # the sweep's first point (composed once per worker)
        plan = plan_for(RunSettings.of(cfg, "cuda"), device_gb=80.0)
        assert plan.total_gb > plan.parts["weights"] > 0, path.stem
    main = preset_plan("quatro_main")
    assert main["params_b"] == pytest.approx(1.54, abs=0.01) and main["verdict"].startswith("fits as is")
    seven = preset_plan("exppo_main")  # a 7B model with float32 AdamW state: 16 bytes per parameter, 114 GiB
    assert seven["static_gb"] > 80 and "engine=verl engine.n_gpus_per_node=" in seven["verdict"]
    # LoRA (lora=on): the same 7B preset on one GPU, adapters' state only (no reference copy, gradients and AdamW
    # state of the adapters): a static part below the base's float32 weights plus a tenth of them
    lora = preset_plan("exppo_main", lora=True)
    assert lora["verdict"].startswith("fits as is") and 4 * 7.6e9 / 2**30 < lora["static_gb"] < 1.1 * 4 * 7.62e9 / 2**30
    table = presets_table()
    big = [n for n in paper_presets() if preset_plan(n)["params_b"] >= 6.5]  # each 7B/8B preset has a lora=on row
    assert len(big) == 6 and len(table.splitlines()) == len(paper_presets()) + len(big) + 2
    assert all(f"| `{n} lora=on` |" in table for n in big)
    # the docs show the current table
    assert table in (REPO / "docs" / "training.md").read_text(), "docs/training.md: run python -m orchestrator.memory"


def test_auto_budget_fits_and_a_bigger_one_does_not():
    shape = ModelShape("x", 28, 1536, 8960, 12, 2, 128, 151936, True, True, 4096)
    run = RunShape(minibatch_rows=2048, max_prompt_tokens=512, max_new_tokens=1024, kl=True, bf16=False,
                   checkpointing=False, rollout="vllm", gpu_share=0.3, prompts_per_step=256, group_size=8)
    budget = auto_budget(shape, run, "cuda", 80.0)
    assert budget % 64 == 0 and budget >= run.sequence_tokens
    assert plan_memory(shape, run, budget, "cuda", 80.0).fits
    assert not plan_memory(shape, run, budget + 4096, "cuda", 80.0).fits
    assert not plan_memory(shape, run, None, "cuda", 80.0).fits  # the whole minibatch in one pass: millions of tokens
    # the activations grow with the budget alone, not with the minibatch
    big = RunShape(**{**run.__dict__, "minibatch_rows": 8192})
    assert plan_memory(shape, big, budget, "cuda", 80.0).total_gb == pytest.approx(
        plan_memory(shape, run, budget, "cuda", 80.0).total_gb)


def test_cpu_memory_is_the_machines_whatever_runs_beside():
    """The CPU's size is the machine's RAM (MemTotal, or a lower cgroup limit), as a GPU's is its total: the same
    while other processes take memory. Reading what was available made a tiny model's budget one sequence per pass
    under two test workers' vLLM and verl processes, and the suite about three times longer on a CI machine."""
    def kib(field):
        for line in open("/proc/meminfo"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    gb = device_memory_gb("cpu")
    assert gb <= kib("MemTotal") + 1e-6 and gb > 0
    hold = b"\x01" * (512 * 2**20)  # half a GiB written meanwhile: MemAvailable falls, the size does not
    assert device_memory_gb("cpu") == gb
    del hold


@pytest.mark.slow
def test_quatro_main_on_a_24_gb_cpu_stops_at_preflight(tmp_path):
    """``python sweep.py -m experiment=quatro_main`` on a CPU of 24 GiB: one line with the plan's total and what
    would make it fit, exit 2, nothing started (no MLflow run, no sweep folder)."""
    t0 = time.time()
    proc = subprocess.run([*python(), str(REPO / "sweep.py"), "-m", "experiment=quatro_main", "train.device=cpu",
                           "train.device_memory_gb=24"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    elapsed = time.time() - t0
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1, proc.stderr[-3000:]
    assert "train.micro_batch_tokens: the run needs about" in err[0] and "would fit with" in err[0], err[0]
    assert "engine=verl" in err[0] or "80 GiB GPU" in err[0], err[0]
    assert not (tmp_path / "multirun").exists()
    print(f"pre-flight refused quatro_main in {elapsed:.1f} s")


@pytest.mark.slow
def test_a_step_at_quatro_mains_batch_shape_runs_under_a_fixed_peak(tmp_path):
    """256 prompts x 8 responses, the whole 2,048 in one minibatch (quatro_main's shape), on the tiny model with
    4-token responses and a budget of 4,096 positions per pass: the step trains in several passes, none over the
    budget (the transformers rollout's key/value cache included), and the process's peak stays within the plan's
    estimate for that budget (+25%)."""
    script = f"""
import json, resource, sys
sys.path.insert(0, {str(REPO)!r})
from omegaconf import OmegaConf
from orchestrator.checks.preflight import sweep_points
from training.engines import EngineChoices
from training.engines.local import train
from training.memory_plan import plan_for
from training.settings import RunSettings
[(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "algo=gspo", "train.prompts_per_step=256",
    "train.group_size=8", "train.minibatch_size=2048", "train.max_new_tokens=4", "train.steps=1",
    "train.micro_batch_tokens=4096", "train.rollout.sampler=hf", "train.device=cpu"], multirun=False)
logged, choices = [], EngineChoices()
train(cfg, {str(tmp_path / 'run')!r}, lambda m, s: logged.append(m), choices=choices)
print(json.dumps({{"peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "metrics": logged[-1],
                  "plan_gb": plan_for(RunSettings.of(cfg)).total_gb, "memory": choices.memory}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    m = out["metrics"]
    assert m["train/batch_responses"] == 2048
    assert m["train/micro_batches"] >= 2 and m["train/update_tokens"] <= 4096 * m["train/micro_batches"]
    assert out["memory"]["micro_batch_tokens"] == 4096
    assert out["peak_gb"] <= 1.25 * out["plan_gb"], out
    print({k: out[k] for k in ("peak_gb", "plan_gb")}, m["train/micro_batches"], m["train/padding_share"])


@pytest.mark.slow
def test_memory_benchmark_runs_its_configurations(tmp_path):
    """benchmarks/memory.py on the tiny model: every configuration measured in its own process beside the plan."""
    out = tmp_path / "mem.json"
    proc = subprocess.run([*python(), "-m", "benchmarks.memory", "--model", "tiny-random", "--responses", "8", "16",
                           "--budget", "160", "--response-tokens", "8", "--no-checkpointing-row", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["responses"], r["budget"]) for r in rows] == [(8, 160), (16, 160), (8, None)]
    for r in rows:
        assert "error" not in r and r["measured_gb"] > 0 and r["plan_gb"] > 0
        assert r["plan_vs_measured"] == pytest.approx(r["plan_gb"] / r["measured_gb"], rel=1e-2)
    assert rows[1]["micro_batches"] > rows[0]["micro_batches"] >= 1 and rows[2]["micro_batches"] == 1
    assert "plan within 25% of the measured peak" in proc.stdout


def test_memory_check_measures_the_largest_pass_at_start_up(tiny_cfg, tmp_path):
    """``train.memory_check=true`` (the default on a GPU): one forward and backward pass of the largest micro-batch the
    budget allows, measured before any rollout and written beside the plan (the run logs both); the run's layout,
    budget and longest prompt too; a budget below the longest sequence stops the run before it generates."""
    from training.engines import EngineChoices, local

    cfg = OmegaConf.merge(tiny_cfg, {"train": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                                               "micro_batch_tokens": 200, "memory_check": True}})
    choices = EngineChoices()
    local.train(cfg, tmp_path / "a", choices=choices)
    info = choices.memory  # the engine's record (the orchestrator logs it as the run's memory.json)
    assert info["micro_batch_tokens"] == 200 and info["layout"] in ("tree", "packed", "padded")
    assert info["calibration"]["measured_peak_gb"] > 0 and info["calibration"]["planned_peak_gb"] > 0
    assert 0 < info["longest_prompt"] < 200 and info["plan"]["budget_tokens"] == 200
    short = OmegaConf.merge(cfg, {"train": {"micro_batch_tokens": info["longest_prompt"] + 2}})
    with pytest.raises(ValueError, match=r"train.micro_batch_tokens=\d+: the longest training prompt \(\d+ tokens\)"):
        local.train(short, tmp_path / "b")


def test_declared_needs_are_read_before_any_function_is_fetched():
    """The plan reads a loss's declared needs (TR-GRPO's reference log-probs with its KL term) at pre-flight, before
    anything fetched the loss: the registry's folder scan must run first. Without it a fresh process planned
    trgrpo_sensitivity without its reference model (46.0 GiB instead of 57.5) and the docs' table said so, while
    the same call after another test had loaded the algorithms said 57.5."""
    code = ("from training.algorithms import need_param, needs_of; "
            "print(sorted(needs_of('policy_loss', 'tr_grpo', {'kl_beta': 0.001})), need_param('policy_loss', 'tr_grpo', "
            "'ref_logprobs'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["['ref_logprobs']", "kl_beta"], out.stderr[-2000:]


def test_overlapped_generation_plans_one_more_copy_of_the_weights_and_the_generation_beside_the_update():
    """train.rollout.overlap with staleness >= 1 holds the weights the step started from beside the trained ones (4
    bytes per parameter) and runs the generation during the update, so the generation's memory (transformers' cache and
    logits) is held beside the update's instead of in turn with it: hand computation from the plan without overlap; and
    nothing changes without staleness."""
    from orchestrator.checks.preflight import sweep_points
    from training.memory_plan import GIB, RunShape, model_shape, plan_memory
    from training.settings import RunSettings

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "train.rollout.sampler=hf"])
    shape = model_shape(cfg.model)
    plans = {}
    for k, overlap in ((1, False), (1, True), (0, True)):
        c = OmegaConf.merge(cfg, {"train": {"rollout": {"staleness": k, "overlap": overlap}}})
        plans[(k, overlap)] = plan_memory(shape, RunShape.of(RunSettings.of(c, "cpu")), None)
    apart, beside = plans[(1, False)], plans[(1, True)]
    moved = apart.parts["rollout_transient"]
    assert moved > 0 and beside.parts["rollout_transient"] == 0.0
    assert beside.parts["rollout_held"] - apart.parts["rollout_held"] == pytest.approx(4.0 * shape.n_params / GIB + moved)
    update = sum(apart.parts[k] for k in ("gradients", "activations", "output_head", "autocast_cache"))
    assert beside.total_gb - apart.total_gb == pytest.approx(4.0 * shape.n_params / GIB + moved + update
                                                            - max(update, moved))
    assert plans[(0, True)].parts == apart.parts


def test_overlap_on_a_gpu_adds_the_awake_engine_to_the_update_and_is_refused_where_the_sum_does_not_fit():
    """Issue 69's example: Qwen2.5-Math-1.5B with train.micro_batch_tokens=12288 on an 80 GB GPU, staleness 1: planned
    as its larger part (about 69 GiB) it fitted, while with overlap the vLLM engine's share (0.3 of the GPU, awake
    during the update) and the update run together: the plan is their sum and pre-flight refuses it."""
    from orchestrator.checks.preflight import sweep_points
    from training.memory_plan import plan_for, refusal
    from training.settings import RunSettings

    line = ["model=qwen2.5-math-1.5b", "eval=smoke", "train.micro_batch_tokens=12288", "train.rollout.sampler=vllm",
            "train.rollout.staleness=1", "train.device_memory_gb=80"]
    plans = {}
    for overlap in (False, True):
        [(_, cfg)] = sweep_points([*line, f"train.rollout.overlap={str(overlap).lower()}"])
        plans[overlap] = plan_for(RunSettings.of(cfg, "cuda"), detect=False)
    apart, beside = plans[False], plans[True]
    update = sum(apart.parts[k] for k in ("gradients", "activations", "output_head", "autocast_cache"))
    engine = apart.parts["rollout_transient"]
    assert engine == pytest.approx(0.3 * 80) and refusal(apart) is None
    assert beside.total_gb == pytest.approx(apart.total_gb - max(update, engine) + update + engine
                                            + beside.parts["rollout_held"] - apart.parts["rollout_held"] - engine)
    assert beside.total_gb > 0.9 * 80 and refusal(beside) is not None


def test_the_plan_counts_only_the_rollout_engine_the_run_chooses(monkeypatch):
    """``train.rollout.sampler=auto`` on a CPU: pre-flight's plan resolves the choice as the run will
    (:func:`training.engines.local.local_checks.rollout_choice`) and counts that engine only: where transformers is
    chosen, no vLLM copy of the weights and cache is held (the unresolved plan held the larger of the two), and the
    generation's cache and logits are the rollout's transients instead; where vLLM is chosen, the plan is the vLLM
    one."""
    import core.sampling as sampling
    from orchestrator.checks.preflight import sweep_points
    from training.engines.local import local_checks
    from training.memory_plan import plan_for
    from training.settings import RunSettings

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "train.rollout.sampler=auto", "train.device=cpu"])
    s = RunSettings.of(cfg, "cpu")
    unresolved = plan_for(s, detect=False)
    for name in ("hf", "vllm"):
        monkeypatch.setattr(sampling, "choose_rollout_sampler", lambda asked, plan, name=name: (name, "as asked"))
        chosen, _ = local_checks.plan(s, remote=True)
        assert chosen.parts == plan_for(s, detect=False, rollout=name).parts
        if name == "hf":
            assert chosen.parts["rollout_held"] == 0.0 < unresolved.parts["rollout_held"]
            assert chosen.parts["rollout_transient"] > 0.0 == unresolved.parts["rollout_transient"]
        else:
            assert chosen.parts == unresolved.parts
