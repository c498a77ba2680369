"""Validate a composed run config before any model is loaded.

Every check raises :class:`ConfigError` with one line naming the key and the bad value.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.errors import ConfigError
from training.algorithms import check_algorithm


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _context_limits(cfg) -> list:
    """Every length the model's context must hold (checked by :func:`core.models.check_context`: prompt and response
    share it): the training and evaluation response lengths, each benchmark's own, vLLM's ``max_model_len``, and an
    engine's prompt budget (``engine.max_prompt_length``) with the training response length. A model whose context
    cannot be read here (a hub model not downloaded yet) is not checked."""
    lengths = {"train.max_new_tokens": OmegaConf.select(cfg, "train.max_new_tokens"),
               "eval.max_new_tokens": OmegaConf.select(cfg, "eval.max_new_tokens")}
    for bench, over in (OmegaConf.select(cfg, "eval.decoding") or {}).items():
        if over is not None and over.get("max_new_tokens") is not None:
            lengths[f"eval.decoding.{bench}.max_new_tokens"] = over.get("max_new_tokens")
    limits = [(n, True, f"{key}={n}: the model {{model}} holds {{ctx}} tokens of context, prompt and response "
                        "together: a response that long leaves no room for the prompt") for key, n in lengths.items()]
    max_len = OmegaConf.select(cfg, "eval.vllm.max_model_len")
    limits.append((max_len, False, f"eval.vllm.max_model_len={max_len}: the model {{model}} holds {{ctx}} tokens of "
                                   "context"))
    # an engine that budgets the prompt itself (verl: data.max_prompt_length, its rollout server's max_model_len is
    # prompt + response) must fit both in the context
    prompt = OmegaConf.select(cfg, "engine.max_prompt_length")
    new = OmegaConf.select(cfg, "train.max_new_tokens")
    if prompt is not None and new is not None:
        limits.append((int(prompt) + int(new), False,
                       f"engine.max_prompt_length={prompt}: with train.max_new_tokens={new} that is "
                       f"{int(prompt) + int(new)} tokens, and the model {{model}} holds {{ctx}} tokens of context"))
    return limits


def validate_eval(cfg, data_name: str | None = None) -> list[str]:
    """The evaluation's own check (:func:`evaluation.checks.check_eval`) as a :class:`ConfigError`: what the sweep's
    pre-flight and the evaluation command (``python -m orchestrator.evaluate``) both run.

    Raises:
        ConfigError: one line naming the key and the bad value.
    """
    from evaluation.checks import check_eval

    try:
        return check_eval(cfg.eval, data_name)
    except (ValueError, KeyError) as e:
        raise ConfigError(str(e.args[0] if isinstance(e, KeyError) else e).strip('"')) from None


@dataclass(frozen=True)
class CheckedPoint:
    """What checking one run config found (:func:`check_point`): the warnings (legal but suspicious settings) and
    the id of the evaluation protocol the point runs under on this machine
    (:func:`evaluation.protocol.identity`), resolved once with the rest of the checks."""

    warnings: list[str]
    eval_identity: str


def check_point(cfg: DictConfig) -> CheckedPoint:
    """Check a composed run config (:func:`validate_config`) and resolve its evaluation protocol on the way down
    (after the components' checks, before the model's context is read): what a run starts from.

    Raises:
        ConfigError: one line naming the key and the bad value.
    """
    from core.models import check_context
    from evaluation import protocol

    warnings, limits = _component_checks(cfg)
    identity = protocol.identity(cfg.eval, bool(OmegaConf.select(cfg, "model.chat_template", default=True)))
    # -- the model against the rest: every length within its context (the limits gathered by the checks)
    try:
        check_context(cfg.model, limits)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return CheckedPoint(warnings, identity)


def validate_config(cfg: DictConfig) -> list[str]:
    """Check a composed run config; raise :class:`ConfigError` (one line) on the first problem.

    Every key's type and range come from its declaration (:func:`orchestrator.checks.schema.check_schema`); then each
    selected component's own check: the algorithm's (:func:`training.algorithms.check_algorithm`: its functions
    exist, accept the configured parameters, pass their registered validators and can move the policy; DAPO's
    overlong buffer within the response length); the training task's ``validate``; the evaluation's
    (:func:`validate_eval`); the engine's ``validate``. What stays here are the rules that relate several parts:
    every length within the model's context, no group of one under an estimator that then
    gives advantage 0, checkpoint evaluation needing kept checkpoints, search-tool tasks needing a corpus.

    Returns:
        Warnings (legal but suspicious settings, e.g. TR-GRPO weights that are constant).
    """
    return check_point(cfg).warnings


def _component_checks(cfg) -> tuple[list[str], list]:
    """Every check of :func:`validate_config` but the model's context: its warnings and the lengths the context
    must hold (:func:`_context_limits`)."""
    from orchestrator.checks.schema import check_schema

    warnings: list[str] = check_schema(cfg)  # every key: type, range, choices; unknown keys refused
    warnings += _algorithm_checks(cfg)
    # -- a minibatch within the batch; the lengths the model's context must hold (checked last, after every
    # component's own check; the model's files and the data are read by orchestrator.checks.preflight.check_inputs)
    limits = _context_limits(cfg)
    mb, per, g = (OmegaConf.select(cfg, f"train.{k}") for k in ("minibatch_size", "prompts_per_step", "group_size"))
    _require(mb is None or per is None or g is None or int(mb) <= int(per) * int(g),
             f"train.minibatch_size={mb}: larger than the batch (train.prompts_per_step={per} x train.group_size={g} = "
             f"{int(per or 0) * int(g or 0)} responses); null takes the whole batch in one optimiser step")
    _data_checks(cfg)
    # -- evaluation: its own check, then the rules that relate it to training
    warnings += validate_eval(cfg, str(cfg.data.name))
    warnings += _evaluation_rules(cfg)
    _search_tool_checks(cfg)
    warnings += _engine_checks(cfg)
    warnings += _settings_without_effect(cfg)
    return warnings, limits


def _algorithm_checks(cfg) -> list[str]:
    """The algorithm's own checks (:func:`training.algorithms.check_algorithm`: registered names, parameters,
    validators, a policy that can change; DAPO's overlong buffer within the response length among them); its
    warnings.

    Raises:
        ConfigError: ``algo`` cannot be resolved, or the algorithm's check refuses it (its one line).
    """
    algo = cfg.algo
    try:
        algo_dict = OmegaConf.to_container(algo, resolve=True)
    except Exception as e:
        raise ConfigError(f"algo: {e}") from None
    try:  # (DAPO's overlong buffer within the response length among them)
        return check_algorithm(algo_dict, OmegaConf.select(cfg, "train.group_size"),
                               OmegaConf.select(cfg, "train.max_new_tokens"))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _data_checks(cfg) -> None:
    """The training task's own checks (its ``validate``; plug-in modules were imported by the schema).

    Raises:
        ConfigError: an unknown task, or the task's one line on a bad ``data`` setting.
    """
    from core.tasks import get_task

    try:
        data_task = get_task(cfg.data.name)
    except KeyError as e:
        raise ConfigError(f"data={cfg.data.name!r}: {e.args[0]}") from None
    try:
        data_task.validate(cfg.data, "data")
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _evaluation_rules(cfg) -> list[str]:
    """The rules that relate evaluation to training: checkpoint evaluation and validation-based selection need
    kept checkpoints, validation needs a validation split with k <= n, and keeping the top k checkpoints needs
    selection on validation.

    Raises:
        ConfigError: the first rule broken, one line naming the keys.
    """
    save_every = cfg.train.get("save_every") or 0
    _require(cfg.eval.get("checkpoints", "final") != "all" or save_every > 0,
             "eval.checkpoints=all: no checkpoints are kept during training; set train.save_every=N (N >= 1)")
    select_on = str(cfg.eval.get("select_on", "final"))
    n_val = int(OmegaConf.select(cfg, "data.validation_prompts") or 0)
    if select_on == "validation":
        _require(n_val > 0, "eval.select_on=validation: no validation split; set data.validation_prompts=N (N >= 1 "
                            "training prompts held out of training)")
        _require(save_every > 0 or int(cfg.train.get("validate_every") or 0) > 0,
                 "eval.select_on=validation: only the final checkpoint is kept; set train.validate_every=N (chooses "
                 "among the policies validated inside the loop) or train.save_every=N (N >= 1) so there is a choice")
        _require(int(cfg.eval.validation.k) <= int(cfg.eval.validation.n),
                 f"eval.validation.k={cfg.eval.validation.k}: larger than eval.validation.n={cfg.eval.validation.n}")
        _require(cfg.eval.get("checkpoints", "final") != "all",
                 "eval.select_on=validation with eval.checkpoints=all: the run's benchmark metrics would mix the "
                 "chosen checkpoint's with later ones'; use one or the other")
    validate_every = int(cfg.train.get("validate_every") or 0)
    _require(not validate_every or n_val > 0,
             f"train.validate_every={validate_every}: no validation split; set data.validation_prompts=N (N >= 1 "
             "training prompts held out of training, a split apart from the evaluation's)")
    _require(not validate_every or int(cfg.eval.validation.k) <= int(cfg.eval.validation.n),
             f"eval.validation.k={cfg.eval.validation.k}: larger than eval.validation.n={cfg.eval.validation.n}")
    _require(not cfg.train.get("keep_top_k") or select_on == "validation",
             f"train.keep_top_k={cfg.train.get('keep_top_k')}: checkpoints are ranked on the validation split; set "
             "eval.select_on=validation")
    return _validation_warnings(cfg, validate_every, n_val, select_on)


def _validation_warnings(cfg, every: int, n_val: int, select_on: str) -> list[str]:
    """Validation settings that cannot do what they are for: ``train.validate_every`` past ``train.steps`` (refused:
    nothing between the start and the end would be validated); too few points for a compute curve (warned: a user
    may want the start and the end only); prompts held out for no validation (warned: they leave training).

    Raises:
        ConfigError: ``train.validate_every`` larger than ``train.steps``.
    """
    from evaluation.curves import MIN_POINTS

    steps = int(cfg.train.steps)
    _require(every <= steps, f"train.validate_every={every}: larger than train.steps={steps}, so only the start and the "
                             f"end would be validated; set train.validate_every={steps} for those two, or less")
    out = []
    if every:
        after = len({steps} | set(range(every, steps, every)))
        if after < MIN_POINTS:
            out.append(f"train.validate_every={every} with train.steps={steps}: {after} validation point(s) after "
                       f"step 0, fewer than the {MIN_POINTS} a compute curve's fit needs (the report draws the points "
                       f"and fits none); set train.validate_every={max(1, steps // MIN_POINTS)} for a curve")
    elif n_val and select_on != "validation":
        out.append(f"data.validation_prompts={n_val}: held out of training, but nothing validates on them; set "
                   "train.validate_every=N or eval.select_on=validation, or data.validation_prompts=0")
    return out


def _ignored_correction_settings(cfg) -> dict[str, object]:
    """{key: value} of the correction thresholds (``train.rollout.correction_cap``, ``correction_lower``) set away
    from the suite's defaults (sweeps/config.yaml) for a correction that does not read them
    (:func:`training.corrections.reads`)."""
    from training.corrections import reads

    rollout = OmegaConf.select(cfg, "train.rollout") or {}
    name = str(rollout.get("correction", "none"))
    try:
        used = reads(name)
    except KeyError:
        return {}  # an unknown correction: refused by its own check
    defaults = OmegaConf.load(Path(__file__).resolve().parents[2] / "sweeps" / "config.yaml").train.rollout
    return {f"train.rollout.correction_{t}": rollout.get(f"correction_{t}") for t in ("cap", "lower")
            if t not in used and rollout.get(f"correction_{t}") != defaults.get(f"correction_{t}")}


def _settings_without_effect(cfg) -> list[str]:
    """Warnings for settings the point's other settings make inert, which a sweep may mean (a threshold swept beside
    a correction that ignores it: the sweep's other points read it); :func:`unused_settings` refuses the sweeps
    where no point reads it. ``eval=smoke`` (8-token answers, made for the tiny test model) with another model:
    its pass@k then counts truncated answers."""
    out = []
    correction = OmegaConf.select(cfg, "train.rollout.correction")
    for key, value in _ignored_correction_settings(cfg).items():
        out.append(f"{key}={value} has no effect under train.rollout.correction={correction}, which does not read "
                   f"it (docs/staleness.md lists what each correction reads)")
    if str(OmegaConf.select(cfg, "eval.name")) == "smoke" and str(OmegaConf.select(cfg, "model.name")) != "tiny-random":
        out.append(f"eval=smoke cuts answers at {OmegaConf.select(cfg, 'eval.max_new_tokens')} tokens for the tiny "
                   f"test model; with model={OmegaConf.select(cfg, 'model.name')} most answers stop for length and "
                   "its pass@k measures truncation: use eval=quick (the default) or a benchmark preset")
    return out


def unused_settings(configs, overrides=()) -> list[str]:
    """Pre-flight over a sweep's points (``overrides``: the command line's, not read): a correction threshold that no point of the sweep reads (every point's
    correction ignores it) is refused; one that some point reads is warned about on the others
    (:func:`_settings_without_effect`).

    Raises:
        ConfigError: one line naming the key, its value, the sweep's corrections and the fix.
    """
    ignored = [_ignored_correction_settings(cfg) for cfg in configs]
    for key in dict.fromkeys(k for found in ignored for k in found):
        if all(key in found for found in ignored):
            corrections = sorted({str(OmegaConf.select(c, "train.rollout.correction")) for c in configs})
            raise ConfigError(f"{key}={ignored[0][key]}: no point of this sweep reads it (train.rollout.correction="
                              f"{','.join(corrections)}); choose a correction that does (docs/staleness.md) or "
                              f"leave {key} at its default")
    return []


def _search_tool_checks(cfg) -> None:
    """Tasks (training or benchmark) that search a corpus of their own need a search server or a built index.

    Raises:
        ConfigError: no ``tools.search.url`` or ``tools.search.index`` for them, or no built index at the path.
    """
    from core.tasks import get_task

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


def _engine_checks(cfg) -> list[str]:
    """The training engine's own check (its ``validate``); its warnings.

    Raises:
        ConfigError: an unknown engine, or the engine's one line naming the setting it cannot honour.
    """
    from training.engines import engine

    try:
        chosen = engine(str(cfg.engine.name))
    except KeyError as e:
        raise ConfigError(e.args[0]) from None
    try:
        return list(chosen.validate(cfg) or [])
    except ValueError as e:
        raise ConfigError(f"engine={cfg.engine.name}: {e}") from None
