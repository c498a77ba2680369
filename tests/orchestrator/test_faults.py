"""Faults that clusters and laptops produce, on the tiny model, through the real sweep command and a real MLflow
store: SIGTERM/SIGINT/kill -9 mid-training, two identical sweeps at once, unusable stores, a full disk,
corrupt results, failures before a run exists, and unsafe resume inputs."""
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import CONCURRENT, REPO
from tests.e2e.test_sweep import _runs
from tests.prewarmed import python

STEPS = 6
ARGS = ["-m", "algo=grpo", "model=tiny-random", "eval=smoke", f"train.steps={STEPS}", "train.prompts_per_step=2",
        "train.group_size=4", "train.minibatch_size=4", "train.max_new_tokens=8", "report.enabled=false"]


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def _sweep(cwd, *args, timeout=600):
    return subprocess.run([*python(), str(REPO / "sweep.py"), *args], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


def _signal_after_two_steps(cwd, sig, *extra) -> tuple[int, str]:
    """Start the sweep, send ``sig`` once its log says step 2 is done; return (exit status, output)."""
    p = subprocess.Popen([*python(), str(REPO / "sweep.py"), *ARGS, *extra], cwd=cwd, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, sent = [], False
    for line in p.stdout:  # no terminal: one log line per training step (the progress a log file shows)
        out.append(line)
        if not sent and f"step 2/{STEPS}" in line:
            p.send_signal(sig)
            sent = True
    p.wait(timeout=300)
    assert sent, "".join(out)[-3000:]
    return p.returncode, "".join(out)


def _trained(cwd, experiment, kind="trained"):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`rlvr.kind` = '{kind}'",
                              order_by=["attributes.start_time ASC"])
    return client, runs


def _steps(client, run, key="train/reward_mean"):
    return [m.step for m in client.get_metric_history(run.info.run_id, key)]


def _history(client, run, key):
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def straight(tiny_cfg):
    """The uninterrupted run's per-step metrics, from the same composed config, in-process."""
    from orchestrator.checks.preflight import sweep_points
    from training.engines import local

    [(_, cfg)] = sweep_points(ARGS[1:], multirun=False)
    logged = {}
    import tempfile

    local.train(cfg, Path(tempfile.mkdtemp()), lambda m, s: logged.setdefault(s, m))
    return logged


def _assert_equal_to_straight(client, run, straight):
    for key in ("train/entropy", "train/grad_norm", "train/response_length_mean", "train/ratio_mean"):
        if key not in straight[0]:
            continue
        got = _history(client, run, key)
        want = [straight[s][key] for s in range(STEPS)]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), key


SLOW = ["-m", "algo=grpo", "model=tiny-random", "eval=smoke", "plugins=[tests.plugins.toy_tasks,tests.plugins.toy_slow_loss]",
        "data.name=toy_slow_parity", "algo.policy_loss.name=toy_slow", "eval.benchmarks=[toy_parity]", "eval.base=false",
        "train.steps=2", "train.checkpoint_every=1", "train.prompts_per_step=2", "train.group_size=4",
        "train.minibatch_size=4", "train.ppo_epochs=3", "train.max_new_tokens=8", "report.enabled=false"]


