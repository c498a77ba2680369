"""The cluster set-up (docs/cluster.md): a PostgreSQL database behind ``mlflow server``, artifacts through the
server, and a sweep of 8 points running at once (the local submitit launcher: one process per point, as a SLURM
job array runs them). Read back over the server's REST API: every point trained once, every step of every
series logged once, the parent's summary lists every point, no error in any job. Then the same sweep again with
the server stopped for 20 s in the middle of training and started again: the jobs wait and retry
(orchestrator.store.tracking.retry), training goes on with its metrics buffered (tracking.MetricBuffer), and every
series ends equal, value for value, to the uninterrupted sweep's: nothing lost, duplicated or changed.

PostgreSQL: the server ``.ci/run`` starts (``RLVR_TEST_POSTGRES``: its admin URI), else one this module starts
with scripts/postgres/start.sh in a temporary folder; skipped where PostgreSQL is not installed."""
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from orchestrator.reproduce import NOT_REPRODUCIBLE  # timings and memory: differ between any two runs
from tests.conftest import CONCURRENT, REPO
from tests.e2e.test_sweep import _free_port, _rest
from tests.prewarmed import python

pytestmark = pytest.mark.slow
STEPS = 3
POINTS = ["algo=grpo,gspo", "seed=1,2,3,4"]  # 8 points
# the least work per point that still trains, evaluates and logs (the base model's evaluation and the entropy pass
# are the sweep tests' business): 16 job processes on 2 cores beside the other test worker
ARGS = ["hydra/launcher=local", "model=tiny-random", "eval=smoke", "eval.base=false", "eval.entropy=false",
        f"train.steps={STEPS}", "train.prompts_per_step=2",
        "train.group_size=4", "train.minibatch_size=4", "train.max_new_tokens=8", "report.enabled=false",
        "tracking.artifact_root=mlflow-artifacts:/", "tracking.system_metrics=false"]


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    """A fresh PostgreSQL database for MLflow: its SQLAlchemy URI."""
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
    admin = os.environ.get("RLVR_TEST_POSTGRES")
    started = None
    if not admin:
        if not (shutil.which("pg_ctl") or list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))):
            pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
        import tempfile

        # not under pytest's folders (0700, root's): as root, the server runs as the postgres user, who must reach it
        started = Path(tempfile.mkdtemp(prefix="rlvr-pg-"))
        started.chmod(0o755)
        env = dict(os.environ, RLVR_PG_DIR=str(started), RLVR_PG_PORT=str(_free_port()))
        r = subprocess.run(["bash", str(REPO / "scripts/postgres/start.sh")], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        admin = (started / "uri").read_text().strip()
    name = f"mlflow_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield admin.rsplit("/", 1)[0] + "/" + name
    if started is not None:
        subprocess.run(["bash", str(REPO / "scripts/postgres/stop.sh")], env=dict(os.environ, RLVR_PG_DIR=str(started)))
        shutil.rmtree(started, ignore_errors=True)


class Server:
    """``mlflow server`` over the database on one fixed port, which :meth:`stop` and :meth:`start` again."""

    def __init__(self, db: str, folder: Path):
        self.db, self.folder, self.port, self.proc, self.starts = db, folder, _free_port(), None, 0
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self):
        self.starts += 1
        log = open(self.folder / f"server{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.db, "--artifacts-destination",
             str(self.folder / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "2"],
            cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
        for _ in range(240):
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=2).read()
                return
            except OSError:
                assert self.proc.poll() is None, (self.folder / f"server{self.starts}.log").read_text()[-2000:]
                time.sleep(0.5)
        pytest.fail("mlflow server did not answer /health in 120 s")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def server(database, tmp_path_factory):
    s = Server(database, tmp_path_factory.mktemp("mlflow-pg"))
    s.start()
    yield s
    s.stop()


