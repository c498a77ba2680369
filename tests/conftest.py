import os
from pathlib import Path

import pytest

from tests import prewarmed

REPO = Path(__file__).resolve().parent.parent
SHARED = (REPO.parent / "shared").resolve()
BENCHMARK_DIR = SHARED / "data" / "benchmarks"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# one OpenMP thread per process (this one and every sweep it starts): the two xdist workers and their sweeps already
# keep both cores busy, and torch's default of one thread per core made them spin against each other (measured on
# 2 cores, the presets' and sweep-lifecycle tests: 258 s with the default, 219 s with one thread)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# every test sees a CPU without bf16 units, whatever the machine (an Intel Xeon with AMX or an AMD EPYC with AVX2):
# precision=auto is float32 in every test, as on most laptops; tests of the other branch fake AMX's flags
# (core/precision.py reads RLVR_CPU_FLAGS in place of /proc/cpuinfo's)
os.environ.setdefault("RLVR_CPU_FLAGS", "fpu sse2 avx avx2 fma")
# the rollout sampler's auto choice from its constants alone: the machine's calibration file, which every run with
# auto adds to (core/sampling/rollout.py), would make a test's choice depend on the tests run before it
os.environ.setdefault("RLVR_ROLLOUT_CALIBRATION", "off")
# a store claim (a point's lease, the base model's run, the sweep's protocol) waits this long before reading its claim
# back: 1 s by default, the window in which processes that claim at once see each other's claims
# (orchestrator/store/lease.py). A test of processes that claim at once gives :data:`CONCURRENT`; the others, one
# process at a time, wait less (three claims, about 3 s of idle waiting, in each of the suite's hundred sweeps)
os.environ.setdefault("RLVR_LEASE_SETTLE_S", "0.1")
CONCURRENT = {"RLVR_LEASE_SETTLE_S": "1.0"}
prewarmed.reserve()  # the tests' sweeps run through a fork server of this worker's (tests/prewarmed.py)
if Path("/tmp/rlvr-slurm/etc/slurm.conf").exists():  # the cluster of scripts/slurm/start.sh
    os.environ.setdefault("SLURM_CONF", "/tmp/rlvr-slurm/etc/slurm.conf")


def _compose_once() -> None:
    """Every test composes a given command line's sweep points with Hydra once per worker: a repeat gets a deep
    copy of the configs the first call composed (the same objects Hydra made; a test may change its copy). The
    presets' tests compose all 35 presets' 275 points several times over (each point about 0.14 s on 2 cores), the
    memory plan's, the verl translation's and the schema's tests the same presets again. Errors are not kept: a bad
    command line is composed, and refused, every time."""
    import copy
    import functools

    from orchestrator.checks import preflight

    original, done = preflight.sweep_points, {}

    @functools.wraps(original)
    def sweep_points(overrides, config_name: str = "config", multirun: bool = True):
        key = (tuple(overrides), config_name, multirun)
        if key not in done:
            done[key] = original(list(overrides), config_name, multirun)
        return copy.deepcopy(done[key])

    preflight.sweep_points = sweep_points


_compose_once()

GPU_INSTALL_TEST = "test_the_readmes_gpu_install_resolves_verls_pins_without_trl"