def _stop_on(cwd, marker, env) -> tuple[int, str, float]:
    """Start the SLOW sweep with ``env``, send SIGTERM 3 s after a line containing ``marker``; return (exit status,
    output, seconds from the signal to the exit)."""
    p = subprocess.Popen([*python(), str(REPO / "sweep.py"), *SLOW], cwd=cwd, env=dict(_env(), **env),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, sent = [], None
    for line in p.stdout:
        out.append(line)
        if sent is None and marker in line:
            time.sleep(3)
            p.send_signal(signal.SIGTERM)
            sent = time.time()
    p.wait(timeout=60)
    text = "".join(out)
    assert sent is not None, text[-3000:]
    return p.returncode, text, time.time() - sent


def _clean_lists_then_frees_only_what_no_run_needs(cwd: Path) -> None:
    """Issue 56: ``python -m orchestrator.clean`` over the runs above. The kill -9 run without a state (KILLED) that a
    later run finished is a superseded run's folder; a kept-on-purpose state of a finished run (made here by hand, as
    ``train.keep_state=true`` keeps it) is listed; a checkpoint folder no run names is listed; the Ctrl-C run (KILLED,
    never finished: the same command resumes it) and every finished run's checkpoint are not. ``--dry-run`` removes
    nothing; ``--remove`` frees exactly the listed places, and the report still builds."""
    import contextlib
    import io

    from orchestrator.clean import main as clean

    client, killed_runs = _trained(cwd, "kill")
    superseded = cwd / killed_runs[0].data.tags["rlvr.run_dir"]
    _, [finished] = _trained(cwd, "killck")
    kept_state = cwd / finished.data.tags["rlvr.run_dir"] / "state"
    kept_state.mkdir()
    (kept_state / "train_state.pt").write_bytes(b"x" * 4096)
    stray = cwd / "multirun" / "stray" / "0" / "checkpoint"
    stray.mkdir(parents=True)
    (stray / "model.safetensors").write_bytes(b"y" * 2048)
    _, [resumable] = _trained(cwd, "int")
    keep = [cwd / resumable.data.tags["rlvr.run_dir"]] + [cwd / r.data.tags["rlvr.run_dir"] / "checkpoint" for r in
                                                          (finished, killed_runs[1])]
    before = {p: p.exists() for p in keep}
    old = os.getcwd()
    os.chdir(cwd)
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert clean(["--dry-run"]) == 0
        listed = out.getvalue()
        assert str(superseded.resolve()) in listed and "folder of a superseded run" in listed, listed
        assert str(kept_state.resolve()) in listed and "training state of a finished run" in listed
        assert str(stray.resolve()) in listed and "checkpoint no run names" in listed
        assert "nothing was removed" in listed and superseded.exists() and kept_state.exists() and stray.exists()
        assert not any(str(p.resolve()) in listed for p in keep)
        with contextlib.redirect_stdout(io.StringIO()):
            assert clean(["--remove"]) == 0
        assert not superseded.exists() and not kept_state.exists() and not stray.exists()
        assert {p: p.exists() for p in keep} == before and all(before.values())
        from reports.build import build

        # the report over the experiment whose superseded run's folder went (its artifacts are in the store)
        assert build("kill", "sqlite:///mlflow.db", log_to_mlflow=False)["html"].is_file()
    finally:
        os.chdir(old)


@pytest.mark.slow
def test_a_stop_inside_a_long_generation_or_a_long_update_is_honoured_within_seconds(tmp_path):
    """Issue 48's stop inside a step, through the sweep command and SIGTERM, on the tiny model.

    Generation: step 1's scoring takes 120 s (tests/plugins/toy_tasks.py: toy_slow_parity), far past a scheduler's
    grace period; SIGTERM 3 s into it: the process exits within 10 s (exit 143), with the state after step 0 saved
    and step 0 logged (the prompt order and random states back at the step's start).
    Update: re-run with step 1's update taking 36 s (6 optimiser steps of 6 s each: tests/plugins/toy_slow_loss.py);
    SIGTERM 3 s into it: the process exits within 10 s, after the first optimiser step, its state holding the step's
    samples and the update so far.
    The same command then finishes step 1 and the run, and its metric series and final weights are those of a run
    never stopped."""
    from safetensors.torch import load_file

    from training.engines.local import load_state

    rc, text, took = _stop_on(tmp_path, "step 1/2", {"TOY_SLOW_SCORING_S": "120"})  # step 0 done: step 1 scores
    assert took < 10 and rc == 143, text[-3000:]
    assert "stopped during step 2/2's generation (MLflow step 1)" in text and "training state was saved" in text
    client, [run] = _trained(tmp_path, "rlvr")
    assert run.info.status == "KILLED" and _steps(client, run) == [0]
    assert load_state(run.data.tags["rlvr.run_dir"])["step"] == 0  # the last completed step's state

    rc, text, took = _stop_on(tmp_path, "toy_slow: update running", {"TOY_SLOW_LOSS_S": "6"})
    assert took < 10 and rc == 143, text[-3000:]
    assert "stopped during step 2/2's update (MLflow step 1) on request, after 1 of its 6 optimiser steps" in text, text[-3000:]
    client, [run] = _trained(tmp_path, "rlvr")
    assert run.info.status == "KILLED" and _steps(client, run) == [0]
    state = load_state(run.data.tags["rlvr.run_dir"])
    assert state["step"] == 0 and state["inflight"]["step"] == 1 and state["inflight"]["done"] == 1

    proc = _sweep(tmp_path, *SLOW)  # neither slow
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _trained(tmp_path, "rlvr")
    assert run.info.status == "FINISHED" and _steps(client, run) == [0, 1]
    (tmp_path / "straight").mkdir()
    ref = _sweep(tmp_path / "straight", *SLOW)  # never stopped
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref_client, [ref_run] = _trained(tmp_path / "straight", "rlvr")
    for key in ("train/reward_mean", "train/entropy", "train/grad_norm", "train/response_length_mean",
                "train/policy_loss", "train/clip_fraction", "train/ratio_mean"):
        assert _history(client, run, key) == _history(ref_client, ref_run, key), key
    weights = [load_file(str(Path(r.data.tags["rlvr.run_dir"]) / "checkpoint" / "model.safetensors")) for r in (run, ref_run)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])


