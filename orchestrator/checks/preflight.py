"""Validate every point of a sweep before the first one starts.

Hydra composes each sweep point only when the launcher reaches it, so a bad value in the third
point would surface after two points had trained. ``check_command_line`` expands the command
line's overrides the way Hydra's basic sweeper does, composes each point and validates it; the
first problem is reported as one line and the process exits with status 2.
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

from omegaconf import OmegaConf

from orchestrator.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "sweeps"


def _expand(overrides: list[str]) -> list[list[str]]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    axes = []
    for o in parsed:
        if o.is_sweep_override():
            axes.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            axes.append([o.input_line])
    return [list(p) for p in itertools.product(*axes)] if axes else [[]]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def count_points(task_overrides: list[str], sweeper_params: dict | None) -> int:
    """The number of points Hydra's basic sweeper makes of the command line's ``task_overrides`` and the composed
    ``hydra.sweeper.params`` (a key on the command line replaces the preset's), without composing anything: what a
    running sweep's callback can count (composing inside a running Hydra app would reset its global state)."""
    user = [o for o in task_overrides if not o.lstrip("+~").startswith("hydra")]
    given = {_key(o) for o in user}
    params = [f"{k}={v}" for k, v in (sweeper_params or {}).items() if k not in given]
    return len(_expand(params + user))


def _with_sweeper_params(user: list[str], compose, *errors, config_name: str = "config",
                         hydra_overrides: tuple = (), search: list[str] = ()) -> list[str]:
    """``hydra.sweeper.params`` of the composed config (an experiment preset's sweep) followed by the
    command line's overrides; a key given on the command line replaces the preset's value for it."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed: list[str] = []
    try:
        fixed = [o.input_line for o in OverridesParser.create().parse_overrides(user) if not o.is_sweep_override()]
        try:
            cfg = compose(config_name, overrides=fixed + list(search), return_hydra_config=True)
        except errors as e:  # a key that only some points have (an algorithm's own): each point says it, named
            m = re.search(r"Could not override '([^']+)'", str(e))
            if not m or len(fixed) == len(user):
                raise
            cfg = compose(config_name, overrides=[o for o in fixed if _key(o) != m.group(1)] + list(search),
                          return_hydra_config=True)
    except errors as e:
        unknown = _unknown_key(str(e), fixed, lambda o: compose(config_name, overrides=o + list(search)))
        if unknown:
            raise ConfigError(unknown) from None
        text = str(e).split("Config search path")[0]
        raise ConfigError(" ".join(ln.strip() for ln in text.splitlines() if ln.strip())) from None
    params = dict(cfg.hydra.sweeper.get("params") or {})
    for o in OverridesParser.create().parse_overrides(list(hydra_overrides)):  # hydra.sweeper.params={...}
        if o.get_key_element().lstrip("+~") == "hydra.sweeper.params" and isinstance(o.value(), dict):
            params = {**params, **{str(k): str(v) for k, v in o.value().items()}}
    given = {_key(o) for o in user}
    return [f"{k}={v}" for k, v in params.items() if k not in given] + list(user)


def nearest(name: str, choices) -> str:
    """`` (did you mean X?)`` for the choice closest to ``name`` (difflib's ratio >= 0.6), else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown_key(message: str, point: list[str], compose) -> str | None:
    """The one line for an override of a key the config does not have (Hydra's ``Could not override 'KEY'``), with
    the nearest key the point's config has; None for any other composition error."""
    import re

    m = re.search(r"Could not override '([^']+)'", message)
    if not m:
        return None
    key = m.group(1)
    rest = [o for o in point if _key(o) != key]
    try:
        cfg = compose(rest)
    except Exception:
        return f"{key}: no such setting"
    keys = [k for k in _flat_keys(OmegaConf.to_container(cfg, resolve=False)) if not k.startswith("hydra")]
    parent, _, leaf = key.rpartition(".")
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    if siblings:  # a typo in the last part: the nearest sibling (a shared word such as "ratio" is not enough)
        import difflib

        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.6)
        hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    else:  # a typo in a group's name: the nearest whole key
        import difflib

        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.85)
        hint = f" (did you mean {close[0]}?)" if close else ""
    return (f"{key}: no such setting{hint}; the settings and their meaning: docs/config.md "
            f"(a new key on purpose: +{key}=...)")


