"""Which floating-point precision a device computes natively, and the precision a run uses (``auto``).

bfloat16 halves a model's activations and doubles a matrix unit's throughput where the hardware has bf16 arithmetic:
a GPU of compute capability 8.0 or later (A100, H100, RTX 30xx/40xx), a CPU with AMX-BF16 (Intel Sapphire Rapids and
later) or AVX512-BF16 (Cooper Lake, AMD Zen 4), an ARM CPU with the BF16 extension. Elsewhere PyTorch emulates it, and
runs it tens to hundreds of times slower than float32 (a measurement on an AMD EPYC with AVX2 only is on
docs/performance.md). So ``auto`` (the
default of ``train.precision``, ``train.rollout.dtype`` and ``eval.dtype``) is bf16 where the device computes it
natively and float32 elsewhere, and an explicit bf16 on a device that only emulates it is refused at pre-flight
(:func:`refusal`), with the slowdown a sub-second probe measured (:func:`probe_slowdown`).

The CPU's flags are read from ``/proc/cpuinfo`` (Linux; elsewhere none are known, and ``auto`` is float32);
``RLVR_CPU_FLAGS`` (space-separated) replaces them, to see what another CPU would get (the tests fake both kinds).
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch

#: CPU flags (Linux ``/proc/cpuinfo`` names) of native bf16 arithmetic: Intel AMX, AVX-512 BF16, ARM's BF16 extension
NATIVE_CPU_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
#: the first GPU generation with bf16 tensor cores (Ampere)
NATIVE_GPU_CAPABILITY = (8, 0)
FLAGS_ENV = "RLVR_CPU_FLAGS"
PRECISIONS = ("auto", "fp32", "bf16")


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> tuple[str, frozenset]:
    name, flags = "CPU", frozenset()
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and name == "CPU":
            name = value.strip()
        elif key in ("flags", "features") and not flags:  # x86 and ARM spell it differently
            flags = frozenset(value.split())
    return name, flags


def cpu_flags() -> frozenset:
    """This CPU's feature flags (``RLVR_CPU_FLAGS`` when set; empty where they cannot be read)."""
    faked = os.environ.get(FLAGS_ENV)
    return frozenset(faked.split()) if faked is not None else _cpuinfo()[1]


def cpu_name() -> str:
    """This CPU's model name (``/proc/cpuinfo``), or ``CPU``."""
    return _cpuinfo()[0]


def native_bf16(device: str) -> tuple[bool, str]:
    """(whether ``device`` (``cpu`` or ``cuda``) computes bfloat16 natively, why): a GPU's compute capability
    (>= 8.0; this machine's first GPU, or assumed when none is visible here, as for a cluster node seen from its login
    node), a CPU's flags (:data:`NATIVE_CPU_FLAGS`)."""
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            return True, "a GPU of compute capability >= 8.0 assumed (none visible here)"
        major, minor = torch.cuda.get_device_capability()
        ok = (major, minor) >= NATIVE_GPU_CAPABILITY
        return ok, (f"{torch.cuda.get_device_name()}: compute capability {major}.{minor} "
                    f"({'>=' if ok else '<'} 8.0{'' if ok else ': no bf16 units'})")
    found = sorted(cpu_flags() & set(NATIVE_CPU_FLAGS))
    if found:
        return True, f"{cpu_name()}: bf16 units ({', '.join(found)})"
    return False, f"{cpu_name()}: no bf16 units (no amx_bf16, avx512_bf16 or bf16 flag)"


@dataclass(frozen=True)
class Choice:
    """A run's precision (``fp32`` or ``bf16``) and why (tagged on the run: ``rlvr.precision``,
    ``rlvr.precision_reason``)."""

    precision: str
    reason: str

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    @property
    def dtype(self) -> str:
        """The dtype's name for vLLM and ``core.models.DTYPES``: ``bfloat16`` or ``float32``."""
        return "bfloat16" if self.bf16 else "float32"