@pytest.mark.slow
def test_sigterm_sigint_and_kill9_mid_training_never_log_a_step_twice(tmp_path, straight):
    # SIGTERM: state saved at the end of the running step, run KILLED, exit 143; the re-run resumes it exactly
    rc, out = _signal_after_two_steps(tmp_path, signal.SIGTERM, "experiment_name=term")
    assert rc == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "training state was saved" in out
    assert "ETA" in out and "eval sampling (hf): prompt" in out  # log-file progress lines
    client, [run] = _trained(tmp_path, "term")
    assert run.info.status == "KILLED"
    _, [parent] = _trained(tmp_path, "term", "sweep")  # the sweep's parent run says how the sweep ended
    assert parent.info.status == "KILLED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
    done = _steps(client, run)
    assert done == sorted(set(done)) and 2 <= len(done) < STEPS
    proc = _sweep(tmp_path, *ARGS, "experiment_name=term")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _trained(tmp_path, "term")
    assert run.info.status == "FINISHED" and _steps(client, run) == list(range(STEPS))
    # issue 56: the stopped-and-resumed run's training state (1.6 GB for the 135M model) is gone once it finished
    assert not (tmp_path / run.data.tags["rlvr.run_dir"] / "state").exists()
    assert (tmp_path / run.data.tags["rlvr.run_dir"] / "checkpoint" / "config.json").is_file()
    _, parents = _trained(tmp_path, "term", "sweep")  # the re-run is a new sweep; the run it finished moved under it
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
    assert run.data.tags["mlflow.parentRunId"] == parents[1].info.run_id
    _assert_equal_to_straight(client, run, straight)

    # Ctrl-C: KILLED, not FAILED; exit 130
    rc, out = _signal_after_two_steps(tmp_path, signal.SIGINT, "experiment_name=int")
    assert rc == 130, out[-3000:]
    _, [run] = _trained(tmp_path, "int")
    assert run.info.status == "KILLED"
    assert [p.info.status for p in _trained(tmp_path, "int", "sweep")[1]] == ["KILLED"]

    # kill -9 without a saved state: the re-run starts a new run and marks the old one KILLED
    rc, out = _signal_after_two_steps(tmp_path, signal.SIGKILL, "experiment_name=kill")
    assert rc == -signal.SIGKILL
    proc = _sweep(tmp_path, *ARGS, "experiment_name=kill")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "left no saved state" in proc.stdout + proc.stderr
    client, runs = _trained(tmp_path, "kill")
    assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
    assert "no saved state" in runs[0].data.tags["rlvr.invalid"]
    for r in runs:
        steps = _steps(client, r)
        assert steps == sorted(set(steps))  # no run holds a step twice
    assert _steps(client, runs[1]) == list(range(STEPS))
    _assert_equal_to_straight(client, runs[1], straight)
    # issue 67: the killed sweep's parent run, left RUNNING by its dead process, was ended by the re-run, saying why
    _, parents = _trained(tmp_path, "kill", "sweep")
    assert [p.info.status for p in parents] == ["KILLED", "FINISHED"]
    assert parents[0].data.tags["rlvr.ended_by"].startswith("ended by a later run of the sweep: its process died")

    # kill -9 with train.checkpoint_every=1: resumed from the saved state, in the same run, equal to the straight run
    rc, _ = _signal_after_two_steps(tmp_path, signal.SIGKILL, "experiment_name=killck", "train.checkpoint_every=1")
    assert rc == -signal.SIGKILL
    proc = _sweep(tmp_path, *ARGS, "experiment_name=killck", "train.checkpoint_every=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _trained(tmp_path, "killck")
    assert run.info.status == "FINISHED" and _steps(client, run) == list(range(STEPS))
    _assert_equal_to_straight(client, run, straight)
    assert not (tmp_path / run.data.tags["rlvr.run_dir"] / "state").exists()
    _clean_lists_then_frees_only_what_no_run_needs(tmp_path)
    # the killed processes left no verifier worker behind
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines() if "multiprocessing" in ln and str(tmp_path) in ln]


