"""Sweeps on a real single-node SLURM cluster (scripts/slurm/start.sh; .ci/run starts it)."""
import os
import shutil
import subprocess
import time

import pytest

from tests.conftest import CONCURRENT
from tests.e2e.test_sweep import TINY, _runs, _sweep
from tests.prewarmed import python


def _slurm_up() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
        return out.returncode == 0 and any(state in out.stdout for state in ("idle", "mix", "alloc"))
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _slurm_up(), reason="no SLURM cluster answers sinfo (start one: scripts/slurm/start.sh)")

SLURM = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=20"]


def test_readme_sweep_through_slurm(tmp_path):
    proc = _sweep(tmp_path, "-m", *SLURM, "algo=quatro,gspo", "delta=0.01,0.1", *TINY, "report.enabled=false", env=CONCURRENT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = _runs(tmp_path)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    dups = [r for r in runs if r.data.tags.get("rlvr.kind") == "duplicate"]
    assert len(trained) == 3 and all(r.info.status == "FINISHED" for r in trained) and len(dups) == 1
    assert all(r.data.tags.get("rlvr.slurm_job_id") for r in runs)
    assert len({r.data.tags["rlvr.slurm_job_id"] for r in runs}) == 4  # one SLURM job per point


RESUME = ["algo=grpo_h", "algo.entropy_coef=0.5", "train.lr=1e-3", "train.checkpoint_every=1", "train.steps=10",
          "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=8", "train.max_new_tokens=24",
          "model=tiny-random", "eval=smoke",
          "report.enabled=false", "eval.base=false"]  # this test is about resuming training


def test_requeued_job_resumes_its_run_with_every_step_once_and_the_same_results(tmp_path):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "local").mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", **CONCURRENT)

    from tests.conftest import REPO

    proc = subprocess.Popen([*python(), str(REPO / "sweep.py"), "-m", *SLURM, *RESUME], cwd=tmp_path / "slurm", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = None
    job_id, deadline = None, time.time() + 300
    while time.time() < deadline:  # wait until the job has logged two steps, then requeue it
        time.sleep(1)
        if not (tmp_path / "slurm" / "mlflow.db").exists():
            continue
        try:
            client, runs = _runs(tmp_path / "slurm")
        except Exception:
            continue
        if runs and len(client.get_metric_history(runs[0].info.run_id, "train/reward_mean")) >= 2:
            job_id = runs[0].data.tags["rlvr.slurm_job_id"]
            break
    assert job_id, "training never reached step 2"
    subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
    # SLURM holds a requeued batch job for about two minutes (its begin time); nothing here depends on that wait
    for _ in range(120):
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], capture_output=True, text=True,
                               timeout=30).stdout.split()
        if state and state[0] == "PENDING":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True, timeout=30)
            break
        time.sleep(0.5)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    client, runs = _runs(tmp_path / "slurm")
    [run] = runs
    assert run.info.status == "FINISHED" and int(run.data.tags["rlvr.requeue_count"]) >= 1
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/entropy")]
    assert sorted(steps) == list(range(10))  # every step exactly once

    # the same point without interruption, locally
    ref = _sweep(tmp_path / "local", "-m", *RESUME)
    assert ref.returncode == 0, ref.stderr[-3000:]
    rclient, [rrun] = _runs(tmp_path / "local")
    for key in ("train/entropy", "train/entropy_bonus", "train/grad_norm", "train/response_length_mean"):
        a = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        b = {m.step: m.value for m in rclient.get_metric_history(rrun.info.run_id, key)}
        assert a.keys() == b.keys()
        for s in a:
            assert a[s] == pytest.approx(b[s], rel=1e-5), (key, s)
    for key, v in rrun.data.metrics.items():
        if key.startswith("eval/"):
            assert run.data.metrics[key] == pytest.approx(v, rel=1e-6), key
