"""What the suite's runs left on disk that nothing needs any more, listed and (with ``--remove``) freed.

    python -m orchestrator.clean [--tracking-uri sqlite:///mlflow.db] [--root .] [--dry-run | --remove]

Three kinds, found from the store's run records (every experiment of ``--tracking-uri``) and the run folders under
``--root`` (``multirun/`` and ``outputs/``, Hydra's folders):

- **training state of a finished run**: the engine's state (:func:`orchestrator.point.disk.state_paths`: the local
  engine's ``state/``, verl's ``verl_checkpoints/``) in the folder of a FINISHED run (``rlvr.run_dir``): only a resume
  reads it (runs since issue 56 remove it themselves unless ``train.keep_state=true``; kept-on-purpose states are
  listed too, since a finished run is never resumed);
- **folder of a superseded run**: the folder of a FAILED or KILLED run whose point (``rlvr.config_hash``) a later run
  finished, and which no other run names (a run that took its checkpoint: ``rlvr.recovered_from``,
  ``rlvr.trained_in``): a failed run that nothing superseded is kept, since the same command resumes it;
- **checkpoint no run names**: a ``checkpoint/`` or ``checkpoints/`` folder under ``--root`` whose run folder is
  no run record's ``rlvr.run_dir`` (a run whose record was deleted: a point that gave way to an identical one).
  Records are matched from their ``multirun/``/``outputs/`` part on, so a moved or copied project folder matches its
  store; when the store names no run folder under ``--root`` at all (another folder's store, an empty one), no
  checkpoint is listed.

Never listed: a final or kept checkpoint that a record names (reproduction, re-evaluation and checkpoint reuse read
them), the state of a run that is not finished (a resume reads it), anything outside ``--root`` or the folders the
records name, the store and its artifacts (reports read them). ``--dry-run`` (the default) lists and removes
nothing. Exit 2 with one line: a store that does not exist or cannot be read (a server that does not answer within
seconds), a ``--root`` that is not a folder; exit 1 when something listed could not be removed.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from core import tags
from orchestrator.point.disk import human, size_bytes, state_paths
from orchestrator.store import store_checks, tracking


@dataclass(frozen=True)
class Item:
    """One thing that may be removed: ``path``, its ``kind`` (the three above), ``why`` (the run it belongs to) and
    ``bytes``."""
    path: Path
    kind: str
    why: str
    bytes: int


def _runs(uri: str) -> list:
    """Every run of every experiment of the store at ``uri``."""
    store = tracking.Store.at(uri)
    return store.all_runs(store.experiment_ids())


TOPS = ("multirun", "outputs")  # the folders Hydra writes runs to, under the folder a sweep ran in


def _tail(p) -> Path | None:
    """A run folder's path from its ``multirun/`` or ``outputs/`` part on (``multirun/rlvr/<date>/0``), or None."""
    parts = Path(p).parts
    for i, part in enumerate(parts):
        if part in TOPS:
            return Path(*parts[i:])
    return None


def _under_root(tagged: str, root: Path) -> Path | None:
    """Where a run record's folder (``rlvr.run_dir``: absolute, or relative to the folder the sweep ran in) is under
    ``root``: the same path from its ``multirun/``/``outputs/`` part on, so a project folder that was moved or copied
    still matches its records; None for a folder that is not under ``root`` (a temporary ``rlvr-run-*`` folder)."""
    tail = _tail(tagged)
    if tail is not None:
        return (root / tail).resolve()
    p = Path(tagged)
    try:
        p = p.resolve() if p.is_absolute() else (root / p).resolve()
    except (OSError, RuntimeError):
        return None
    return p if root in p.parents else None