@pytest.mark.slow
def test_two_identical_sweeps_at_once_train_each_point_once(tmp_path):
    args = [*ARGS[:1], "algo=quatro,gspo", *ARGS[2:4], "train.steps=2", *ARGS[5:]]
    procs = []
    for i in range(2):
        procs.append(subprocess.Popen([*python(), str(REPO / "sweep.py"), *args], cwd=tmp_path, env=dict(_env(), **CONCURRENT),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(0.5)
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        summary = out.split("Sweep summary", 1)[1]
        for algo in ("algo=quatro", "algo=gspo"):  # both summaries list every point
            assert algo in summary
        assert "duplicate column name" not in err
    client, runs = _runs(tmp_path)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    assert sorted(r.info.run_name.split(",")[0] for r in trained) == ["algo=gspo", "algo=quatro"]
    assert all(r.info.status == "FINISHED" and _steps(client, r) == [0, 1] for r in trained)
    dups = [r for r in runs if r.data.tags.get("rlvr.kind") == "duplicate"]
    assert {d.data.tags["rlvr.duplicate_of"] for d in dups} == {r.info.run_id for r in trained}
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "base"]) == 1


def test_unknown_scheme_and_unreachable_server_fail_in_seconds(tmp_path):
    for uri, fragment in (("nosuch://x", "unknown scheme 'nosuch'"),
                          ("http://127.0.0.1:9", "the tracking server does not answer")):
        t0 = time.time()
        proc = _sweep(tmp_path, *ARGS, f"tracking.uri={uri}", timeout=60)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr
        # refused by pre-flight's own check, not after waiting out the store: tracking.outage_s is 900 s and MLflow's
        # own HTTP retries take minutes. (The command takes 5-6 s on an idle 2-core machine, its imports mostly; 32 s
        # beside the other test worker's vLLM in CI, 2026-12-06: a bound below that measured the machine's load.)
        assert time.time() - t0 < 120
    assert not (tmp_path / "multirun").exists()


