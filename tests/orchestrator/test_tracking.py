"""New SQLite stores as copies of a cached empty store (orchestrator.tracking.ensure_store)."""
import sqlite3

from mlflow.tracking import MlflowClient


def _schema(db):
    """Tables and indexes with their definitions, and the schema version. A definition's lines are compared as a
    set: MLflow's own migrations write a table's CHECK constraints in an order that varies from run to run."""
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
    return sorted((t, n, tuple(sorted(ln.strip().rstrip(",").strip() for ln in (sql or "").splitlines())))
                  for t, n, sql in rows), version


def test_a_new_store_is_a_copy_of_the_cached_empty_store_and_a_bad_template_is_replaced(tmp_path, monkeypatch):
    from orchestrator import tracking

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
    from orchestrator import tracking

    (tmp_path / "cache").write_text("a file where the cache folder would be")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    tracking.ensure_store(f"sqlite:///{tmp_path / 'a.db'}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'a.db'}")
    run = client.create_run(client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri()))
    client.log_metric(run.info.run_id, "m", 2.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 2.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "a.db.lock", "cache"]  # no partial file left
