"""New SQLite stores as copies of a cached empty store (orchestrator.tracking.ensure_store)."""
import sqlite3

from mlflow.tracking import MlflowClient


def _schema(db):
    with sqlite3.connect(db) as con:
        tables = sorted(con.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
        version = con.execute("SELECT version_num FROM alembic_version").fetchall()
    return tables, version


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
