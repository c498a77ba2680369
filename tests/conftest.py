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


GPU_INSTALL_TEST = "test_the_readmes_gpu_install_resolves_verls_pins_without_trl"


def pytest_collection_modifyitems(session, config, items):
    """The GPU install's pip resolution (tests/training/test_verl_engine.py) waits mostly on the network for about two
    minutes: when that test is selected, it starts here, in the background, and the test reads its result."""
    if any(item.name == GPU_INSTALL_TEST for item in items):
        import subprocess
        import tempfile

        report = Path(tempfile.mkdtemp(prefix="rlvr-gpu-dry-run-")) / "gpu.json"
        proc = subprocess.Popen(["bash", "scripts/install.sh"], cwd=REPO, env=dict(os.environ, RLVR_GPU="1",
                                RLVR_DRY_RUN=str(report)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        config.stash[GPU_DRY_RUN] = (proc, report)


GPU_DRY_RUN = pytest.StashKey[tuple]()


@pytest.fixture(scope="session")
def gpu_dry_run(request):
    """(exit status, stderr, report path) of the GPU install's dry run started at collection (see above)."""
    proc, report = request.config.stash[GPU_DRY_RUN]
    _, err = proc.communicate(timeout=900)
    return proc.returncode, err, report


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
