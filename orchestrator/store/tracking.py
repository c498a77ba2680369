"""MLflow plumbing: store creation, experiment setup, parameter flattening, finished-run lookup (the store's
pre-flight checks are :mod:`orchestrator.store.store_checks`)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from core import tags as tag_names
from orchestrator.store.store_checks import StoreError, local_path, sqlite_path
from orchestrator.store.store_checks import check_store as check_store  # re-exported: reports/build.py calls it here

log = logging.getLogger("rlvr")

# the tag names the identity rules use, under their older names (orchestrator.tags holds every tag name)
TAG_HASH, TAG_KIND, TAG_TRAIN_HASH, TAG_TRAINED_IN, TAG_DUP_OF = (tag_names.CONFIG_HASH, tag_names.KIND, tag_names.TRAIN_HASH, tag_names.TRAINED_IN,
                                                                  tag_names.DUPLICATE_OF)

#: seconds a store call keeps retrying while the tracking server is unreachable, unless the config says otherwise
#: (:meth:`Store.of`). Beyond it the call raises and the run fails, resumable.
DEFAULT_OUTAGE_S = 900.0


def _artifact_uri(root: str) -> str:
    if "://" in root:
        return root
    return Path(root).resolve().as_uri()


@contextlib.contextmanager
def file_lock(path: Path):
    """An exclusive ``fcntl`` lock on ``path`` (created if missing) for the ``with`` block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _disk_full(text: str) -> bool:
    return "No space left" in text or "disk is full" in text or "disk I/O error" in text


def _empty_store_template() -> Path:
    """An empty store with this MLflow's schema, kept in the model cache (``$RLVR_CACHE``): a new store is a copy
    of it, instead of replaying MLflow's ~60 schema migrations (about 2.5 s on a 2-core machine) every time."""
    from core.models import cache_root

    return cache_root() / "mlflow-stores" / f"empty-{mlflow.__version__}.db"


