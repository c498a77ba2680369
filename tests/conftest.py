import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = (REPO.parent / "shared").resolve()
BENCHMARK_DIR = SHARED / "data" / "benchmarks"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if Path("/tmp/rlvr-slurm/etc/slurm.conf").exists():  # the cluster of scripts/slurm/start.sh
    os.environ.setdefault("SLURM_CONF", "/tmp/rlvr-slurm/etc/slurm.conf")


def require_benchmarks():
    if not BENCHMARK_DIR.is_dir():
        pytest.skip(f"benchmark files not found at {BENCHMARK_DIR} (the shared/ folder beside the repo)")
    return BENCHMARK_DIR


@pytest.fixture(scope="session")
def benchmark_dir():
    return require_benchmarks()


@pytest.fixture(scope="session")
def tiny_cfg():
    """The composed default config with the tiny random model and smoke evaluation."""
    from orchestrator.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke"])
    return cfg


@pytest.fixture(scope="session")
def tiny_policy(tiny_cfg):
    from core.models import load_policy

    return load_policy(tiny_cfg.model)
