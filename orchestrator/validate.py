"""Validate a composed run config before any model is loaded.

Every check raises :class:`ConfigError` with one line naming the key and the bad value.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from training.algorithms import get_advantage_fn, get_policy_loss_fn, validate_params

from .errors import ConfigError


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _check_params(kind: str, fn, params: dict) -> None:
    sig = inspect.signature(fn)
    names = [p for p, v in sig.parameters.items() if v.kind is not inspect.Parameter.VAR_KEYWORD][(3 if kind == "policy_loss" else 1):]
    if kind == "advantage" and params.get("base_estimator") and len(names) < len(sig.parameters) - 1:  # shaping another estimator
        try:
            base_fn = get_advantage_fn(params["base_estimator"])
        except KeyError as e:
            raise ConfigError(f"algo.advantage.base_estimator={params['base_estimator']!r}: {e.args[0]}") from None
        _check_params(kind, base_fn, {k: v for k, v in params.items() if k not in names})  # the base's own keys
        params = {k: v for k, v in params.items() if k in names}
    unknown = [k for k in params if k not in names]
    _require(not unknown, f"algo.{kind}: unknown parameter(s) {unknown} for {fn.__name__}; accepted: {names}")
    missing = [p.name for p in list(sig.parameters.values())[(3 if kind == "policy_loss" else 1):]
               if p.default is inspect.Parameter.empty and p.name not in params
               and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
    _require(not missing, f"algo.{kind}: missing parameter(s) {missing} for {fn.__name__}")


def validate_eval(cfg, data_name: str | None = None) -> list[str]:
    """The evaluation's own check (:func:`evaluation.evaluate.check_eval`) as a :class:`ConfigError`: what the sweep's
    pre-flight and the evaluation command (``python -m orchestrator.evaluate``) both run.

    Raises:
        ConfigError: one line naming the key and the bad value.
    """
    from evaluation.evaluate import check_eval

    try:
        return check_eval(cfg.eval, data_name)
    except (ValueError, KeyError) as e:
        raise ConfigError(str(e.args[0] if isinstance(e, KeyError) else e).strip('"')) from None


def validate_config(cfg: DictConfig) -> list[str]:
    """Check a composed run config; raise :class:`ConfigError` (one line) on the first problem.

    Every key's type and range come from its declaration (:func:`orchestrator.schema.check_schema`); then each
    selected component's own check: the algorithm's functions exist, accept the configured parameters and pass
    their registered validators; the training task's ``validate``; the evaluation's (:func:`validate_eval`); the
    engine's ``validate``. What stays here are the rules that relate several parts: DAPO's overlong buffer within
    the response length, checkpoint evaluation needing kept checkpoints, search-tool tasks needing a corpus.

    Returns:
        Warnings (legal but suspicious settings, e.g. TR-GRPO weights that are constant).
    """
    from .schema import check_schema

    warnings: list[str] = check_schema(cfg)  # every key: type, range, choices; unknown keys refused
    # -- algorithm
    algo = cfg.algo
    for kind, getter in (("advantage", get_advantage_fn), ("policy_loss", get_policy_loss_fn)):
        node = algo.get(kind)
        _require(node is not None and node.get("name"), f"algo.{kind}.name is missing (algo={algo.get('name')!r})")
        try:
            fn = getter(node.name)
        except KeyError as e:
            raise ConfigError(f"algo.{kind}.name={node.name!r}: {e.args[0]}") from None
        try:
            params = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "name"}
        except Exception as e:
            raise ConfigError(f"algo.{kind}: {e}") from None
        _check_params(kind, fn, params)
        try:
            warnings += validate_params(kind, node.name, params,
                                        context={"group_size": OmegaConf.select(cfg, "train.group_size")})
        except ValueError as e:
            raise ConfigError(f"algo.{kind} ({node.name}): {e}") from None
    over = algo.get("overlong_buffer")
    if over and over.get("enabled", False):  # its length within the response length
        from training.rewards import overlong_buffer_length

        try:
            overlong_buffer_length(over, int(cfg.train.max_new_tokens))
        except ValueError as e:   # names the bad key and value
            raise ConfigError(str(e)) from None

    # -- data: the training task's own checks (plug-in modules were imported by the schema)
    from core.tasks import get_task

    try:
        data_task = get_task(cfg.data.name)
    except KeyError as e:
        raise ConfigError(f"data={cfg.data.name!r}: {e.args[0]}") from None
    try:
        data_task.validate(cfg.data, "data")
    except ValueError as e:
        raise ConfigError(str(e)) from None

    # -- evaluation: its own check, then the rules that relate it to training
    warnings += validate_eval(cfg, str(cfg.data.name))
    save_every = cfg.train.get("save_every") or 0
    _require(cfg.eval.get("checkpoints", "final") != "all" or save_every > 0,
             "eval.checkpoints=all: no checkpoints are kept during training; set train.save_every=N (N >= 1)")
    benches = list(cfg.eval.benchmarks)
    tool_tasks = [t for t in dict.fromkeys([str(cfg.data.name), *[str(b) for b in benches]])
                  if "search" in getattr(get_task(t), "tools", ()) and not getattr(get_task(t), "own_corpus", False)]
    search = OmegaConf.select(cfg, "tools.search") or {}
    _require(not tool_tasks or search.get("url") or search.get("index"),
             f"tools.search: {tool_tasks} search a corpus of their own (Wikipedia): set tools.search.url (a running "
             "retrieval server) or tools.search.index (an index built with python -m core.retrieval build)")
    index = search.get("index")
    _require(not index or (Path(str(index)) / "meta.json").is_file(),
             f"tools.search.index={index!r}: no built index there (python -m core.retrieval build --corpus FILE "
             f"--index {index})")
    from training.engines import get_engine

    try:
        engine = get_engine(str(cfg.engine.name))
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    if callable(getattr(engine, "validate", None)):
        try:
            warnings += list(engine.validate(cfg) or [])
        except ValueError as e:
            raise ConfigError(f"engine={cfg.engine.name}: {e}") from None
    return warnings