def _keep_as_template(fresh: Path, template: Path) -> None:
    """Copy a just-created, still empty store to ``template`` (atomically; best effort: a cache that cannot be
    written only costs the next store its migrations)."""
    part = template.with_name(f".{template.name}.{os.getpid()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(fresh, part)
        os.replace(part, template)
    except OSError:
        with contextlib.suppress(OSError):  # the cache path may not even be a folder
            part.unlink(missing_ok=True)


def ensure_store(uri: str) -> None:
    """Create an SQLite store once, under a file lock, on a copy that is renamed into place when its schema is
    complete: parallel jobs never race on the schema and a failure (a full disk) never leaves a half-migrated
    database behind. The copy starts from an empty store of this MLflow version cached under ``$RLVR_CACHE``
    (:func:`_empty_store_template`; made by MLflow's own migrations the first time, and again if it is damaged).
    Other stores are left to MLflow.

    Raises:
        StoreError: the schema could not be created (the cause, disk full named as such).
    """
    db = sqlite_path(uri)
    if db is None or db.exists():
        return
    with file_lock(db.with_name(db.name + ".lock")):
        if db.exists():
            return
        tmp = db.with_name(f".{db.name}.creating-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        try:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            template = _empty_store_template()
            if template.is_file() and template.stat().st_size == 0:  # SQLite would take it as an empty database
                with contextlib.suppress(OSError):
                    template.unlink()
            if template.is_file():
                try:  # MLflow finds the schema current and runs no migration
                    shutil.copyfile(template, tmp)
                    SqlAlchemyStore(f"sqlite:///{tmp}", str(tempfile.gettempdir())).engine.dispose()
                except Exception as e:  # noqa: BLE001
                    if _disk_full(str(e)):
                        raise
                    with contextlib.suppress(OSError):
                        template.unlink(missing_ok=True)  # unusable: made again below, under another name (MLflow
                    tmp.unlink(missing_ok=True)           # may keep a connection to the damaged file's name)
                    tmp = tmp.with_name(tmp.name + "-new")
            if not tmp.exists():
                SqlAlchemyStore(f"sqlite:///{tmp}", str(tempfile.gettempdir())).engine.dispose()
                _keep_as_template(tmp, template)
            os.replace(tmp, db)
        except Exception as e:
            tmp.unlink(missing_ok=True)
            text = str(e)
            cause = ("disk full (No space left on device)" if _disk_full(text)
                     else f"{type(e).__name__}: {text.splitlines()[0] if text else ''}")
            raise StoreError(f"tracking.uri={uri!r}: could not create the MLflow store at {db}: {cause}; "
                             "nothing was left behind, run again once the cause is fixed") from None


# MLflow 3's UI opens an experiment on its GenAI overview unless the experiment says it is model training
KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"


def set_experiment_kind(client: MlflowClient, experiment) -> None:
    """Tag ``experiment`` (an MLflow Experiment) as model training unless it already has a kind."""
    if KIND_TAG not in (experiment.tags or {}):
        client.set_experiment_tag(experiment.experiment_id, KIND_TAG, TRAINING_KIND)


def setup_experiment(tracking_uri: str, experiment_name: str, artifact_root: str) -> str:
    """Point MLflow at ``tracking_uri`` (creating an SQLite store with :func:`ensure_store`) and return the id of
    ``experiment_name`` (created if new, with its artifacts under ``artifact_root``/<experiment>), tagged
    ``mlflow.experimentKind=custom_model_development`` unless it has a kind (:func:`set_experiment_kind`). Every step
    is idempotent: :meth:`Store.open` is this call as a whole, waiting out an outage as its store does (called here
    directly, it is tried once)."""
    ensure_store(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)

    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        try:
            location = (_artifact_uri(str(Path(artifact_root) / experiment_name)) if local_path(artifact_root) is not None
                        else f"{artifact_root.rstrip('/')}/{experiment_name}")
            client.create_experiment(experiment_name, artifact_location=location, tags={KIND_TAG: TRAINING_KIND})
        except Exception:  # created concurrently by another job
            pass
        exp = client.get_experiment_by_name(experiment_name)
        if exp is None:
            raise StoreError(f"experiment_name={experiment_name!r}: could not be created in {tracking_uri}")
    set_experiment_kind(client, exp)  # an experiment made before, or by hand: the UI opens on its runs table
    return exp.experiment_id


def flatten(d, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists are kept as their string form."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


_TRANSIENT = re.compile(
    r"database is locked|max retries exceeded|connection refused|failed to establish a new connection"
    r"|connection aborted|remotedisconnected|connection reset|read timed out|temporarily_unavailable"
    r"|error code 50[234]\b", re.IGNORECASE)


_CONFLICT = re.compile(r"duplicate key value violates unique constraint|UNIQUE constraint failed|Duplicate entry"
                       r"|UniqueViolation|IntegrityError", re.IGNORECASE)
CONFLICT_TRIES = 3  # a write that lost a race to insert the same row is made again this many times at most


def conflict(e: BaseException) -> bool:
    """True for a write that lost a race: two processes inserted the same new row at once (the same new tag on one
    run: MLflow's SQL store selects, then inserts, so the second insert violates the table's key; seen over
    PostgreSQL when two jobs recorded the sweep's evaluation protocol at the same moment). Made again, the write
    finds the row and updates it."""
    return bool(_CONFLICT.search(str(e)))


def transient(e: BaseException) -> bool:
    """True for a store error that passes: SQLite's "database is locked" (parallel jobs, one file), a tracking
    server that cannot be reached or resets the connection (MLflow's own HTTP retries exhausted), or one that
    answers 502/503/504 (a proxy in front of a restarting server; MLflow answers 503 for a database deadlock)."""
    return bool(_TRANSIENT.search(str(e))) or getattr(e, "error_code", "") == "TEMPORARILY_UNAVAILABLE"


def retry(fn, *args, outage_s: float = DEFAULT_OUTAGE_S, **kwargs):
    """``fn(*args, **kwargs)`` waiting out an unreachable store for up to ``outage_s`` seconds: :meth:`Store.call`
    for a store built for one call (a run builds its :class:`Store` once and calls through it)."""
    return Store(outage_s).call(fn, *args, **kwargs)


class MetricBuffer:
    """A run's metrics, sent in order by one background thread, so that training never waits on the store.

    :meth:`put` stamps the metrics (their timestamp is fixed then, so a resend after a lost reply is dropped by
    the store as a duplicate) and returns at once; the thread sends each put in one or more ``log_batch`` calls,
    through :func:`retry`, never reordering. :meth:`flush` waits until everything is sent. When the store stays
    unreachable past the ``store``'s outage limit (:class:`Store`), what is unsent is written to ``unsent`` (JSON
    lines: key, value, timestamp, step) for :meth:`Store.send_unsent` to deliver when the run resumes, and
    :meth:`flush` raises :class:`StoreError`. As a context manager, it is closed (:meth:`close`) on leaving."""

    def __init__(self, store: Store, run_id: str, unsent: Path):
        self.store, self.run_id, self.unsent = store, run_id, Path(unsent)
        self._q: queue.Queue = queue.Queue()
        self._error: Exception | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._send, daemon=True, name=f"rlvr-metrics-{run_id[:8]}")
        self._thread.start()

    def put(self, metrics: dict, step: int) -> None:
        """Queue ``metrics`` ({key: number}) at training step ``step``; returns at once."""
        ts = int(time.time() * 1000)
        self._q.put([Metric(k, float(v), ts, int(step)) for k, v in metrics.items()])

    def _send(self) -> None:
        while True:
            items = self._q.get()
            try:
                if items is None:
                    return
                sent = 0
                if self._error is None:
                    try:
                        while sent < len(items):  # MLflow takes at most 1,000 metrics per call
                            self.store.call(self.store.client.log_batch, self.run_id, metrics=items[sent:sent + 500])
                            sent += 500
                    except Exception as e:
                        self._error = e
                if self._error is not None:  # keep every later metric too, in order
                    with open(self.unsent, "a") as f:
                        for m in items[sent:]:
                            f.write(json.dumps([m.key, m.value, m.timestamp, m.step]) + "\n")
            finally:
                self._q.task_done()

    def flush(self) -> None:
        """Wait until every metric put so far is sent; :class:`StoreError` if the store was lost for good."""
        self._q.join()
        if self._error is not None:
            raise StoreError(f"the MLflow store was unreachable for over {self.store.wait_s:.0f} s (tracking.outage_s)"
                             f": {str(self._error).splitlines()[0][:300]}; unsent metrics kept in "
                             f"{self.unsent}, sent when the run resumes")

    def close(self) -> None:
        """Stop the thread once the queue is drained (the metrics still queued are sent or kept first)."""
        if not self._closed:
            self._closed = True
            self._q.put(None)
            self._thread.join()

    def __enter__(self) -> MetricBuffer:
        return self

    def __exit__(self, *exc) -> bool:
        self.close()  # what is still queued is sent, or kept in ``unsent`` for the resumed run
        return False


class Store:
    """The MLflow tracking store as the suite uses it: one client, one outage limit, and the operations the
    orchestrator performs by name (runs with a hash, tag, terminate with a reason, log an artifact, ...).

    Every operation goes through :meth:`call`: while the store is unreachable it is tried again, for up to
    ``wait_s`` seconds (the config's outage limit, :meth:`of`), then it raises and the run fails, resumable. An operation given no ``run_id`` acts on this thread's active run (MLflow's fluent API), which
    :meth:`start_run`, :meth:`end_run` and :meth:`running` open and close; the client is made on first use, so a
    store built before :meth:`open` talks to the store :meth:`open` pointed MLflow at. Nothing in ``orchestrator/``
    outside ``orchestrator/store/`` calls MLflow or this client itself (tests/test_orchestrator_rules.py).

    Args:
        wait_s: seconds an operation waits out an unreachable store.
        client: the MLflow client to use (default: one for the current tracking URI, made on first use).
    """

    def __init__(self, wait_s: float = DEFAULT_OUTAGE_S, client: MlflowClient | None = None):
        self.wait_s = float(wait_s)
        self._client = client

    @classmethod
    def of(cls, cfg) -> Store:
        """The store of ``cfg`` (a run's or a sweep's config): its outage limit, else :data:`DEFAULT_OUTAGE_S`."""
        limit = cfg.tracking.get("outage_s")
        return cls(DEFAULT_OUTAGE_S if limit is None else float(limit))

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient()
        return self._client

    def call(self, fn, *args, **kwargs):
        """Call ``fn(*args, **kwargs)``; while it fails with a :func:`transient` store error, call it again with
        exponential backoff (0.2 s doubling, at most 15 s apart) for up to :attr:`wait_s` seconds, then raise the
        last error. A write that lost a race to insert the same row (:func:`conflict`) is made again at once, at most
        :data:`CONFLICT_TRIES` times. Any other error raises at once. Safe for the calls this suite makes: MLflow's SQL
        store drops a metric it already holds (same key, step, timestamp and value), and tags and parameters are set,
        not added."""
        deadline = time.monotonic() + self.wait_s
        delay, warned, conflicts = 0.2, False, 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # sqlalchemy OperationalError or an HTTP failure, wrapped by MLflow
                if conflict(e) and conflicts < CONFLICT_TRIES:  # a race for one new row: the row exists now
                    conflicts += 1
                    time.sleep(0.05 * conflicts)
                    continue
                remaining = deadline - time.monotonic()
                if not transient(e) or remaining <= 0:
                    raise
                if not warned and "locked" not in str(e).lower():
                    log.warning("the MLflow store is unreachable (%s); retrying for up to %.0f s",
                                str(e).splitlines()[0][:200], self.wait_s)
                    warned = True
                time.sleep(min(delay, remaining))  # the last try at the deadline
                delay = min(2 * delay, 15.0)

    def open(self, tracking_uri: str, experiment_name: str, artifact_root: str) -> str:
        """Point MLflow at the store and return the experiment's id (:func:`setup_experiment`, retried)."""
        return self.call(setup_experiment, str(tracking_uri), str(experiment_name), str(artifact_root))

    # ---------------------------------------------------------------- this thread's active run (MLflow's fluent API)
    def start_run(self, run_id: str | None = None, experiment_id: str | None = None, run_name: str | None = None,
                  tags: dict | None = None):
        """Make a run this thread's active run: ``run_id`` (an existing run, set RUNNING again: a resume), or a new run
        of ``experiment_id`` named ``run_name`` with ``tags``. Returns MLflow's ``ActiveRun`` (a ``Run``)."""
        return self.call(mlflow.start_run, run_id=run_id, experiment_id=experiment_id, run_name=run_name, tags=tags)

    def end_run(self, status: str = "FINISHED") -> None:
        """End this thread's active run with ``status`` (none active: nothing happens)."""
        active = mlflow.active_run()
        if active is None:
            return
        try:
            mlflow.end_run(status)
        except Exception:
            # MLflow takes the run off this thread's stack before its call to the store: end it through the client
            self.call(self.client.set_terminated, active.info.run_id, status)

    @contextlib.contextmanager
    def running(self, experiment_id: str, run_name: str, tags: dict):
        """``with store.running(...) as run``: a new active run (:meth:`start_run`), ended FINISHED when the block
        returns and FAILED (KILLED for Ctrl-C) when it raises, as MLflow's own ``with mlflow.start_run()`` ends it."""
        run = self.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags)
        try:
            yield run
        except BaseException as e:
            self.end_run("KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
            raise
        self.end_run()

    @staticmethod
    def active_run_id() -> str | None:
        """The id of this thread's active run, or None."""
        active = mlflow.active_run()
        return active.info.run_id if active is not None else None

    @classmethod
    def at(cls, tracking_uri: str, wait_s: float = DEFAULT_OUTAGE_S) -> Store:
        """A store on ``tracking_uri`` without pointing MLflow's active-run API at it (the commands that read a store
        they are given: ``python -m orchestrator.clean``, ``python -m orchestrator.reproduce``)."""
        return cls(wait_s, MlflowClient(tracking_uri=str(tracking_uri)))

    # ---------------------------------------------------------------- writing
    def set_tags(self, tags: dict, run_id: str | None = None) -> None:
        """Set ``tags`` ({name: value}) on ``run_id``, or on the active run."""
        if run_id is None:
            self.call(mlflow.set_tags, tags)
        else:
            for k, v in tags.items():
                self.call(self.client.set_tag, run_id, k, v)

    def set_tag(self, key: str, value, run_id: str | None = None) -> None:
        """Set one tag on ``run_id``, or on the active run."""
        self.set_tags({key: value}, run_id)

    def log_params(self, params: dict, run_id: str | None = None) -> None:
        """Log ``params`` ({name: value}) on ``run_id`` (in batches of 90, :meth:`log_batch`), or on the active run."""
        if run_id is None:
            self.call(mlflow.log_params, params)
        else:
            self.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def log_metrics(self, values: dict, step: int = 0, run_id: str | None = None) -> None:
        """Log ``values`` ({key: number}) at ``step`` on ``run_id`` (in batches of 500: MLflow takes at most 1,000
        per call), or on the active run."""
        if run_id is None:
            self.call(mlflow.log_metrics, values, step=step)
            return
        ts = int(time.time() * 1000)
        self.log_batch(run_id, [Metric(k, float(v), ts, int(step)) for k, v in values.items()])

    def log_batch(self, run_id: str, metrics=(), params=()) -> None:
        """Log MLflow ``Metric`` and ``Param`` records on ``run_id``, in batches MLflow takes (500 metrics, 90
        parameters per call), in order."""
        metrics, params = list(metrics), list(params)
        for a in range(0, len(metrics), 500):
            self.call(self.client.log_batch, run_id, metrics=metrics[a:a + 500])
        for a in range(0, len(params), 90):
            self.call(self.client.log_batch, run_id, params=params[a:a + 90])

    def log_artifact(self, path, dest: str | None = None, run_id: str | None = None) -> None:
        """Log the file ``path`` under the artifact folder ``dest`` (None: the top) of ``run_id``, or of the active
        run."""
        if run_id is None:
            self.call(mlflow.log_artifact, str(path), dest or None)
        else:
            self.call(self.client.log_artifact, run_id, str(path), dest or None)

    def log_inputs(self, run_id: str, datasets: list) -> None:
        """Log MLflow ``DatasetInput`` records on ``run_id``."""
        self.call(self.client.log_inputs, run_id, datasets=datasets)

    def create_run(self, exp_id: str, name: str, tags: dict):
        """A new RUNNING run (not the active run) of experiment ``exp_id`` with ``tags``."""
        return self.call(self.client.create_run, exp_id, run_name=name, tags=tags)

    def terminate(self, run_id: str, status: str = "KILLED", reason: str | None = None) -> None:
        """End ``run_id`` with ``status``; with a ``reason``, first mark it not to be trusted (tag
        ``rlvr.invalid``: :data:`orchestrator.tags.INVALID`), so no later decision takes it as a result."""
        if reason is not None:
            self.set_tag(tag_names.INVALID, reason[:4900], run_id)
        self.call(self.client.set_terminated, run_id, status)

    def delete_run(self, run_id: str) -> None:
        """Delete ``run_id`` (MLflow keeps it in its trash: a run that gave way to an identical one started first)."""
        self.call(self.client.delete_run, run_id)

    def metric_buffer(self, run_id: str, unsent: Path) -> MetricBuffer:
        """A :class:`MetricBuffer` for ``run_id`` through this store, keeping what it cannot send in ``unsent``."""
        return MetricBuffer(self, run_id, unsent)

    def send_unsent(self, run_id: str, unsent: Path) -> int:
        """Send the metrics a lost store left in ``unsent`` (by :class:`MetricBuffer`) to ``run_id``, in their
        order, then delete the file; the number sent (0 when there is no file)."""
        unsent = Path(unsent)
        if not unsent.exists():
            return 0
        items = [Metric(k, v, ts, step) for k, v, ts, step in
                 (json.loads(line) for line in unsent.read_text().splitlines() if line.strip())]
        self.log_batch(run_id, items)
        unsent.unlink()
        return len(items)

    def copy_metrics(self, src_run_id: str, dst_run_id: str, prefix: str) -> int:
        """Copy every metric history of ``src_run_id`` whose key starts with ``prefix`` into ``dst_run_id`` (each value
        with its step and timestamp); returns the last step copied (-1 when none)."""
        last, items = -1, []
        for key in self.run(src_run_id).data.metrics:
            if key.startswith(prefix):
                for m in self.metric_history(src_run_id, key):
                    items.append(Metric(key, m.value, m.timestamp, m.step))
                    last = max(last, m.step)
        self.log_batch(dst_run_id, items)
        return last

    # ---------------------------------------------------------------- reading
    def run(self, run_id: str):
        """The run ``run_id`` (MLflow's ``Run``)."""
        return self.call(self.client.get_run, run_id)

    def find_run(self, run_id: str):
        """The run ``run_id``, or None when the store has no such run (a store that cannot be reached raises, after
        waiting out the outage)."""
        from mlflow.exceptions import MlflowException

        try:
            return self.run(run_id)
        except MlflowException as e:
            if transient(e):
                raise
            return None

    def experiment_ids(self) -> list[str]:
        """The ids of every experiment of the store."""
        return [e.experiment_id for e in self.call(self.client.search_experiments)]

    def all_runs(self, exp_ids: list[str], max_results: int = 50000) -> list:
        """Every run of the experiments ``exp_ids`` (MLflow's default order)."""
        return self.call(self.client.search_runs, list(exp_ids), max_results=max_results) if exp_ids else []

    def held_at_step(self, run_id: str, keys, step: int = 0) -> set[str]:
        """Which of the metric ``keys`` ``run_id`` already holds a value of at ``step`` (the once-per-run metrics a
        resumed run must not log again)."""
        held = set(self.run(run_id).data.metrics) & set(keys)
        return {k for k in held if any(m.step == step for m in self.metric_history(run_id, k))}

    def download_artifacts(self, run_id: str, path: str, dst_path: str) -> str:
        """Download the artifact ``path`` of ``run_id`` into the folder ``dst_path``; the local path (MLflow client's
        ``download_artifacts``, so :mod:`orchestrator.point.integrity` takes a store or a client alike)."""
        return self.call(self.client.download_artifacts, run_id, path, dst_path)

    def search(self, exp_id: str, filter_string: str, max_results: int = 1000) -> list:
        """The runs of ``exp_id`` that match ``filter_string``, oldest first."""
        return self.call(self.client.search_runs, [exp_id], filter_string=filter_string,
                         order_by=["attributes.start_time ASC"], max_results=max_results)

    def runs_with_hash(self, exp_id: str, value: str, kind: str = "trained", tag: str = TAG_HASH) -> list:
        """The runs of ``exp_id`` whose ``tag`` (the config hash, or :data:`TAG_TRAIN_HASH`) is ``value`` and whose
        kind is ``kind``, oldest first."""
        return self.search(exp_id, f"tags.`{tag}` = '{value}' and tags.`{TAG_KIND}` = '{kind}'")

    def finished_run(self, exp_id: str, config_hash: str):
        """The earliest FINISHED trained run of ``exp_id`` with this config hash, or None."""
        runs = self.search(exp_id, f"tags.`{TAG_HASH}` = '{config_hash}' and tags.`{TAG_KIND}` = 'trained' "
                                   "and attributes.status = 'FINISHED'", max_results=1)
        return runs[0] if runs else None

    def metric_history(self, run_id: str, key: str) -> list:
        """Every value of metric ``key`` of ``run_id`` (MLflow ``Metric`` records)."""
        return self.call(self.client.get_metric_history, run_id, key)

    def list_artifacts(self, run_id: str, path: str | None = None) -> list:
        """The artifacts (MLflow ``FileInfo`` records) of ``run_id`` directly under ``path`` (None: the top)."""
        return self.call(self.client.list_artifacts, run_id, path)