@pytest.fixture
def mounts(tmp_path):
    """``mount(name, options)``: a real tmpfs (needs root, as on CI), unmounted afterwards."""
    made = []

    def mount(name, options):
        mnt = tmp_path / name
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        made.append(mnt)
        return mnt
    yield mount
    for mnt in made:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_and_read_only_store_fail_at_preflight_and_leave_no_half_made_store(mounts, tmp_path):
    small_fs = mounts("small", "size=600k")
    store = f"tracking.uri=sqlite:///{small_fs}/mlflow.db"
    t0 = time.time()
    proc = _sweep(tmp_path, *ARGS, store, f"tracking.artifact_root={tmp_path}/art", timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "disk full" in lines[0] and str(small_fs) in lines[0], proc.stderr
    assert time.time() - t0 < 30
    # let the store be created anyway: MLflow's schema (~1 MB) does not fit, and nothing is left half-made
    proc = _sweep(tmp_path, *ARGS, store, "tracking.min_free_mb=0", f"tracking.artifact_root={tmp_path}/art", timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "mlflow.store.db.utils" not in ln]
    assert proc.returncode == 2 and len(lines) == 1 and "disk full (No space left on device)" in lines[0], proc.stderr
    assert not list(small_fs.glob("*.db")) and not list(small_fs.glob(".mlflow.db.creating-*"))
    # space freed: the store is created and works
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_fs)], check=True)
    from orchestrator.store import store_checks, tracking

    store_checks.check_store(f"sqlite:///{small_fs}/mlflow.db", str(tmp_path / "art"), min_free_mb=1)
    exp = tracking.setup_experiment(f"sqlite:///{small_fs}/mlflow.db", "after", str(tmp_path / "art"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{small_fs}/mlflow.db")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "x", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"x": 1.0}
    # read-only: one line naming the cause, no retries
    ro = mounts("ro", "ro,size=20m")
    t0 = time.time()
    proc = _sweep(tmp_path, *ARGS, f"tracking.uri=sqlite:///{ro}/mlflow.db", "tracking.min_free_mb=1",
                  f"tracking.artifact_root={tmp_path}/art", timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Read-only file system" in lines[0], proc.stderr
    assert time.time() - t0 < 30
    # a read-only working directory (where Hydra writes the sweep folder): one line, not a traceback
    proc = subprocess.run([*python(), str(REPO / "sweep.py"), *ARGS, f"tracking.uri=sqlite:///{tmp_path}/m.db",
                           f"tracking.artifact_root={tmp_path}/art", "tracking.min_free_mb=1"], cwd=ro, env=_env(), capture_output=True,
                          text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "mlflow.store.db.utils" not in ln]
    assert proc.returncode == 2 and len(lines) == 1 and "the working directory" in lines[0], proc.stderr
    assert "Read-only file system" in lines[0]


def test_a_point_that_leaves_no_run_or_a_failed_outcome_fails_the_sweep(tmp_path):
    """The summary's exit status counts points that failed before any MLflow run existed (their outcome file)
    and jobs that left no outcome at all, not only FAILED runs. The sweep's callback is one object: it writes its
    outcome to the sweep folder, where sweep.py reads the exit status."""
    from omegaconf import OmegaConf

    from orchestrator import callbacks

    sweep_dir = tmp_path / "multirun" / "s"
    (sweep_dir / "0").mkdir(parents=True)
    (sweep_dir / "0" / callbacks.OUTCOME_FILE).write_text(json.dumps(
        {"job_num": "0", "point": "algo=grpo", "status": "failed", "error": "OSError: [Errno 28] No space left on device"}))
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}, "experiment_name": "e",
                            "tracking": {"uri": f"sqlite:///{tmp_path}/m.db", "artifact_root": str(tmp_path / "a")}})
    cb = callbacks.SweepCallback()
    cb.expected_points = 2  # on_multirun_start counts them from the command line (count_points)
    assert callbacks.exit_status(sweep_dir) == 1  # a sweep that wrote no outcome did not reach its end
    cb.on_multirun_end(cfg)
    rec = callbacks.read_sweep(sweep_dir)
    assert rec["failed_points"] == ["algo=grpo: OSError: [Errno 28] No space left on device",
                                    "?: the job ended without recording an outcome (see its log)"]
    assert callbacks.exit_status(sweep_dir) == 1
    (sweep_dir / "0" / callbacks.OUTCOME_FILE).write_text(json.dumps({"job_num": "0", "point": "algo=grpo", "status": "duplicate"}))
    (sweep_dir / "1").mkdir()
    (sweep_dir / "1" / callbacks.OUTCOME_FILE).write_text(json.dumps({"job_num": "1", "point": "algo=gspo", "status": "finished"}))
    cb.on_multirun_end(cfg)
    assert callbacks.read_sweep(sweep_dir)["failed_points"] == [] and callbacks.exit_status(sweep_dir) == 0