def _flat_keys(tree, prefix: str = "") -> list[str]:
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            name = f"{prefix}{k}"
            out.append(name)
            out += _flat_keys(v, name + ".")
    return out


def sweep_points(overrides: list[str], config_name: str = "config", multirun: bool = True) -> list:
    """Compose every point of the sweep described by ``overrides`` (with ``multirun``, also the
    ``hydra.sweeper.params`` an experiment preset sets, as Hydra's basic sweeper does).

    Returns:
        list of (point overrides, composed config).
    Raises:
        ConfigError: an override names a missing config option or does not parse.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    user = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    search = [o for o in overrides if o.lstrip("+~").startswith("hydra.searchpath")]  # plug-ins' own config folders
    out = []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            if multirun:
                user = _with_sweeper_params(user, compose, HydraException, OmegaConfBaseException, config_name=config_name,
                                            hydra_overrides=[o for o in overrides if o.lstrip("+~").startswith("hydra.sweeper.params")],
                                            search=search)
            try:
                points = _expand(user)
            except HydraException as e:
                raise ConfigError(f"cannot parse overrides {user}: {str(e).splitlines()[0]}") from None
            for point in points:
                try:
                    out.append((point, compose(config_name, overrides=point + search)))
                except (HydraException, OmegaConfBaseException) as e:
                    unknown = _unknown_key(str(e), point, lambda o: compose(config_name, overrides=o + search))
                    if unknown:
                        where = f" (sweep point {' '.join(point)})" if len(points) > 1 else ""
                        raise ConfigError(unknown + where) from None
                    text = str(e).split("Config search path")[0]
                    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
                    raise ConfigError(" ".join(lines)) from None
    finally:
        GlobalHydra.instance().clear()
    return out


def check_command_line(argv: list[str], checks=(), sweep_checks=()) -> int | None:
    """Validate all sweep points of ``argv`` (overrides and ``-m``) and the places they write to
    (:func:`check_locations`); exit 2 with one line on error. Returns the number of points (None when the
    command line is left to Hydra).

    ``checks``: more functions ``(cfg) -> None`` that raise ValueError (one line) on a bad point, from layers this
    one does not import (sweep.py passes :func:`reports.callback.check_report_config`: the names in
    ``report.sections``). ``sweep_checks``: functions ``(configs, overrides) -> warnings or None`` over all the
    points' configs (``overrides``: the command line's, to tell what the user wrote from a preset's), raising
    ValueError the same way (sweep.py passes :func:`reports.callback.check_report_baseline`).

    Command lines with other Hydra flags (``--cfg``, ``--help``, ``--config-name``, ...) are left to Hydra.
    """
    from orchestrator.checks.validate import unused_settings, validate_config

    flags = [a for a in argv if a.startswith("-")]
    if any(f not in ("-m", "--multirun") for f in flags):
        return None
    overrides = [a for a in argv if not a.startswith("-")]
    remote = any(_key(a) == "hydra/launcher" and a.split("=", 1)[1] not in ("basic", "local") for a in overrides)
    launcher = next((a.split("=", 1)[1] for a in overrides if _key(a) == "hydra/launcher"), None)
    shown: dict = {}  # the points' memory plans, each distinct one printed once when every check has passed
    said: dict = {}  # the points' warnings, likewise (an error is one line, with no warning before it)
    from core.console import forget

    forget()  # a new sweep: its warnings are said once, again
    try:
        check_launcher(launcher)
        if not flags:
            check_single_run(overrides)
        points = sweep_points(overrides, multirun=bool(flags))

        def settings(cfg, point):
            for w in validate_config(cfg):
                said.setdefault(w, []).append(' '.join(point) or 'defaults')
            for check in checks:
                try:
                    check(cfg)
                except ValueError as e:
                    raise ConfigError(str(e)) from None

        def machine(cfg, point):  # a probe's and a tokenizer's seconds: after the checks that take none
            check_precision(cfg, remote)
            check_memory(cfg, remote, shown)

        _each_point(points, settings)
        _run_sweep_checks(points, (unused_settings, *sweep_checks), said, overrides)
        check_locations(points, [a for a in argv if not a.startswith("-")], multirun=bool(flags))
        check_tool_services(points)
        _each_point(points, machine)
        shown.setdefault(check_disk(points, overrides, bool(flags), remote), None)  # memory first: it names more
        check_inputs(points)
        create_stores(points)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)  # one line, nothing else: the plans are printed only when all passed
        sys.exit(2)
    _print_warnings(said, len(points))
    for line in filter(None, shown):
        print(line, file=sys.stderr)
    return len(points)


def _each_point(points, check_one) -> None:
    """Run ``check_one(cfg, point)`` on every sweep point, in order, so that its one-line error names the point.

    Raises:
        ConfigError: the check's own (with the point named when the sweep has several), or one line for any other
            exception (a config no check expected, such as a group removed with ``~``), without a traceback.
    """
    for point, cfg in points:
        try:
            check_one(cfg, point)
        except ConfigError as e:
            where = f" (sweep point {' '.join(point)})" if len(points) > 1 else ""
            raise ConfigError(f"{e}{where}") from None
        except Exception as e:  # a config no check expected (a group removed with ~): one line, no trace
            first = str(e).splitlines()[0] if str(e) else ""
            raise ConfigError(f"the point {' '.join(point) or '(defaults)'} cannot be checked: "
                              f"{type(e).__name__}: {first} (a setting missing or of the wrong kind?)") from None


def _run_sweep_checks(points, sweep_checks, said: dict, overrides: list[str]) -> None:
    """Run each check over all the points' configs and the command line's ``overrides``; their warnings join
    ``said`` (said once, for the whole sweep).

    Raises:
        ConfigError: a check's ValueError, its one line.
    """
    for check in sweep_checks:
        try:
            for w in check([cfg for _, cfg in points], overrides) or []:
                said.setdefault(w, [])
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _print_warnings(said: dict, n_points: int) -> None:
    """Print each warning of the points' checks once on stderr (not again by the points' runs in this process),
    naming the points that gave it: every point, or the first three and how many more."""
    from core.console import once

    for w, where in said.items():
        if once(w):  # the points' runs in this process do not say it again
            at = ("" if not where else " (every point)" if len(where) == n_points > 1 else
                  f" ({', '.join(where[:3])}{f' and {len(where) - 3} more' if len(where) > 3 else ''})")
            print(f"WARNING{at}: {w}", file=sys.stderr)


def check_single_run(overrides: list[str]) -> None:
    """A command line without ``-m`` whose override gives several values (``algo=grpo,gspo``) is refused in one
    line: it is a sweep (Hydra would stop after pre-flight with "Ambiguous value").

    Raises:
        ConfigError: names the override.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return  # sweep_points reports it
    for o in parsed:
        if o.is_sweep_override():
            import shlex

            raise ConfigError(f"{o.input_line} gives several values, which makes a sweep: add -m "
                              f"(python sweep.py -m {shlex.join(overrides)})")