def choose(setting: str, device: str) -> Choice:
    """The precision ``setting`` (``auto``, ``fp32``, ``bf16``; as dtype names ``float32``, ``bfloat16`` too) means
    on ``device``: ``auto`` is bf16 where :func:`native_bf16`, else fp32.

    Raises:
        ValueError: an unknown setting.
    """
    setting = {"float32": "fp32", "bfloat16": "bf16"}.get(str(setting), str(setting))
    if setting not in PRECISIONS:
        raise ValueError(f"precision {setting!r}: expected one of {list(PRECISIONS)}")
    if setting != "auto":
        return Choice(setting, f"set to {setting}")
    native, why = native_bf16(device)
    return Choice("bf16" if native else "fp32", f"auto: {why}")


@functools.lru_cache(maxsize=None)
def probe_slowdown(device: str = "cpu", n: int = 256, rounds: int = 7, min_s: float = 0.01,
                   budget_s: float = 3.0) -> float:
    """How many times the time of a float32 matrix product a bfloat16 one takes on ``device``: (n, n) @ (n, n), both
    dtypes warmed up first (the first product of a dtype builds its kernels), then ``rounds`` interleaved rounds, each
    timing a batch of products of each dtype lasting at least ``min_s`` seconds; the median of the rounds' ratios
    (> 1: bf16 is slower). Stops after the round that passes ``budget_s`` seconds (an emulated bf16 is slow; at least
    3 rounds). Stable to within a few percent on a quiet machine (``benchmarks/precision_probe.py``); the single
    best-of-repeats it replaced read 0.01x-0.50x on one machine."""
    dev = torch.device("cuda" if str(device).startswith("cuda") else "cpu")
    mats = {dt: (torch.randn(n, n, device=dev).to(dt), torch.randn(n, n, device=dev).to(dt))
            for dt in (torch.float32, torch.bfloat16)}

    def timed(dt, reps):
        return _time_products(*mats[dt], reps, dev.type == "cuda")

    for dt in mats:  # warm-up
        timed(dt, 2)
    reps = {}
    for dt in mats:  # a batch long enough to time (min_s), from one product's time
        one = max(timed(dt, 1), 1e-7)
        reps[dt] = max(1, min(1000, int(min_s / one) + 1))
    ratios, t_end = [], time.perf_counter() + budget_s
    for i in range(rounds):
        t32 = timed(torch.float32, reps[torch.float32]) / reps[torch.float32]
        t16 = timed(torch.bfloat16, reps[torch.bfloat16]) / reps[torch.bfloat16]
        ratios.append(t16 / max(t32, 1e-12))
        if i >= 2 and time.perf_counter() > t_end:
            break
    ratios.sort()
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def _time_products(a: torch.Tensor, b: torch.Tensor, reps: int, cuda: bool) -> float:
    """Seconds for ``reps`` products ``a @ b``."""
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def phrase(ratio: float) -> str:
    """``ratio`` (:func:`probe_slowdown`) said without ambiguity: ``bf16 matrix products took 0.45x the time of
    float32's (2.2x faster)``."""
    def fmt(x):
        return f"{x:.0f}" if x >= 10 else f"{x:.2g}" if x < 1 else f"{x:.1f}"
    how = (f"{fmt(1 / ratio)}x faster" if ratio < 0.95 else f"{fmt(ratio)}x slower" if ratio > 1.05
           else "about as fast")
    return f"bf16 matrix products took {fmt(ratio)}x the time of float32's ({how})"


def refusal(key: str, setting: str, device: str) -> str | None:
    """The one-line refusal of an explicit bf16 (``setting`` of config key ``key``) on a ``device`` that only emulates
    it, with the slowdown :func:`probe_slowdown` measured here and the setting to use instead; None when it is fine."""
    if str(setting) not in ("bf16", "bfloat16"):
        return None
    native, why = native_bf16(device)
    if native:
        return None
    return (f"{key}={setting}: {why}, so bfloat16 is emulated here (a probe just now: {phrase(probe_slowdown(device))}); "
            f"set {key}=auto (float32 on this machine)")
