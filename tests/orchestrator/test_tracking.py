"""MLflow plumbing: new SQLite stores as copies of a cached empty store (orchestrator.store.tracking.ensure_store); store
calls that wait out an unreachable server (tracking.retry) and the metric buffer that keeps what a lost store missed."""
import sqlite3

import pytest
from mlflow.tracking import MlflowClient


def _schema(db):
    """Tables and indexes with their definitions, and the schema version. A definition's lines are compared as a
    set: MLflow's own migrations write a table's CHECK constraints in an order that varies from run to run."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
    return sorted((t, n, tuple(sorted(ln.strip().rstrip(",").strip() for ln in (sql or "").splitlines())))
                  for t, n, sql in rows), version


@pytest.mark.slow
def test_a_new_store_is_a_copy_of_the_cached_empty_store_and_a_bad_template_is_replaced(tmp_path, monkeypatch):
    from orchestrator.store import tracking

    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    template = tracking._empty_store_template()
    assert not template.exists()

    tracking.ensure_store(f"sqlite:///{tmp_path / 'a.db'}")  # MLflow's migrations, then kept as the template
    assert template.is_file() and _schema(template) == _schema(tmp_path / "a.db")

    tracking.ensure_store(f"sqlite:///{tmp_path / 'b.db'}")  # a copy: the same tables, indexes and schema version
    assert _schema(tmp_path / "b.db") == _schema(tmp_path / "a.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'b.db'}")
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "m", 1.5)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.5}
    assert [e.name for e in client.search_experiments()] == ["e", "Default"]
    assert _schema(template)[1] == _schema(tmp_path / "a.db")[1]  # the template itself was not written to

    template.write_text("not a database")  # a damaged template: the store is made by migrations, the template again
    tracking.ensure_store(f"sqlite:///{tmp_path / 'c.db'}")
    assert _schema(tmp_path / "c.db") == _schema(tmp_path / "a.db") and _schema(template) == _schema(tmp_path / "a.db")

    template.write_text("")  # an empty file (SQLite reads it as an empty database): replaced, not copied
    tracking.ensure_store(f"sqlite:///{tmp_path / 'd.db'}")
    assert _schema(tmp_path / "d.db") == _schema(tmp_path / "a.db") and _schema(template) == _schema(tmp_path / "a.db")


def test_a_cache_path_that_is_not_a_folder_only_costs_the_migrations(tmp_path, monkeypatch):
    from orchestrator.store import tracking

    (tmp_path / "cache").write_text("a file where the cache folder would be")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    tracking.ensure_store(f"sqlite:///{tmp_path / 'a.db'}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'a.db'}")
    run = client.create_run(client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri()))
    client.log_metric(run.info.run_id, "m", 2.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 2.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "a.db.lock", "cache"]  # no partial file left


@pytest.mark.slow
def test_store_calls_wait_out_an_unreachable_server_and_only_that(monkeypatch):
    """tracking.retry against a port nothing listens on (a real refused connection through MLflow's client): it
    keeps trying until tracking.outage_s, then raises MLflow's error; an error that is not an outage raises at once."""
    import time

    import pytest
    from mlflow.exceptions import MlflowException

    from orchestrator.store import tracking

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own retries off: the suite's alone
    client = MlflowClient(tracking_uri="http://127.0.0.1:9")
    calls = []

    def get():
        calls.append(time.monotonic())
        return client.get_experiment_by_name("x")

    t0 = time.monotonic()
    with pytest.raises(MlflowException) as e:
        tracking.retry(get, outage_s=3.0)
    assert tracking.transient(e.value) and 2.0 < time.monotonic() - t0 < 6.0
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) >= 4 and gaps[-1] > gaps[0]  # several tries, further apart each time (backoff)

    calls.clear()
    with pytest.raises(ValueError):
        tracking.retry(lambda: calls.append(1) or (_ for _ in ()).throw(ValueError("bad value")))
    assert calls == [1]
    assert tracking.transient(RuntimeError("(sqlite3.OperationalError) database is locked"))
    assert tracking.transient(MlflowException("API request to endpoint /x failed with error code 503 != 200"))
    assert not tracking.transient(MlflowException("RESOURCE_DOES_NOT_EXIST: run 5035 not found"))


