"""The orchestrator decides in pure functions and acts in one place (issue 67, docs: "The loop at paper scale").

- Layering (read from the source, as tests/test_layers.py reads imports): outside ``orchestrator/store/`` no module of
  ``orchestrator/`` imports MLflow or calls it (every call goes through ``orchestrator.store.tracking.Store``, whose
  retries wait out an outage), and none reaches past the store to its MLflow client (``store.client``); nowhere in
  ``orchestrator/`` is a store optional (``Store | None``) or made up when none was passed (``store or Store()``, a
  default factory): the store is built once from the config and always passed.
- Every rule of :data:`orchestrator.point.decision.RULES`, run against a real SQLite MLflow store through a store that
  refuses writes, on runs that make it fire, returns its typed decision and leaves the store as it was.
- Acting (:mod:`orchestrator.point.act`): a re-run ends the parent run a killed sweep left RUNNING (its heartbeat
  stale), saying why, and never a live sweep's; a run's once-per-run step-0 metrics (the memory plan, the model's
  parameter counts, the measured peak) are logged once however many processes run it.
"""
import ast
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO

ORCH = REPO / "orchestrator"
STORE_PKG = ORCH / "store"

#: modules of orchestrator/ (outside orchestrator/store/) allowed to use MLflow or its client directly, with the reason:
#: reading a store through MLflow's client is allowed for reports only, and no module here builds one
ALLOWED: dict[str, str] = {}


def _mlflow_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each ``import mlflow``/``from mlflow... import``, each ``mlflow.<...>`` expression and each
    ``.client`` attribute (``store.client``, ``self.client``, ``x.client.get_run``) in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, f"import {a.name}") for a in node.names if a.name.split(".")[0] == "mlflow"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "mlflow":
            out.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "mlflow":
                out.append((node.lineno, ast.unparse(node)))
            if node.attr == "client":
                out.append((node.lineno, ast.unparse(node)))
    return out