# The suite runs on two pytest-xdist workers (pyproject's addopts: ``-n 2 --dist loadfile --no-loadscope-reorder``): a file's tests stay on one
# worker (its module fixtures run once), and the files below share one worker besides, because they share a session
# fixture (the all-algorithms sweep) or a machine-wide resource (verl's local Ray clusters): the scheduler is xdist's
# file scheduler with these groups (pytest_xdist_make_scheduler). (xdist's own ``xdist_group`` marks do not group
# under pytest 9: xdist appends the group to ``item._nodeid``, which pytest 9's ``nodeid`` no longer reads.)
SHARED_GROUPS = {
    "tests/e2e/test_verl_cpu.py": "verl",
    "tests/training/test_verl_engine.py": "verl",
    "tests/e2e/test_all_algorithms.py": "all_algorithms",
    "tests/e2e/test_vllm.py": "all_algorithms",
}
# the longest groups, longest first (their durations on 2 cores: verl's about 15 min, every paper twin's report
# about 7, the faults, the PostgreSQL store and the sweep lifecycle about 5 each, the presets' twins 4, SLURM 3, the
# all-algorithms sweep and the README sweep 2-3), so that no long one starts last; the rest follow in collection
# order (pyproject's addopts: --no-loadscope-reorder)
FIRST_GROUPS = ("verl", "tests/e2e/test_twins.py", "tests/orchestrator/test_faults.py", "tests/orchestrator/test_cluster_store.py",
                "tests/orchestrator/test_sweep_lifecycle.py", "tests/e2e/test_presets.py", "tests/slurm/test_slurm.py", "all_algorithms", "tests/e2e/test_sweep.py")


# the end-to-end sweeps and the process-level fault, store and cluster tests: marked ``slow`` as a whole (the quick loop,
# ``python -m pytest -m "not slow"``, leaves them out; each test elsewhere that takes seconds carries the mark itself)
SLOW_PATHS = ("tests/e2e/", "tests/slurm/", "tests/orchestrator/test_faults.py", "tests/orchestrator/test_cluster_store.py",
              "tests/orchestrator/test_sweep_lifecycle.py")


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown when it is not loaded (-p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """xdist's file scheduler, with the files of :data:`SHARED_GROUPS` as one unit each."""
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return GroupedFiles(config, log)


def pytest_collection_modifyitems(session, config, items):
    """Marks the tests under :data:`SLOW_PATHS` ``slow``; puts the :data:`FIRST_GROUPS` first, longest first, and starts the GPU install's pip resolution
    (tests/training/test_verl_engine.py), which waits mostly on the network for about two minutes, in the background
    when that test is selected: once per test run however many workers collect it, the test reading its result."""
    for item in items:
        if item.nodeid.startswith(SLOW_PATHS):
            item.add_marker(pytest.mark.slow)
    rank = {g: i for i, g in enumerate(FIRST_GROUPS)}
    items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))  # stable: the order within a group is kept
    if any(item.name == GPU_INSTALL_TEST for item in items):
        folder = _dry_run_folder(config)
        try:
            folder.mkdir(parents=True)  # the first worker to get here starts it
        except FileExistsError:
            return
        import subprocess

        subprocess.Popen(["bash", "-c", f'bash scripts/install.sh 2> "{folder}/stderr"; echo $? > "{folder}/rc.tmp"; '
                          f'mv "{folder}/rc.tmp" "{folder}/rc"'], cwd=REPO, stdout=subprocess.DEVNULL,
                         env=dict(os.environ, RLVR_GPU="1", RLVR_DRY_RUN=str(folder / "gpu.json")), start_new_session=True)


def _dry_run_folder(config) -> Path:
    """A folder per test run, the same on every xdist worker (their shared test-run id)."""
    import tempfile
    import uuid

    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is None:
        run = config.stash.setdefault(RUN_ID, uuid.uuid4().hex)
    return Path(tempfile.gettempdir()) / f"rlvr-gpu-dry-run-{run}"


RUN_ID = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def gpu_dry_run(request):
    """(exit status, stderr, report path) of the GPU install's dry run started at collection (see above)."""
    import time

    folder = _dry_run_folder(request.config)
    deadline = time.time() + 900
    while not (folder / "rc").is_file():
        assert time.time() < deadline, f"the GPU install's dry run did not finish within 15 minutes ({folder})"
        time.sleep(1)
    return int((folder / "rc").read_text()), (folder / "stderr").read_text(), folder / "gpu.json"


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
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke"])
    return cfg


@pytest.fixture(scope="session")
def tiny_policy(tiny_cfg):
    from core.models import load_policy

    return load_policy(tiny_cfg.model)
