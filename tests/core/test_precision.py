"""Precision by capability (issue 48, part 1): ``auto`` is bf16 where the device computes it natively and float32
elsewhere, tagged with its reason; an explicit bf16 on a CPU that only emulates it is refused at pre-flight. Both kinds
of CPU are covered on either machine by faking the flags (``RLVR_CPU_FLAGS``; tests/conftest.py fakes a CPU without
bf16 units for every test)."""
import os
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from core import precision
from core.models import resolve_dtype
from tests.conftest import REPO
from tests.prewarmed import python

AMX = "fpu sse2 avx2 avx512f amx_tile amx_bf16 avx512_bf16"  # an Intel Sapphire Rapids' flags (those that matter)
AVX2 = "fpu sse2 avx avx2 fma"                               # an AMD EPYC (Zen 2/3): no bf16 units


def test_auto_is_bf16_exactly_where_the_cpu_or_gpu_computes_it_natively(monkeypatch):
    monkeypatch.setenv("RLVR_CPU_FLAGS", AMX)
    c = precision.choose("auto", "cpu")
    assert c.precision == "bf16" and c.dtype == "bfloat16" and "amx_bf16, avx512_bf16" in c.reason
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    monkeypatch.setenv("RLVR_CPU_FLAGS", "fp asimd bf16")  # an ARM CPU with the BF16 extension
    assert precision.choose("auto", "cpu").bf16
    monkeypatch.setenv("RLVR_CPU_FLAGS", AVX2)
    c = precision.choose("auto", "cpu")
    assert c.precision == "fp32" and c.reason.startswith("auto: ") and "no bf16 units" in c.reason
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert precision.choose("bf16", "cpu").bf16 and precision.choose("fp32", "cpu").reason == "set to fp32"
    assert precision.choose("bfloat16", "cpu").bf16  # dtype names read alike
    with pytest.raises(ValueError, match="precision 'fp8'"):
        precision.choose("fp8", "cpu")
    # GPUs by compute capability: a V100 (7.0) and a T4 (7.5) emulate bf16, an A100 (8.0) has it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100")
    for cc, want in (((7, 0), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, cc=cc: cc)
        c = precision.choose("auto", "cuda")
        assert c.precision == want and f"compute capability {cc[0]}.{cc[1]}" in c.reason
    assert resolve_dtype("auto", "cuda") == torch.bfloat16


def test_the_probe_measures_both_products_and_the_refusal_names_key_slowdown_and_fix(monkeypatch):
    ratio = precision.probe_slowdown("cpu")
    assert ratio > 0
    monkeypatch.setenv("RLVR_CPU_FLAGS", AVX2)
    line = precision.refusal("train.precision", "bf16", "cpu")
    assert line.startswith("train.precision=bf16: ") and "no bf16 units" in line and "the time of float32's" in line
    assert line.endswith("set train.precision=auto (float32 on this machine)") and "\n" not in line
    assert precision.refusal("eval.dtype", "bfloat16", "cpu").startswith("eval.dtype=bfloat16: ")
    for ok in ("auto", "fp32", "float32", "float16"):
        assert precision.refusal("train.precision", ok, "cpu") is None
    monkeypatch.setenv("RLVR_CPU_FLAGS", AMX)
    assert precision.refusal("train.precision", "bf16", "cpu") is None


@pytest.mark.slow
def test_preflight_refuses_an_explicit_bf16_on_a_cpu_without_bf16_units_in_seconds(tmp_path):
    """Through the sweep command: exit 2, one line, before any work (no store, no run folder). How long it takes is
    measured, not asserted (about 5 s on 2 idle cores: the command's start-up; the probe is under a second)."""
    env = dict(os.environ, RLVR_CPU_FLAGS=AVX2)
    p = subprocess.run([*python(), str(REPO / "sweep.py"), "-m", "model=tiny-random", "eval=smoke",
                        "train.steps=1", "train.precision=bf16"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    [line] = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: train.precision=bf16: ") and "the time of float32's" in line
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "outputs").exists()


def test_preflight_checks_every_precision_key_and_leaves_remote_points_to_their_node(monkeypatch):
    from orchestrator.checks.preflight import check_precision, sweep_points
    from orchestrator.errors import ConfigError

    monkeypatch.setenv("RLVR_CPU_FLAGS", AVX2)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke"], multirun=False)
    check_precision(cfg)  # auto everywhere: fine
    for key, value in (("train.precision", "bf16"), ("train.rollout.dtype", "bfloat16"), ("eval.dtype", "bfloat16")):
        bad = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
        with pytest.raises(ConfigError, match=f"^{key}={value}: "):
            check_precision(bad)
        check_precision(bad, remote=True)  # a cluster node's device is not known here
    monkeypatch.setenv("RLVR_CPU_FLAGS", AMX)
    check_precision(OmegaConf.merge(cfg, {"train": {"precision": "bf16"}}))


@pytest.mark.slow
@pytest.mark.parametrize("flags,want", [(AVX2, "fp32"), (AMX, "bf16")])
def test_auto_trains_in_the_precision_the_cpu_computes_and_says_why(monkeypatch, tmp_path, flags, want):
    """One step of the tiny model with train.precision=auto: the update runs bf16 autocast exactly on the CPU with
    bf16 units; the engine's record (tagged on the run by the orchestrator) holds the choice and its reason."""
    from orchestrator.checks.preflight import sweep_points
    from training.engines import EngineChoices, local
    from training.engines.local import local_step

    monkeypatch.setenv("RLVR_CPU_FLAGS", flags)
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", "train.rollout.sampler=hf"], multirun=False)
    assert cfg.train.precision == "auto"
    cfg = OmegaConf.merge(cfg, {"train": {"steps": 1, "prompts_per_step": 1, "group_size": 2, "max_new_tokens": 4}})
    seen = []
    real = local_step.update_policy
    monkeypatch.setattr(local_step, "update_policy", lambda *a, **k: seen.append(a[5].bf16) or real(*a, **k))
    choices = EngineChoices()
    local.train(cfg, tmp_path, choices=choices)
    info = choices.precision
    assert seen == [want == "bf16"] and info.precision == want
    assert info.rollout_dtype == ("bfloat16" if want == "bf16" else "float32")
    assert ("no bf16 units" in info.reason) == (want == "fp32") and info.reason.startswith("auto: ")


def test_the_evaluate_command_refuses_an_explicit_bf16_on_a_cpu_without_bf16_units(monkeypatch, capsys, tmp_path):
    from orchestrator.evaluate import main

    monkeypatch.setenv("RLVR_CPU_FLAGS", AVX2)
    assert main(["--checkpoint", str(tmp_path), "--eval", "smoke", "dtype=bfloat16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: eval.dtype=bfloat16: ") and "\n" not in err and "the time of float32's" in err


def test_the_probe_figure_is_phrased_without_ambiguity():
    """Issue 56: "0.01x float32's" could not be read as faster or slower; the phrase says both ways."""
    assert precision.phrase(0.45) == "bf16 matrix products took 0.45x the time of float32's (2.2x faster)"
    assert precision.phrase(87.4) == "bf16 matrix products took 87x the time of float32's (87x slower)"
    assert precision.phrase(2.5) == "bf16 matrix products took 2.5x the time of float32's (2.5x slower)"
    assert precision.phrase(1.02).endswith("(about as fast)")


def test_the_probe_takes_the_median_of_interleaved_rounds(monkeypatch):
    """A round disturbed by other work (one bf16 batch 100x slower) does not move the figure: the rounds alternate
    float32 and bf16 after a warm-up of each, and the figure is the median of their ratios."""
    order, bf16_rounds = [], iter([0.5, 0.5, 50.0, 0.5, 0.5, 0.5, 0.5])

    def fake(a, b, reps, cuda):
        order.append(a.dtype)
        if len(order) <= 4:  # warm-up and sizing: two calls per dtype
            return 0.001 * reps
        return 1.0 * reps if a.dtype == torch.float32 else next(bf16_rounds) * reps

    monkeypatch.setattr(precision, "_time_products", fake)
    precision.probe_slowdown.cache_clear()
    try:
        ratio = precision.probe_slowdown("cpu", n=8, rounds=7, budget_s=1e9)
    finally:
        precision.probe_slowdown.cache_clear()
    assert ratio == pytest.approx(0.5)
    assert order[4:] == [torch.float32, torch.bfloat16] * 7