def test_metrics_a_lost_store_did_not_take_are_kept_in_order_and_sent_on_resume(tmp_path, monkeypatch):
    """MetricBuffer against a server that cannot be reached past tracking.outage_s: flush raises StoreError
    naming tracking.outage_s; every metric put is in the unsent file, in order; Store.send_unsent delivers them to a
    real store, where each step's values are those put."""
    import pytest

    from orchestrator.store import tracking

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    unsent = tmp_path / "unsent_metrics.jsonl"
    lost = tracking.Store(0.5, MlflowClient(tracking_uri="http://127.0.0.1:9"))
    buf = lost.metric_buffer("0" * 32, unsent)
    for step in range(3):
        buf.put({"train/reward_mean": step / 4, "train/loss": -step}, step)  # returns at once
    with pytest.raises(tracking.StoreError, match="tracking.outage_s"):
        buf.flush()
    buf.close()
    assert len(unsent.read_text().splitlines()) == 6

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri()))
    store = tracking.Store(client=client)
    assert store.send_unsent(run.info.run_id, unsent) == 6 and not unsent.exists()
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/reward_mean"))
    assert hist == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [m.value for m in sorted(client.get_metric_history(run.info.run_id, "train/loss"), key=lambda m: m.step)] \
        == [0.0, -1.0, -2.0]
    assert store.send_unsent(run.info.run_id, unsent) == 0  # nothing left: nothing sent twice


@pytest.mark.slow
def test_the_store_object_reads_its_limit_from_the_config_and_names_its_operations(tmp_path):
    """tracking.Store: the outage limit from ``tracking.outage_s`` (the default when the key is absent); its named
    operations against a real SQLite store, read back through a plain MLflow client: tags on a run by id, metrics in
    batches over MLflow's 1,000-per-call limit, a run ended with a reason (marked invalid first, then KILLED), the runs
    with a hash oldest first and the finished one among them."""
    import time

    from omegaconf import OmegaConf

    from core import tags as T
    from orchestrator.store import tracking

    assert tracking.Store.of(OmegaConf.create({"tracking": {"outage_s": 7}})).wait_s == 7.0
    assert tracking.Store.of(OmegaConf.create({"tracking": {}})).wait_s == tracking.DEFAULT_OUTAGE_S

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking.ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    store = tracking.Store(5.0, client)
    first = store.create_run(exp, "a", {T.CONFIG_HASH: "h1", T.KIND: "trained"})
    time.sleep(0.01)  # start times in milliseconds: "oldest first" is then one order
    second = store.create_run(exp, "b", {T.CONFIG_HASH: "h1", T.KIND: "trained"})
    store.create_run(exp, "c", {T.CONFIG_HASH: "h2", T.KIND: "trained"})
    store.set_tags({"x": "1", "y": "2"}, first.info.run_id)
    store.log_metrics({f"m{i}": float(i) for i in range(1200)}, 3, first.info.run_id)
    run = client.get_run(first.info.run_id)
    assert run.data.tags["x"] == "1" and run.data.tags["y"] == "2"
    assert len(run.data.metrics) == 1200 and run.data.metrics["m1199"] == 1199.0
    assert [m.step for m in store.metric_history(first.info.run_id, "m7")] == [3]

    store.terminate(second.info.run_id, "KILLED", "its checkpoint is missing")
    ended = client.get_run(second.info.run_id)
    assert ended.info.status == "KILLED" and ended.data.tags[T.INVALID] == "its checkpoint is missing"
    assert [r.info.run_id for r in store.runs_with_hash(exp, "h1")] == [first.info.run_id, second.info.run_id]
    assert store.finished_run(exp, "h1") is None
    store.terminate(first.info.run_id, "FINISHED")
    assert store.finished_run(exp, "h1").info.run_id == first.info.run_id
    assert T.INVALID not in client.get_run(first.info.run_id).data.tags  # ended without a reason: trusted


def test_a_write_that_lost_a_race_for_a_new_row_is_made_again_and_only_a_few_times():
    """Seen in CI (2026-12-06, the PostgreSQL store): two jobs set the sweep's new evaluation-protocol tag at the same
    moment; MLflow's SQL store selects then inserts, and the second insert failed with a unique-key violation, which
    failed the sweep. Store.call makes such a write again (the row exists then: an update), at most CONFLICT_TRIES
    times; the error text is psycopg's own. Any other error still raises at once."""
    import pytest
    from mlflow.exceptions import RestException

    from orchestrator.store import tracking

    text = ('BAD_REQUEST: (psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "tag_pk"\n'
            'DETAIL:  Key (key, run_uuid)=(rlvr.eval_protocol.8f34dc5c5935, a44801ad) already exists.')
    calls = []

    def lost_twice():
        calls.append(1)
        if len(calls) <= 2:
            raise RestException({"error_code": "BAD_REQUEST", "message": text})
        return "set"

    store = tracking.Store(60.0)
    assert store.call(lost_twice) == "set" and len(calls) == 3
    calls.clear()

    def always():
        calls.append(1)
        raise RestException({"error_code": "BAD_REQUEST", "message": text})

    with pytest.raises(RestException):
        store.call(always)
    assert len(calls) == tracking.CONFLICT_TRIES + 1  # not the store's 60 s outage wait
    assert tracking.conflict(RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: tags.key, tags.run_uuid"))
    assert not tracking.conflict(RuntimeError("RESOURCE_DOES_NOT_EXIST: run 5035 not found"))