def test_corrupt_samples_are_reevaluated_and_a_corrupt_checkpoint_retrained(tmp_path):
    args = [*ARGS[:4], "train.steps=2", *ARGS[5:]]
    assert _sweep(tmp_path, *args).returncode == 0
    client, [run] = _trained(tmp_path, "rlvr")
    run_dir = Path(run.data.tags["rlvr.run_dir"])
    art = Path(run.info.artifact_uri.replace("file://", ""))
    for f in (run_dir / "eval" / "samples.parquet", art / "samples.parquet"):
        f.write_bytes(f.read_bytes()[:100])  # truncated
    proc = _sweep(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = proc.stdout + proc.stderr
    assert f"{run_dir / 'eval' / 'samples.parquet'}: corrupt" in log and "re-evaluating its checkpoint" in log
    client, runs = _trained(tmp_path, "rlvr")
    old, new = runs
    assert old.info.status == "KILLED" and "samples.parquet" in old.data.tags["rlvr.invalid"]
    assert new.info.status == "FINISHED" and new.data.tags["rlvr.recovered_from"] == old.info.run_id
    assert _steps(client, new) == [0, 1] and _history(client, new, "train/entropy") == _history(client, old, "train/entropy")
    import pandas as pd

    assert len(pd.read_parquet(Path(new.data.tags["rlvr.run_dir"]) / "eval" / "samples.parquet")) > 0
    # the report's loader and the recompute CLI name the unreadable file in one line
    from reports.load import download_samples, load_runs

    problems = []
    got = download_samples(f"sqlite:///{tmp_path}/mlflow.db", load_runs(f"sqlite:///{tmp_path}/mlflow.db", "rlvr"),
                           tmp_path / "dl", problems)
    assert len(problems) == 1 and old.info.run_id in problems[0] and "samples.parquet is unreadable" in problems[0]
    assert any(len(v) for v in got.values())
    cli = subprocess.run([*python(), "-m", "evaluation.recompute", str(run_dir / "eval" / "samples.parquet")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in cli.stderr.splitlines() if ln.strip()]
    assert cli.returncode == 2 and len(lines) == 1 and "samples.parquet: cannot be read" in lines[0], cli.stderr
    # a truncated checkpoint: trained again
    weights = Path(new.data.tags["rlvr.run_dir"]) / "checkpoint" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    proc = _sweep(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{weights}: corrupt" in proc.stdout + proc.stderr and "training again" in proc.stdout + proc.stderr
    client, runs = _trained(tmp_path, "rlvr")
    assert [r.info.status for r in runs] == ["KILLED", "KILLED", "FINISHED"]
    assert "rlvr.recovered_from" not in runs[2].data.tags and _steps(client, runs[2]) == [0, 1]


def test_the_lease_has_one_owner_and_a_dead_process_is_stale(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from orchestrator.store import lease, tracking

    uri = f"sqlite:///{tmp_path}/m.db"
    exp = tracking.setup_experiment(uri, "lease", str(tmp_path / "a"))
    client = MlflowClient(uri)
    run = client.create_run(exp, tags=lease.owner_tags(lease.new_owner()))
    assert lease.is_live(client.get_run(run.info.run_id), 300)
    assert not lease.is_live(client.get_run(run.info.run_id), 300, now=time.time() + 400)  # silent too long
    dead = subprocess.Popen(["true"])
    dead.wait()
    client.set_tag(run.info.run_id, "rlvr.pid", str(dead.pid))  # its process is gone, on this host
    assert not lease.is_live(client.get_run(run.info.run_id), 300)
    monkeypatch.setattr(lease, "SETTLE_S", 0.5)
    won = []
    threads = [threading.Thread(target=lambda: won.append(lease.claim(tracking.Store(client=client), run.info.run_id))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([w for w in won if w]) == 1  # three claims at once: exactly one owner
    assert client.get_run(run.info.run_id).data.tags["rlvr.owner"] == next(w for w in won if w)


def test_resume_loads_tensors_only_and_only_from_inside_the_run_folder(tmp_path):
    from orchestrator.point.decision import safe_run_dir
    from training.engines.local import load_state

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))

    run_dir = tmp_path / "multirun" / "rlvr" / "s" / "0"
    (run_dir / "state").mkdir(parents=True)
    torch.save({"step": 1, "x": Evil()}, run_dir / "state" / "train_state.pt")
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|unsupported"):
        load_state(run_dir)
    assert not (tmp_path / "pwned").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    torch.save({"step": 1}, elsewhere / "train_state.pt")
    (run_dir / "state" / "train_state.pt").unlink()
    (run_dir / "state").rmdir()
    (run_dir / "state").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="outside the run folder"):
        load_state(run_dir)
    sweep = str(tmp_path / "multirun" / "rlvr" / "s2")
    assert safe_run_dir(str(run_dir), sweep) == run_dir.resolve()
    assert safe_run_dir("/etc", sweep) is None and safe_run_dir(str(tmp_path / "x"), sweep) is None


def test_checkpoint_every_is_not_part_of_the_identity(tiny_cfg):
    from omegaconf import OmegaConf

    from orchestrator.point.identity import config_hash

    a = config_hash(tiny_cfg)
    assert config_hash(OmegaConf.merge(tiny_cfg, {"train": {"checkpoint_every": 5}})) == a
    assert config_hash(OmegaConf.merge(tiny_cfg, {"train": {"lr": 1e-3}})) != a


@pytest.mark.parametrize("overlap", [False, True])
def test_sigterm_with_stale_rollouts_queued_resumes_to_the_uninterrupted_run(tmp_path, overlap):
    """Issue 58: train.rollout.staleness=2 through the sweep command, SIGTERM once step 2 is logged (the rollouts of
    the next two steps queued, saved with the state; with ``train.rollout.overlap`` one of them may be generating in
    its thread when the signal comes: the stop waits for it), then the same command: the resumed run logs every step
    once, with the uninterrupted (emulated) in-process run's series, staleness included."""
    from orchestrator.checks.preflight import sweep_points
    from training.engines import local

    stale = ["train.rollout.staleness=2", "train.rollout.sampler=hf", "experiment_name=stale"]
    [(_, cfg)] = sweep_points([*ARGS[1:], *stale], multirun=False)
    stale.append(f"train.rollout.overlap={str(overlap).lower()}")
    straight = {}
    local.train(cfg, tmp_path / "straight", lambda m, s: straight.setdefault(s, m))
    rc, out = _signal_after_two_steps(tmp_path, signal.SIGTERM, *stale)
    assert rc == 143, out[-3000:]
    client, [run] = _trained(tmp_path, "stale")
    state = local.load_state(tmp_path / run.data.tags["rlvr.run_dir"])  # after the last step the stop let finish:
    assert 1 <= state["step"] < STEPS - 1  # ... with the rollouts generated ahead of it, for the next two steps
    # (a stop inside step s's update saves the state after step s - 1 with step s in flight: its rollout taken off)
    first = state["step"] + 1 + bool(state.get("inflight"))
    assert sorted(state["queue"]) == [s for s in range(first, first + 2) if s < STEPS]
    proc = _sweep(tmp_path, *ARGS, *stale)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _trained(tmp_path, "stale")
    assert run.info.status == "FINISHED" and _steps(client, run) == list(range(STEPS))
    assert _history(client, run, "train/staleness_mean") == [0, 1, 2, 2, 2, 2]
    _assert_equal_to_straight(client, run, straight)


@pytest.mark.slow
def test_a_stop_beside_the_validation_inside_the_loop_logs_every_validation_point_once(tmp_path):
    """Issue 69: ``train.validate_every=1`` through the sweep command, SIGTERM once step 2 is logged. The stop is
    honoured when the running step's state is saved, which comes before that policy's validation (or inside the next
    step's generation, after it); the same command resumes the run, validating first the policy it resumes from when
    its point is missing. Every validation point, 0 to the last step, is logged exactly once, and the resumed process
    samples only the points the stopped one had not logged."""
    val = ["train.validate_every=1", "data.validation_prompts=4", "eval.validation.n=2", "eval.validation.k=2",
           "experiment_name=val"]
    rc, out = _signal_after_two_steps(tmp_path, signal.SIGTERM, *val)
    assert rc == 143, out[-3000:]
    client, [run] = _trained(tmp_path, "val")
    before = _steps(client, run, "val/arithmetic/pass_at_1")
    # 0 and 1 at least (the signal comes once step 2 is counted: before its validation, which the stop then skips, or
    # after it), never the last
    assert before == list(range(len(before))) and 2 <= len(before) <= STEPS, before
    proc = _sweep(tmp_path, *ARGS, *val)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _trained(tmp_path, "val")
    assert run.info.status == "FINISHED" and _steps(client, run) == list(range(STEPS))
    for key in ("val/arithmetic/pass_at_1", "val/compute_flops", "time/val_s"):
        assert _steps(client, run, key) == list(range(STEPS + 1)), key
    import re

    again = {int(m) for m in re.findall(r"validation: step (\d+) pass@1", proc.stdout + proc.stderr)}
    assert again == set(range(len(before), STEPS + 1)), (before, again)
