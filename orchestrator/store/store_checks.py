"""Pre-flight checks of the tracking store and of the folders a run or sweep writes to, made in seconds before
anything is created: a store URI's scheme, an SQLite file's folder and header, a server's or database's answer,
Databricks credentials, a writable folder with space (:func:`check_store`, :func:`check_writable`); and the
:class:`StoreError` they raise, one line naming the setting. :mod:`orchestrator.store.tracking` creates and uses the
store once these checks have passed."""
from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlparse


class StoreError(RuntimeError):
    """The tracking store or a folder the sweep writes to cannot be used; the message is one line naming it."""


SERVER_SCHEMES = ("http", "https", "databricks", "postgresql", "mysql", "mssql")
DB_SCHEMES = ("postgresql", "mysql", "mssql")


def sqlite_path(uri: str) -> Path | None:
    """The database file of an ``sqlite:///PATH`` URI (relative to the working directory), else None."""
    if not uri.startswith("sqlite:"):
        return None
    rest = uri[len("sqlite:"):]
    if not rest.startswith("///"):
        raise StoreError(f"tracking.uri={uri!r}: expected sqlite:///PATH (three slashes, then the file's path)")
    return Path(rest[3:] or ".")


def local_path(uri_or_path: str) -> Path | None:
    """The folder of a plain path or ``file:`` URI, else None (a remote location)."""
    scheme = urlparse(uri_or_path).scheme
    if "://" not in uri_or_path and not uri_or_path.startswith("file:") and (len(scheme) <= 1 or scheme == ""):
        return Path(uri_or_path)  # a path (a one-letter "scheme" is a Windows drive); mlflow-artifacts:/ is remote
    parsed = urlparse(uri_or_path)
    return Path(parsed.path) if parsed.scheme == "file" else None


def _existing_ancestor(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(path: Path, what: str, min_free_mb: float) -> None:
    """Raise :class:`StoreError` unless a file can be created in ``path`` (or its nearest existing folder; ``path``
    itself may be an existing file) and its filesystem has ``min_free_mb`` MB free. ``what`` names the setting in the
    message; the cause is named as it is: a file where a folder must be, a folder that cannot be written (read-only,
    no permission, a pseudo-filesystem such as /proc), a full disk (only a writable folder can be full)."""
    path = Path(os.path.abspath(path))
    folder = _existing_ancestor(path)
    if folder.is_file():
        if folder != path:
            raise StoreError(f"{what}: {folder} is a file, so {path} cannot be made under it; choose a folder")
        folder = folder.parent
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".rlvr-write-test-") as f:
            f.write(b"x")
            f.flush()
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise StoreError(f"{what}: disk full: no space left on the filesystem of {folder}; free space and run "
                             "again") from None
        if e.errno == errno.ENOENT:  # the folder exists, yet a file cannot be made in it: /proc, /sys
            raise StoreError(f"{what}: {folder} cannot hold files (a virtual filesystem such as /proc or /sys); "
                             "choose a folder on a disk") from None
        raise StoreError(f"{what}: {folder} is not writable ({e.strerror or e})") from None
    free_mb = shutil.disk_usage(folder).free / 2**20
    if free_mb < min_free_mb:
        raise StoreError(f"{what}: disk full: {free_mb:.1f} MB free on the filesystem of {folder} "
                         f"(need tracking.min_free_mb={min_free_mb:g}); free space and run again")


def check_store(uri: str, artifact_root: str, min_free_mb: float = 100.0, timeout_s: float = 5.0) -> None:
    """Pre-flight of the tracking store, in seconds: a known scheme; for SQLite, a writable folder and database
    file with ``min_free_mb`` free; for a server, an answer to ``/health`` within ``timeout_s``; a writable local
    artifact root with space.

    Raises:
        StoreError: one line naming ``tracking.uri`` or ``tracking.artifact_root`` and the cause.
    """
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(uri, db, min_free_mb)
    else:
        _check_other_store(uri, min_free_mb, timeout_s)
    _check_artifact_root(uri, artifact_root, min_free_mb)


def _check_sqlite(uri: str, db: Path, min_free_mb: float) -> None:
    """An SQLite store (``db``, the file of ``uri``) can be used: its folder exists and is writable with
    ``min_free_mb`` free, and a file already there is a writable SQLite database (a typo'd folder would otherwise
    start a new, empty store).

    Raises:
        StoreError: one line naming ``tracking.uri`` and the cause.
    """
    check_writable(db, f"tracking.uri={uri!r}", min_free_mb)
    if not db.parent.is_dir():  # a typo'd folder would start a new, empty store (de-duplication sees no runs)
        raise StoreError(f"tracking.uri={uri!r}: the folder {db.parent} does not exist; a store is created only in "
                         f"an existing folder (to start one there on purpose: mkdir -p {db.parent})")
    if db.exists():
        if db.is_dir():
            raise StoreError(f"tracking.uri={uri!r}: {db} is a folder, not an SQLite file")
        try:
            with open(db, "rb") as f:
                head = f.read(16)
        except OSError:
            head = b""
        if head and head != b"SQLite format 3\x00":
            raise StoreError(f"tracking.uri={uri!r}: {db} is not an SQLite database (a store is an MLflow "
                             "SQLite file; name a new file to start one)")
        try:
            with open(db, "r+b"):
                pass
        except OSError as e:
            raise StoreError(f"tracking.uri={uri!r}: {db} is not writable ({e.strerror or e})") from None