#: the settings that ask for a precision, and which device each computes on (its config key: ``auto`` or a name)
PRECISION_KEYS = (("train.precision", "train.device"), ("train.rollout.dtype", "train.device"),
                  ("eval.dtype", "eval.device"), ("eval.vllm.dtype", "eval.device"))


def check_precision(cfg, remote: bool = False) -> None:
    """An explicit bf16 (``train.precision``, ``train.rollout.dtype``, ``eval.dtype``, ``eval.vllm.dtype``) on a
    device of this machine that only emulates it is refused: one line with the slowdown a sub-second probe measured
    and the setting to use instead (:func:`core.precision.refusal`). Not checked when the points run elsewhere
    (``remote``: a cluster launcher), where the device is not known here.

    Raises:
        ConfigError: the refusal.
    """
    from core.precision import refusal

    if remote:
        return
    for key, device_key in PRECISION_KEYS:
        setting, where = OmegaConf.select(cfg, key), str(OmegaConf.select(cfg, device_key) or "auto")
        if setting is None:
            continue
        device = "cuda" if where.startswith("cuda") or (where == "auto" and _cuda()) else "cpu"
        refused = refusal(key, str(setting), device)
        if refused:
            raise ConfigError(refused)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check_memory(cfg, remote: bool = False, shown: dict | None = None) -> None:
    """The point's memory plan (its engine's ``memory_plan(cfg, remote)``, when it has one and
    ``train.memory_check`` is not false), added to ``shown`` (an ordered collection of distinct plan lines, printed
    by the caller), and a plan that does not fit its device refused (:func:`training.memory_plan.refusal`: the total
    and what would make it fit).

    Args:
        remote: the points train elsewhere (a cluster launcher): the device's size is ``train.device_memory_gb``
            or unknown.
    Raises:
        ConfigError: the plan does not fit, or the model's shape is unknown here.
    """
    from training.engines import engine

    if OmegaConf.select(cfg, "train.memory_check") is False:
        return
    try:
        fn = engine(str(cfg.engine.name)).memory_plan
    except KeyError:
        return
    if fn is None:
        return
    try:
        plan, refused = fn(cfg, remote)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if refused:
        raise ConfigError(refused)
    if shown is not None:
        shown.setdefault(plan.summary(), None)