def _optional_stores(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for each parameter annotated as an optional store (``Store | None``, ``Optional[Store]``), each
    fallback store (``x or Store()``, ``x or tracking.Store(...)``) and each ``default_factory`` that makes a store."""
    def makes_store(node) -> bool:
        return isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Store"

    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                text = ast.unparse(a.annotation) if a.annotation is not None else ""
                if "Store" in text and ("None" in text or "Optional" in text):
                    out.append((a.lineno, f"{node.name}({a.arg}: {text})"))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            text = ast.unparse(node.annotation)
            if "Store" in text and ("None" in text or "Optional" in text):
                out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(makes_store(v) for v in node.values):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.keyword) and node.arg == "default_factory" \
                and ast.unparse(node.value).split(".")[-1] == "Store":
            out.append((node.value.lineno, ast.unparse(node)))
    return out


def _files(root: Path, skip: Path | None = None):
    for p in sorted(root.rglob("*.py")):
        if skip is None or skip not in p.parents:
            yield p, ast.parse(p.read_text(), str(p))


def test_the_checkers_see_what_they_must_see():
    """The two checkers, on code whose uses are known."""
    uses = _mlflow_uses(ast.parse(
        "import mlflow\nfrom mlflow.entities import Metric\nimport mlflow.tracking as t\n"
        "def f(store):\n    mlflow.end_run()\n    store.client.get_run('x')\n    return self.client\n"
        "from orchestrator.store import mlflow_views\nmlflow_views.describe(1)\nstore.call(store.run, 1)\n"))
    assert sorted(line for line, _ in uses) == [1, 2, 3, 5, 6, 7]
    found = _optional_stores(ast.parse(
        "def a(store: tracking.Store | None = None): pass\n"
        "def b(x, store: Optional[Store] = None): pass\n"
        "def c(store: tracking.Store): s = store or tracking.Store()\n"
        "def d(store: tracking.Store): s = store or Store(5.0)\n"
        "@dataclass\nclass P:\n    store: tracking.Store = field(default_factory=tracking.Store)\n"
        "def e(store: tracking.Store, limit: float | None = None): return tracking.Store.of(cfg)\n"))
    assert sorted(line for line, _ in found) == [1, 2, 3, 4, 7]


def test_no_mlflow_call_and_no_store_client_outside_the_store_package():
    """No ``import mlflow``, no ``mlflow.*`` call and no ``store.client`` in orchestrator/ outside orchestrator/store/:
    every MLflow call goes through the run's ``tracking.Store``, so it waits out an outage (tracking.outage_s) like the
    others (issue 67 counted 18 direct ``mlflow.*`` calls and 5 uses of ``store.client``)."""
    bad = []
    for path, tree in _files(ORCH, skip=STORE_PKG):
        rel = str(path.relative_to(REPO))
        if rel in ALLOWED:
            continue
        bad += [f"{rel}:{line}: {what}" for line, what in _mlflow_uses(tree)]
    assert bad == []
    assert all(reason for reason in ALLOWED.values())  # an exception says why


def test_the_store_is_always_passed_never_optional_or_made_up():
    """No parameter ``store: Store | None`` and no fallback store (``store or tracking.Store()``, a default factory)
    anywhere in orchestrator/ (issue 67 counted 16 such signatures and 12 fallbacks): a store made up where none was
    passed has the default outage limit, not the sweep's."""
    bad = [f"{path.relative_to(REPO)}:{line}: {what}" for path, tree in _files(ORCH)
           for line, what in _optional_stores(tree)]
    assert bad == []


# ----------------------------------------------------------------------------------------- the rules write nothing
CHASH, THASH = "c" * 16, "t" * 16
SWEEP = "multirun/rlvr/this-sweep"  # relative to the test's folder: the sweep's runs live under multirun/rlvr

#: the only MLflow client calls a rule may make through the store (reads)
READS = {"get_run", "search_runs", "get_metric_history", "list_artifacts", "download_artifacts", "search_experiments",
         "get_experiment", "get_experiment_by_name"}


def _read_only_store():
    """A ``tracking.Store`` over the test's SQLite store whose every write raises: its named write operations, and any
    MLflow call through :meth:`Store.call` that is not a read."""
    from orchestrator.store import tracking

    class ReadOnlyStore(tracking.Store):
        def call(self, fn, *args, **kwargs):
            name = getattr(fn, "__name__", repr(fn))
            if name not in READS:
                raise AssertionError(f"a decision rule wrote to the store: {name}{args}")
            return super().call(fn, *args, **kwargs)

    def refuse(name):
        def write(self, *args, **kwargs):
            raise AssertionError(f"a decision rule wrote to the store: Store.{name}{args}")
        return write

    for name in ("set_tags", "set_tag", "log_params", "log_metrics", "log_batch", "log_artifact", "log_inputs",
                 "create_run", "terminate", "delete_run", "metric_buffer", "send_unsent", "copy_metrics", "start_run",
                 "end_run", "running", "open"):
        setattr(ReadOnlyStore, name, refuse(name))
    return ReadOnlyStore()


@pytest.fixture
def mlstore(tmp_path, monkeypatch):
    """A real SQLite MLflow store in ``tmp_path`` (the working folder), its experiment, and a client to set runs up."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from orchestrator.point import decision
    from orchestrator.store import lease, tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lease, "SETTLE_S", 0.0)
    monkeypatch.setattr(decision, "POLL_S", 0.01)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = tracking.setup_experiment(uri, "rules", str(tmp_path / "art"))
    yield SimpleNamespace(uri=uri, exp_id=exp_id, client=MlflowClient(tracking_uri=uri), db=tmp_path / "mlflow.db",
                          root=tmp_path)
    mlflow.set_tracking_uri(None)


def _point(ms, store, *, base=True, job=1, parent=None):
    from omegaconf import OmegaConf

    from core import tags as T
    from orchestrator.point import decision
    from orchestrator.point.signals import StopSignals

    cfg = OmegaConf.create({"eval": {"base": base}, "data": {}, "engine": {"name": "local"}})
    tags = {T.CONFIG_HASH: CHASH, T.TRAIN_HASH: THASH, T.SWEEP_ID: SWEEP, T.JOB_NUM: str(job)}
    if parent:
        tags["mlflow.parentRunId"] = parent
    return decision.Point(cfg, ms.exp_id, CHASH, SWEEP, job, "algo=gspo", tags, {}, stale_s=300.0, force=False,
                          run_dir=ms.root / SWEEP / str(job), signals=StopSignals(), store=store)


def _run(ms, status="RUNNING", chash=CHASH, lease_tags=None, **tags):
    """A trained run of the point (config hash ``chash``) with ``status`` and ``tags``; ``lease_tags``: its owner's."""
    from core import tags as T

    r = ms.client.create_run(ms.exp_id, run_name="algo=gspo", tags={
        T.CONFIG_HASH: chash, T.TRAIN_HASH: THASH, T.KIND: "trained", **(lease_tags or {}), **tags})
    if status != "RUNNING":
        ms.client.set_terminated(r.info.run_id, status)
    return r.info.run_id


def _stale_lease():
    return {"rlvr.owner": "elsewhere:1:x", "rlvr.host": "another-host", "rlvr.pid": "1",
            "rlvr.heartbeat": f"{time.time() - 3600:.3f}"}


def _live_lease():
    from orchestrator.store import lease

    return lease.owner_tags(lease.new_owner())  # this process: alive


def _finished_intact(ms):
    return _run(ms, "FINISHED")


def _finished_corrupt(ms):
    """A finished run whose recorded samples.parquet differs from its integrity record."""
    import json

    rid = _run(ms, "FINISHED")
    folder = ms.root / "files"
    folder.mkdir(exist_ok=True)
    (folder / "samples.parquet").write_bytes(b"not what was recorded")
    (folder / "integrity.json").write_text(json.dumps({"artifacts": {"samples.parquet": "0" * 64}, "run_dir": {}}))
    ms.client.log_artifact(rid, str(folder / "samples.parquet"))
    ms.client.log_artifact(rid, str(folder / "integrity.json"))
    return rid


def _trained_for_another_evaluation(ms):
    folder = ms.root / SWEEP / "7"
    (folder / "checkpoint").mkdir(parents=True)
    return _run(ms, "FINISHED", chash="e" * 16, **{"rlvr.run_dir": str(folder)})


def _live_in_this_sweep(ms):
    return _run(ms, lease_tags=_live_lease(), **{"rlvr.sweep_id": SWEEP, "rlvr.job_num": "0"})


def _live_in_another_sweep(ms):
    return _run(ms, lease_tags=_live_lease(), **{"rlvr.sweep_id": "another-sweep", "rlvr.job_num": "1"})


def _stale_resumable(ms):
    """A stale RUNNING run of the point before a KILLED one whose folder is in this sweep (no steps logged)."""
    older = _run(ms, lease_tags=_stale_lease())
    time.sleep(0.01)  # runs are ordered by their start time (milliseconds)
    folder = ms.root / SWEEP / "1"
    folder.mkdir(parents=True)
    newer = _run(ms, "KILLED", lease_tags=_stale_lease(), **{"rlvr.run_dir": str(folder)})
    return newer, older


def _stale_outside(ms):
    return _run(ms, "KILLED", lease_tags=_stale_lease(), **{"rlvr.run_dir": "/etc"})


def _check_duplicate_of_finished(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.DUPLICATE and d.run.info.run_id == rid and d.backfill is True
    assert "identical effective config to finished run" in d.reason and d.summary is None


def _check_invalidate(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.INVALIDATE and d.run.info.run_id == rid and d.recover is True
    assert "samples.parquet" in d.reason and "corrupt" in d.reason


def _check_reuse(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.NEW and d.run.info.run_id == rid and d.reuse == "evaluation" and d.owner


def _check_duplicate_in_sweep(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.DUPLICATE and d.run.info.run_id == rid and not d.backfill
    assert d.reason == f"identical to point 0 of this sweep, run {rid}"


def _check_wait(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.WAIT and d.run.info.run_id == rid


def _check_resume(d, rids):
    from orchestrator.point.decision import Action

    newer, older = rids
    assert d.action is Action.RESUME and d.run.info.run_id == newer and d.owner
    assert [r.info.run_id for r in d.end] == [older]


def _check_discard(d, rid):
    from orchestrator.point.decision import Action

    assert d.action is Action.DISCARD and d.run.info.run_id == rid and "outside this sweep's folders" in d.reason


#: rule name -> [(what makes it fire, the decision it must return)]
FIRES = {
    "_trust_finished_run": [(_finished_intact, _check_duplicate_of_finished), (_finished_corrupt, _check_invalidate)],
    "_reuse_trained_checkpoint": [(_trained_for_another_evaluation, _check_reuse)],
    "_duplicate_within_sweep": [(_live_in_this_sweep, _check_duplicate_in_sweep)],
    "_wait_for_live_run": [(_live_in_another_sweep, _check_wait)],
    "_take_over_unfinished": [(_stale_resumable, _check_resume), (_stale_outside, _check_discard)],
}
CASES = [(rule, make, check) for rule, cases in FIRES.items() for make, check in cases]


def test_every_rule_has_a_case_that_makes_it_fire():
    from orchestrator.point.decision import RULES

    assert set(FIRES) == {r.__name__ for r in RULES}


def _dump(db: Path) -> list[str]:
    with sqlite3.connect(db) as con:
        return list(con.iterdump())


@pytest.mark.parametrize("rule,make,check", CASES, ids=[f"{r}-{m.__name__}" for r, m, _ in CASES])
def test_each_rule_returns_its_decision_without_writing(mlstore, rule, make, check):
    """The rule alone (a fresh pass), then the whole pass (:func:`decide`), against a store that refuses writes: the
    typed decision the case calls for, and the SQLite store byte for byte as it was."""
    from orchestrator.point import decision

    made = make(mlstore)
    pt = _point(mlstore, _read_only_store())
    fn = {r.__name__: r for r in decision.RULES}[rule]
    before = _dump(mlstore.db)
    out = fn(pt, decision.Deciding("this:1:token"))
    assert isinstance(out, decision.Decision) and isinstance(out.action, decision.Action)
    check(out, made)
    assert decision.decide(pt, decision.Deciding("this:1:token")).action is out.action  # the first rule to fire
    assert _dump(mlstore.db) == before


# ----------------------------------------------------------------------------------------------- acting on them
def _sweep_parent(ms, sweep_id, lease_tags):
    from core import tags as T

    return ms.client.create_run(ms.exp_id, run_name=f"sweep {sweep_id}", tags={
        T.KIND: "sweep", T.SWEEP_ID: sweep_id, T.COMMAND: "python sweep.py -m algo=gspo",
        "mlflow.note.content": "Sweep `python sweep.py -m algo=gspo`, running: its points are the runs beneath.",
        **lease_tags}).info.run_id


def test_a_rerun_ends_the_parent_a_killed_sweep_left_running_and_never_a_live_ones(mlstore):
    """kill -9 of a sweep during its point's validation left its parent run RUNNING for good. The re-run (a new
    sweep) takes the killed point's run over and ends that parent KILLED, saying why; a sweep whose heartbeat is fresh
    (alive on another node) keeps its parent RUNNING although a run beneath it was taken over, and so does a parent
    whose heartbeat is stale while a run beneath it is still live."""
    from orchestrator.point import act
    from orchestrator.point.decision import Action
    from orchestrator.store import mlflow_views, tracking

    ms, store = mlstore, tracking.Store()
    dead = _sweep_parent(ms, "multirun/rlvr/killed", _stale_lease())
    killed_run = _run(ms, "RUNNING", lease_tags=_stale_lease(), **{"mlflow.parentRunId": dead})
    mine = _sweep_parent(ms, SWEEP, _live_lease())
    decided = act.settle(_point(ms, store, base=False, parent=mine))
    # the killed run logged no step and its folder is not this sweep's: claimed, set aside, the point trains anew
    assert decided.action is Action.NEW
    assert ms.client.get_run(killed_run).info.status == "KILLED"
    parent = ms.client.get_run(dead)
    assert parent.info.status == "KILLED"
    assert parent.data.tags[mlflow_views.ENDED_BY_TAG].startswith(
        "ended by a later run of the sweep: its process died")
    assert "its process died" in parent.data.tags["mlflow.note.content"]
    assert "rlvr.invalid" not in parent.data.tags  # the sweep is not a result to distrust: its runs say what they are
    assert ms.client.get_run(mine).info.status == "RUNNING"  # this sweep's own parent

    # a live sweep on another node: its heartbeat is fresh
    fresh = {**_stale_lease(), "rlvr.heartbeat": f"{time.time():.3f}"}
    live = _sweep_parent(ms, "multirun/rlvr/elsewhere", fresh)
    _run(ms, "KILLED", lease_tags=_stale_lease(), chash=CHASH, **{"mlflow.parentRunId": live, "rlvr.run_dir": "/etc"})
    assert act.settle(_point(ms, store, base=False, parent=mine)).action is Action.NEW
    assert ms.client.get_run(live).info.status == "RUNNING" and mlflow_views.ENDED_BY_TAG not in \
        ms.client.get_run(live).data.tags
    # a stale parent with a live run beneath (its launcher lost, a job still training): left alone
    quiet = _sweep_parent(ms, "multirun/rlvr/quiet", _stale_lease())
    ms.client.create_run(ms.exp_id, run_name="algo=grpo", tags={"mlflow.parentRunId": quiet, "rlvr.kind": "trained",
                                                               **_live_lease()})
    assert mlflow_views.dead_sweep(quiet, 300.0, store) is None
    assert mlflow_views.dead_sweep(dead, 300.0, store) is None  # ended already: not RUNNING


def test_the_step0_memory_and_model_metrics_are_logged_once_however_many_processes_run_the_point(mlstore):
    """Each process that ran a point logged the memory plan's, the model's and the measured peak's step-0 metrics
    (``_tag_choices``) again: a point killed during its validation and resumed twice held each three times. Now the
    second and third process (their own measurements differ) leave them as the first logged them."""
    from orchestrator.point.run import _tag_choices
    from orchestrator.store import tracking

    ms, store = mlstore, tracking.Store()
    run_id = store.start_run(experiment_id=ms.exp_id, run_name="algo=gspo").info.run_id
    try:
        for peak in (1.5, 1.7, 1.9):  # one process after another, each measuring its own peak
            memory = {"layout": "padded", "layout_reason": "r", "micro_batch_tokens": 512,
                      "plan": {"total_gb": 1.2, "weights_gb": 0.5}, "run_peak_gb": peak,
                      "parameters": {"trainable": 10.0, "total": 40.0}}
            _tag_choices(SimpleNamespace(rollout=None, precision=None, memory=memory), ms.root, store, run_id)
    finally:
        store.end_run()
    keys = ("memory/plan_total_gb", "memory/plan_weights_gb", "model/trainable_params", "model/total_params",
            "model/trainable_share", "memory/run_peak_gb")
    history = {k: [(m.step, m.value) for m in ms.client.get_metric_history(run_id, k)] for k in keys}
    assert history == {"memory/plan_total_gb": [(0, 1.2)], "memory/plan_weights_gb": [(0, 0.5)],
                       "model/trainable_params": [(0, 10.0)], "model/total_params": [(0, 40.0)],
                       "model/trainable_share": [(0, 0.25)], "memory/run_peak_gb": [(0, 1.5)]}
    assert (ms.root / "memory.json").is_file()