def _check_other_store(uri: str, min_free_mb: float, timeout_s: float) -> None:
    """A store that is not an SQLite file, by its scheme: a tracking server answers ``/health`` within
    ``timeout_s``; a folder store is allowed (``MLFLOW_ALLOW_FILE_STORE``) and writable; a database answers
    (:func:`_check_database`); Databricks has credentials (:func:`_check_databricks`).

    Raises:
        StoreError: one line naming ``tracking.uri`` and the cause (an unknown scheme among them).
    """
    scheme = "databricks" if uri.split(":")[0] == "databricks" else urlparse(uri).scheme  # "databricks[://profile]"
    if scheme in ("http", "https"):
        import urllib.request

        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).read()
        except Exception as e:
            raise StoreError(f"tracking.uri={uri!r}: the tracking server does not answer ({e})") from None
    elif scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] == ":\\"):
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
            raise StoreError(f"tracking.uri={uri!r}: a folder store, which this MLflow refuses (its file store is "
                             "in maintenance mode); use sqlite:///mlflow.db, or set MLFLOW_ALLOW_FILE_STORE=true")
        check_writable(local_path(uri), f"tracking.uri={uri!r}", min_free_mb)
    elif scheme.split("+")[0] not in SERVER_SCHEMES:
        raise StoreError(f"tracking.uri={uri!r}: unknown scheme {scheme!r}; expected sqlite:///PATH, a folder, "
                         f"http(s)://HOST:PORT or one of {list(DB_SCHEMES)}")
    elif scheme.split("+")[0] in DB_SCHEMES:
        _check_database(uri, timeout_s)
    elif scheme == "databricks":
        _check_databricks(uri)


def _check_databricks(uri: str) -> None:
    """A Databricks store can be reached from here: MLflow's databricks-sdk is installed and credentials are found
    (the environment or ~/.databrickscfg; no request is made, so the check takes no time).

    Raises:
        StoreError: one line naming ``tracking.uri`` and the missing package or MLflow's reason.
    """
    import importlib.util

    if importlib.util.find_spec("databricks.sdk") is None:
        raise StoreError(f"tracking.uri={uri!r}: MLflow needs the databricks-sdk package for it (pip install "
                         "databricks-sdk), and Databricks credentials")
    from mlflow.utils.databricks_utils import get_databricks_host_creds

    quiet = logging.getLogger("mlflow.utils.databricks_utils")
    was, quiet.disabled = quiet.disabled, True  # its warning would be a second line
    try:  # the credentials read from the environment or ~/.databrickscfg (no request is made)
        get_databricks_host_creds(uri)
    except Exception as e:  # noqa: BLE001 -- MLflow's own reason, its first sentence
        raise StoreError(f"tracking.uri={uri!r}: no Databricks credentials here ({str(e).split('. ')[0]}; "
                         "set DATABRICKS_HOST and DATABRICKS_TOKEN or a ~/.databrickscfg profile)") from None
    finally:
        quiet.disabled = was


def _check_artifact_root(uri: str, artifact_root: str, min_free_mb: float) -> None:
    """The artifact root can hold the runs' files: a local one is a writable folder with ``min_free_mb`` free; one
    served by an MLflow server (``mlflow-artifacts:``) needs the store ``uri`` to be that server.

    Raises:
        StoreError: one line naming ``tracking.artifact_root`` and the cause.
    """
    art = local_path(artifact_root)
    if art is not None:
        if art.exists() and not art.is_dir():
            raise StoreError(f"tracking.artifact_root={artifact_root!r}: {art} is a file; the artifact root is a folder")
        check_writable(art, f"tracking.artifact_root={artifact_root!r}", min_free_mb)
    elif str(artifact_root).startswith("mlflow-artifacts:") and urlparse(uri).scheme not in ("http", "https"):
        raise StoreError(f"tracking.artifact_root={artifact_root!r}: artifacts served by an MLflow server need the "
                         f"store to be that server (tracking.uri=http://HOST:PORT), not {uri!r}")


def _check_database(uri: str, timeout_s: float) -> None:
    """A database store answers: its SQLAlchemy driver is installed and a connection opens within ``timeout_s``
    (one try: MLflow's own retries would take minutes to say the same).

    Raises:
        StoreError: one line naming ``tracking.uri`` and the missing driver or the connection's error.
    """
    import sqlalchemy

    args = {"connect_timeout": max(1, int(timeout_s))} if uri.startswith(("postgresql", "mysql")) else {}
    try:
        engine = sqlalchemy.create_engine(uri, connect_args=args, poolclass=sqlalchemy.pool.NullPool)
    except ModuleNotFoundError as e:
        raise StoreError(f"tracking.uri={uri!r}: its database driver is not installed ({e.name}; pip install it, "
                         "or name an installed one, e.g. postgresql+psycopg://)") from None
    except Exception as e:  # noqa: BLE001 -- a URI SQLAlchemy cannot read
        raise StoreError(f"tracking.uri={uri!r}: not a database URI SQLAlchemy reads ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    try:
        with engine.connect():
            pass
    except Exception as e:  # noqa: BLE001 -- the driver's own error, its first line
        first = next((ln.strip() for ln in str(getattr(e, "orig", e)).splitlines() if ln.strip()), type(e).__name__)
        raise StoreError(f"tracking.uri={uri!r}: the database does not answer ({first})") from None
    finally:
        engine.dispose()