def find(uri: str, root: Path) -> tuple[list[Item], str | None]:
    """Everything :mod:`orchestrator.clean` may remove under ``root`` (see the module docstring), largest first, and a
    note when the stray-checkpoint search was skipped (the store's records name no run folder under ``root``: then it
    is not this folder's store, and every checkpoint would look unnamed).

    Raises:
        Exception: the store cannot be read (the caller reports it in one line).
    """
    root = root.resolve()
    runs = _runs(uri)
    by_id = {r.info.run_id: r for r in runs}
    named_dirs: dict[Path, list] = {}  # run folder under root -> the runs naming it
    for r in runs:
        d = r.data.tags.get(tags.RUN_DIR)
        if d and (rd := _under_root(d, root)) is not None:
            named_dirs.setdefault(rd, []).append(r)
    referenced = set()  # run ids whose folder another run still reads from
    for r in runs:
        for tag in (tags.TRAINED_IN, tags.RECOVERED_FROM):
            if (other := r.data.tags.get(tag)) in by_id:
                referenced.add(other)
    finished_hashes = {(r.info.experiment_id, r.data.tags.get(tags.CONFIG_HASH)) for r in runs
                       if r.info.status == "FINISHED" and r.data.tags.get(tags.KIND) == "trained"}
    items: list[Item] = []
    seen: set[Path] = set()
    for rd, owners in named_dirs.items():
        if not rd.is_dir():
            continue
        statuses = {o.info.status for o in owners}
        if "FINISHED" in statuses:
            for o in owners:
                engine = o.data.params.get("engine.name", "local")
                try:
                    paths = state_paths(engine, rd)
                except KeyError:  # an engine this install does not have
                    continue
                for p in paths:
                    if p not in seen:
                        seen.add(p)
                        items.append(Item(p, "training state of a finished run", o.info.run_id, size_bytes(p)))
                break
        elif statuses <= {"FAILED", "KILLED"} and all(
                (o.info.experiment_id, o.data.tags.get(tags.CONFIG_HASH)) in finished_hashes
                and o.info.run_id not in referenced for o in owners):
            items.append(Item(rd, "folder of a superseded run", owners[0].info.run_id, size_bytes(rd)))
            seen.add(rd)
    note = None
    if not named_dirs:
        note = (f"the store's runs name no run folder under {root} (another folder's store, or none): checkpoints "
                "were not searched")
    else:
        for top in TOPS:
            base = root / top
            if not base.is_dir():
                continue
            for name in ("checkpoint", "checkpoints"):
                for ck in base.rglob(name):
                    if ck.is_symlink() or not ck.is_dir():
                        continue
                    run_dir = ck.parent.resolve()
                    if run_dir in named_dirs or any(s == run_dir or s in run_dir.parents or s in ck.parents
                                                    for s in seen):
                        continue
                    items.append(Item(ck, "checkpoint no run names", str(ck.parent), size_bytes(ck)))
    if not any((root / t).is_dir() for t in TOPS):
        note = f"{root} has no multirun/ or outputs/ folder: --root is the folder the sweeps ran in"
    return sorted(items, key=lambda i: -i.bytes), note


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.clean", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db", help="the store (default: ./mlflow.db)")
    ap.add_argument("--root", default=".", help="the folder the sweeps ran in (multirun/, outputs/; default: .)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--dry-run", action="store_true", help="list only (the default)")
    how.add_argument("--remove", action="store_true", help="remove what is listed")
    return ap


def main(argv=None) -> int:
    from core.console import quiet_libraries

    quiet_libraries()  # MLflow's own lines (a schema check) stay off the screen
    args = _parser().parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"error: --root={args.root}: not a folder", file=sys.stderr)
        return 2
    try:
        db = store_checks.sqlite_path(args.tracking_uri) if args.tracking_uri.startswith("sqlite:") else None
        if db is None:
            store_checks.check_store(args.tracking_uri, "mlartifacts", min_free_mb=0)  # a server answers in seconds
    except store_checks.StoreError as e:
        print(f"error: {str(e).replace('tracking.uri=', '--tracking-uri=')}", file=sys.stderr)
        return 2
    if db is not None and (not db.is_file() or db.stat().st_size == 0):
        print(f"error: --tracking-uri={args.tracking_uri}: no such store (run from the folder the sweeps ran in, "
              "or give its URI)", file=sys.stderr)
        return 2
    uri = args.tracking_uri if db is None else f"sqlite:///{db.resolve()}"  # MLflow caches a store by its URI
    try:
        items, note = find(uri, root)
    except Exception as e:  # noqa: BLE001 -- a store that cannot be read, in one line
        print(f"error: --tracking-uri={args.tracking_uri}: cannot be read ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''})", file=sys.stderr)
        return 2
    total = sum(i.bytes for i in items)
    for i in items:
        print(f"{human(i.bytes):>9}  {i.kind}  {i.path}  ({i.why})")
    if note:
        print(f"note: {note}")
    if not items:
        print("nothing to remove")
        return 0
    if not args.remove:
        print(f"{human(total)} in {len(items)} place(s) may be removed; nothing was removed (add --remove)")
        return 0
    freed, removed, failed = 0, 0, 0
    for i in items:
        try:
            if i.path.is_symlink() or not i.path.is_dir():
                i.path.unlink()
            else:
                shutil.rmtree(i.path)
            freed += i.bytes
            removed += 1
        except OSError as e:
            failed += 1
            print(f"could not remove {i.path}: {e.strerror or e}", file=sys.stderr)
    print(f"removed {removed} place(s): {human(freed)} freed" + (f"; {failed} could not be removed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