def _start_sweep(cwd: Path, server: Server, experiment: str, **env) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [*python(), str(REPO / "sweep.py"), "-m", *POINTS, *ARGS, f"tracking.uri={server.uri}",
         f"experiment_name={experiment}"], cwd=cwd, stdout=open(cwd / "sweep.out", "w"),
        stderr=open(cwd / "sweep.err", "w"), env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **CONCURRENT, **env))


def _job_logs(cwd: Path) -> dict[str, str]:
    return {str(p.relative_to(cwd)): p.read_text(errors="replace")
            for p in (cwd / "multirun").rglob(".submitit/*/*_log.*")}


def _read_back(uri: str, experiment: str) -> dict:
    """Over the REST API: {point: {"run": run JSON, "series": {key: [(step, value, timestamp), ...]}}} of the
    experiment's trained runs, and the parent's summary rows under "summary"."""
    exp = _rest(uri, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + experiment)["experiment"]
    runs = _rest(uri, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    out = {"trained": {}, "kinds": sorted(t.get("rlvr.kind", "") for t in tags)}
    for r, t in zip(runs, tags):
        if t.get("rlvr.kind") == "sweep":
            import pandas as pd
            from mlflow.tracking import MlflowClient

            path = MlflowClient(tracking_uri=uri).download_artifacts(r["info"]["run_id"], "summary.csv", str(
                Path(os.environ.get("TMPDIR", "/tmp")) / uuid.uuid4().hex))
            out["parent"], out["summary"] = r, pd.read_csv(path)
        if t.get("rlvr.kind") != "trained":
            continue
        params = {p["key"]: p["value"] for p in r["data"].get("params", [])}
        point = f"algo={params['algo.name']},seed={params['seed']}"  # the point's name holds the URI: differs
        assert point not in out["trained"], f"point {point} has two trained runs"
        series = {}
        for m in r["data"].get("metrics", []):
            hist = _rest(uri, f"/api/2.0/mlflow/metrics/get-history?run_id={r['info']['run_id']}&metric_key="
                         + urllib.request.quote(m["key"], safe="") + "&max_results=25000")["metrics"]
            series[m["key"]] = sorted((int(h.get("step", 0)), h["value"], int(h["timestamp"])) for h in hist)
        out["trained"][point] = {"run": r, "series": series}
    return out


def _check_sweep(cwd: Path, proc: subprocess.Popen, uri: str, experiment: str) -> dict:
    rc = proc.wait(timeout=1500)
    assert rc == 0, ((cwd / "sweep.err").read_text()[-3000:], (cwd / "sweep.out").read_text()[-3000:])
    logs = _job_logs(cwd)
    assert len([k for k in logs if k.endswith("_log.out")]) == 8, sorted(logs)
    for name, text in logs.items():  # no job met an error it did not recover from
        assert "Traceback" not in text and "][ERROR]" not in text, (name, text[-3000:])
    got = _read_back(uri, experiment)
    assert len(got["trained"]) == 8, sorted(got["trained"])
    assert got["kinds"].count("sweep") == 1 and set(got["kinds"]) == {"trained", "sweep"}, got["kinds"]
    for point, r in got["trained"].items():
        assert r["run"]["info"]["status"] == "FINISHED", point
        train = {k: v for k, v in r["series"].items() if k.startswith("train/")}
        assert "train/reward_mean" in train, sorted(r["series"])
        for key, hist in train.items():  # every step once, in order of logging
            assert [s for s, _, _ in hist] == list(range(STEPS)), (point, key, hist)
            stamps = [ts for _, _, ts in hist]
            assert stamps == sorted(stamps), (point, key, hist)
        for key, hist in r["series"].items():
            if key.startswith("eval/"):
                assert len(hist) == 1, (point, key, hist)  # the final checkpoint, evaluated once
    summary = got["summary"]
    trained_ids = {r["run"]["info"]["run_id"] for r in got["trained"].values()}
    assert trained_ids <= set(summary["run_id"]), summary.to_string()
    assert set(summary.loc[summary["run_id"].isin(trained_ids), "status"]) == {"FINISHED"}, summary.to_string()
    assert got["parent"]["info"]["status"] == "FINISHED"
    return got


@pytest.fixture(scope="module")
def loaded(server, tmp_path_factory):
    """The 8-point sweep against the server, uninterrupted."""
    cwd = tmp_path_factory.mktemp("load")
    return _check_sweep(cwd, _start_sweep(cwd, server, "load"), server.uri, "load")


def test_eight_concurrent_points_over_postgresql_each_train_once_and_log_every_step_once(loaded):
    # _check_sweep asserted one FINISHED run per point, every step once, the parent's summary; here: the 8 points
    # are the sweep's 8 combinations, and their runs really ran at once (their active spans overlap)
    assert sorted(loaded["trained"]) == sorted(f"algo={a},seed={s}" for a in ("grpo", "gspo") for s in (1, 2, 3, 4))
    spans = [(int(r["run"]["info"]["start_time"]), int(r["run"]["info"]["end_time"])) for r in loaded["trained"].values()]
    assert max(a for a, _ in spans) < min(b for _, b in spans), spans


def _step_finished_after(log: str, start: float, end: float = float("inf")) -> bool:
    """Whether ``log`` (a job's log) has a training step line stamped after ``start`` and before ``end`` (epoch s)."""
    from datetime import datetime

    return any(start < datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp() < end
               for line in log.splitlines() if "][rlvr][INFO] - train " in line)


def test_the_server_stopped_for_20_s_mid_training_loses_and_duplicates_nothing(server, loaded, tmp_path):
    cwd = tmp_path / "restart"
    # MLflow's own HTTP retries (7, about 4 minutes) would wait out 20 s alone; two (about 4 s) leave the waiting
    # to the suite's own (tracking.retry, up to tracking.outage_s), the part under test
    proc = _start_sweep(cwd, server, "restart", MLFLOW_HTTP_REQUEST_MAX_RETRIES="2")
    deadline = time.time() + 900
    while not any(f"step 1/{STEPS}" in t for t in _job_logs(cwd).values()):  # training under way
        assert proc.poll() is None and time.time() < deadline, (cwd / "sweep.err").read_text()[-3000:]
        time.sleep(1)
    stopped_at = time.time()  # the server refuses new connections from here; its graceful shutdown takes seconds more,
    server.stop()             # in which a fast machine's points may finish their remaining steps
    time.sleep(20)
    # on a loaded machine eight points' steps take longer than 20 s: the server stays down until some job has
    # finished a step meanwhile (at most 120 s more, far below tracking.outage_s), so the check below is decided
    # by whether training goes on during the outage, not by the machine's speed
    while time.time() < stopped_at + 140 and proc.poll() is None and not any(
            _step_finished_after(t, stopped_at + 0.5) for t in _job_logs(cwd).values()):
        time.sleep(2)
    time.sleep(2)  # that step well inside the outage
    running = proc.poll() is None
    restarted_at = time.time()
    server.start()
    assert running, "the sweep ended while the server was down: " + (cwd / "sweep.err").read_text()[-3000:]
    got = _check_sweep(cwd, proc, server.uri, "restart")
    logs = "".join(_job_logs(cwd).values())
    assert "the MLflow store is unreachable" in logs  # the jobs did meet the outage, and waited
    # training went on while the server was down: some job finished a step then (its metrics buffered)
    assert _step_finished_after(logs, stopped_at + 0.5, restarted_at - 1), "no training step finished while the server was down"
    # the same 8 points as the uninterrupted sweep, each series equal value for value (CPU runs are deterministic:
    # orchestrator.reproduce), timings and resource readings aside
    assert sorted(got["trained"]) == sorted(loaded["trained"])
    for point, r in got["trained"].items():
        want = loaded["trained"][point]["series"]
        keys = {k for k in r["series"] if not NOT_REPRODUCIBLE.search(k)}
        assert keys == {k for k in want if not NOT_REPRODUCIBLE.search(k)}, point
        for k in keys:
            assert [(s, v) for s, v, _ in r["series"][k]] == [(s, v) for s, v, _ in want[k]], (point, k)