def _launchers() -> list[str]:
    """The ``hydra/launcher`` options Hydra finds (the suite's and its installed plug-ins')."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            return sorted(GlobalHydra.instance().config_loader().get_group_options("hydra/launcher"))
    except Exception:  # noqa: BLE001 -- the suite's own, at least
        return sorted({"basic"} | {p.stem for p in (CONFIG_DIR / "hydra" / "launcher").glob("*.yaml")})
    finally:
        GlobalHydra.instance().clear()


def check_launcher(launcher: str | None) -> None:
    """A cluster launcher's cluster is there: ``hydra/launcher=slurm`` needs ``sbatch`` on the PATH and ``sinfo``
    answering (within 20 s), so a machine without SLURM stops here instead of in submitit's traceback.

    Raises:
        ConfigError: one line naming the launcher and what is missing.
    """
    import shutil
    import subprocess

    if launcher is not None:
        known = _launchers()
        if launcher not in known:
            raise ConfigError(f"hydra/launcher={launcher}: no such launcher{nearest(launcher, known)}; the launchers: "
                              + ", ".join(known))
    if launcher != "slurm":
        return
    missing = [c for c in ("sbatch", "sinfo") if shutil.which(c) is None]
    if missing:
        raise ConfigError(f"hydra/launcher=slurm: {' and '.join(missing)} not found on this machine (no SLURM "
                          "client here?); run on the cluster's login node, or leave the launcher out to run locally")
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        raise ConfigError("hydra/launcher=slurm: sinfo did not answer within 20 s (slurmctld down?)") from None
    if proc.returncode != 0:
        first = next((ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()), f"exit {proc.returncode}")
        raise ConfigError(f"hydra/launcher=slurm: the cluster does not answer (sinfo: {first})")


def _read_error(e: Exception, node, key: str) -> str:
    """One line for an input that could not be read: the exception's first line, and the local alternative when the
    hub is offline and the input comes from it."""
    from core.models import hub_offline

    text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
    from_hub = node.get("source") == "hub" if key == "data" else not node.get("data_dir")
    if hub_offline() and (from_hub or "offline" in text.lower()):
        text += (f"; the hub is offline (HF_HUB_OFFLINE) and it is not in the local cache: download it first, or set "
                 f"{key}.source=local {key}.path=FILE" if key == "data" else
                 "; the hub is offline (HF_HUB_OFFLINE): set eval.data_dir to a folder with <benchmark>/test.jsonl")
    return text


def check_inputs(points) -> None:
    """Every point's inputs read once, before any work: its model found (:func:`core.models.check_source`), its
    training prompts (after the validation split) and every
    benchmark's rows, each non-empty; a hub dataset that is neither local nor cached while the hub is offline is
    named with the local alternative. Each distinct data and evaluation config is read once.

    Raises:
        ConfigError: one line naming the key (``data=<name>``, ``eval.benchmarks``) and the cause.
    """
    from core.models import check_source
    from core.tasks import get_task, load_prompts
    from evaluation.pipeline import benchmark_rows

    seen = set()
    for _, cfg in points:
        try:
            check_source(cfg.model)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        data = OmegaConf.to_container(cfg.data, resolve=True)
        key = repr(sorted(data.items()))
        if key not in seen:
            seen.add(key)
            try:
                rows = load_prompts(cfg.data, "train")
            except Exception as e:  # noqa: BLE001 -- every loader's own error, named in one line
                raise ConfigError(f"data={cfg.data.name}: its training prompts cannot be read: "
                                  f"{_read_error(e, cfg.data, 'data')}") from None
            if not rows:
                raise ConfigError(f"data={cfg.data.name}: no training prompts (an empty file or filter? data.path="
                                  f"{cfg.data.get('path')!r})")
        ev = repr((key, sorted(OmegaConf.to_container(cfg.eval, resolve=True).items(), key=str)))
        if ev in seen:
            continue
        seen.add(ev)
        held = [b for b in cfg.eval.benchmarks if get_task(str(b)).heldout_from_data]
        try:
            heldout = load_prompts(cfg.data, "eval") if held else None
            rows = benchmark_rows(cfg.eval, heldout)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"eval.benchmarks: cannot be read: {_read_error(e, cfg.eval, 'eval')}") from None
        empty = [b for b, r in rows.items() if not r]
        if empty:
            raise ConfigError(f"eval.benchmarks: {empty} {'has' if len(empty) == 1 else 'have'} no rows (an empty "
                              f"file? eval.data_dir={cfg.eval.get('data_dir')!r})")


def check_tool_services(points) -> None:
    """A retrieval server named by ``tools.search.url`` answers ``/health`` (within 10 s), for points whose training
    data or benchmarks call the search tool; servers the run starts itself are checked when they start.

    Raises:
        ConfigError: one line naming the URL and why.
    """
    import json
    import urllib.request

    from core.tasks import get_task

    seen = set()
    for _, cfg in points:
        url = OmegaConf.select(cfg, "tools.search.url")
        names = [str(cfg.data.name), *[str(b) for b in cfg.eval.benchmarks]]
        if not url or url in seen or not any("search" in getattr(get_task(n), "tools", ()) for n in names):
            continue
        seen.add(url)
        try:
            with urllib.request.urlopen(str(url).rstrip("/") + "/health", timeout=10) as r:
                ok = bool(json.loads(r.read()).get("ok"))
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"tools.search.url={url!r}: the retrieval server does not answer ({type(e).__name__}: "
                              f"{getattr(e, 'reason', e)}); start it with python -m core.retrieval serve --index DIR") from None
        if not ok:
            raise ConfigError(f"tools.search.url={url!r}: /health did not say ok: not a retrieval server?")


def check_disk(points, overrides: list[str], multirun: bool, remote: bool) -> str:
    """The sweep's disk plan (:func:`orchestrator.checks.disk_plan.check_disk`) against the free space where Hydra
    writes its run folders (``hydra.sweep.dir`` / ``hydra.run.dir``, else the working directory; with a cluster
    launcher every point's training state at once). Returns the plan's line.

    Raises:
        ConfigError: the plan does not fit (one line: its largest parts, the free space, what would fit).
    """
    from orchestrator.checks import disk_plan

    dir_key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    given = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(dir_key)), None)
    folder = Path.cwd() if given is None else Path(given.split("${", 1)[0] or ".")
    try:
        return disk_plan.check_disk(points, folder, parallel=remote)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def create_stores(points) -> None:
    """Create each point's SQLite store (once, under a file lock), the last step of pre-flight: a refusal before it
    leaves no store behind.

    Raises:
        ConfigError: the store could not be created (the cause, a full disk named as such).
    """
    from orchestrator.store import tracking

    try:
        for uri in dict.fromkeys(str(cfg.tracking.uri) for _, cfg in points):
            tracking.ensure_store(uri)
    except tracking.StoreError as e:
        raise ConfigError(str(e)) from None


def check_locations(points, overrides: list[str], multirun: bool = True) -> None:
    """Every place the sweep writes, checked in seconds before any point starts: the tracking store (scheme,
    reachability, writability, ``tracking.min_free_mb`` free; created only once every check passed:
    :func:`create_stores`), the artifact root, and the folder Hydra writes the sweep's outputs to.

    Raises:
        ConfigError: one line naming the setting and the cause (disk full, read-only, unknown scheme, no answer).
    """
    from orchestrator.store import store_checks

    seen = set()
    try:
        for _, cfg in points:
            key = (str(cfg.tracking.uri), str(cfg.tracking.artifact_root), float(cfg.tracking.get("min_free_mb", 100)))
            if key in seen:
                continue
            seen.add(key)
            store_checks.check_store(*key)
        min_free = max((k[2] for k in seen), default=100.0)
        dir_key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
        given = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").startswith(dir_key)), None)
        if given is None:
            store_checks.check_writable(Path.cwd(), f"the working directory {Path.cwd()} (Hydra writes the sweep's "
                                        f"folder there; run elsewhere or set {dir_key}PATH)", min_free)
        else:
            fixed = given.split("${", 1)[0] or "."
            store_checks.check_writable(Path(fixed), f"{dir_key}{given}", min_free)
    except store_checks.StoreError as e:
        raise ConfigError(str(e)) from None
