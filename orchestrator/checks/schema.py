"""A type and range for every key of the config tree, checked before anything starts.

The schema only collects: :data:`SCHEMA` holds the keys of the run itself (seed, tracking, training loop, model,
evaluation protocol); each component declares its own keys next to its code (a task's ``config``, an engine's
``CONFIG``, a sampler's ``CONFIG``, a metric table's ``knobs``, an algorithm's function signature) and
:func:`collect_specs` gathers those the composed config selects. Each dotted key (``train.lr``) maps to a
:class:`core.config_keys.Spec`. :func:`check_schema` walks the composed
config: a key the schema does not know is refused (a typo given with ``+``), except under the free-form
subtrees of :data:`FREE` and the data config of a task that declares no keys; a value of the wrong type, out of
range or not among the choices is refused with one line naming the key and the value. The parameters of the
algorithm's advantage estimator and policy loss are typed from the registered function's annotations
(``float``, ``bool``, ``str``, ``float | None``), their ranges left to the function's registered validator.
Keys whose meaning depends on other keys (``eval.ks`` within ``eval.n``, ...) keep their checks in
:mod:`orchestrator.checks.validate`.
"""
from __future__ import annotations

import inspect
import types
import typing

from omegaconf import DictConfig, ListConfig, OmegaConf

from core.config_keys import ANY, DEVICE, MAP, B, BadValue, F, I, L, S, Spec  # noqa: F401
from core.config_keys import check_value as _check_value
from orchestrator.errors import ConfigError

MAX_NAME = 120  # experiment_name: MLflow shows it in URLs and the report's folder name is made of it


SCHEMA: dict[str, Spec] = {
    # top level
    "experiment_name": S(pattern=r"[A-Za-z0-9][A-Za-z0-9_.\-]*", max_len=MAX_NAME),
    "seed": I(0, 2**31 - 1),
    "delta": F(0, lo_open=True),
    "exppo_lambda": F(),
    "plugins": L(S(min_len=1), null=True),
    "force": B(),
    "identity_exclude": L(S()),
    "report.enabled": B(),
    "report.baseline": S(null=True),
    "report.out_dir": S(null=True),
    # names of reports/sections/: the type is checked here, the names by reports.callback.check_report_config
    # at pre-flight (sweep.py passes it in: this layer does not import the reports layer)
    "report.sections": L(S(pattern=r"[a-z][a-z0-9_]*")),
    "tracking.uri": S(min_len=1),
    "tracking.artifact_root": S(min_len=1),
    "tracking.min_free_mb": F(0),
    "tracking.lease_stale_s": F(1),
    "tracking.outage_s": F(0),
    "tracking.system_metrics": B(),
    "tracking.system_metrics_interval_s": F(1),
    # training
    "train.steps": I(1), "train.prompts_per_step": I(1), "train.group_size": I(1), "train.ppo_epochs": I(1),
    "train.minibatch_size": I(1, null=True), "train.lr": F(0, 1, lo_open=True),
    "train.betas": L(F(0, 1), min_len=2, max_len=2), "train.weight_decay": F(0), "train.warmup_steps": I(0),
    "train.max_grad_norm": F(0, lo_open=True), "train.max_nonfinite_steps": I(1), "train.temperature": F(0, 10, lo_open=True), "train.top_p": F(0, 1, lo_open=True),
    "train.max_new_tokens": I(1), "train.checkpoint_every": I(0), "train.save_every": I(0, null=True),
    "train.validate_every": I(0),
    "train.precision": S(("auto", "fp32", "bf16")), "train.gradient_checkpointing": B(), "train.keep_state": B(), "train.device": S(pattern=DEVICE),
    "train.rollout.sampler": S(pattern=r"[a-z][a-z0-9_]*"), "train.rollout.dtype": S(("auto", "float32", "bfloat16", "float16")),
    "train.rollout.gpu_memory_utilization": F(0, 1, lo_open=True), "train.rollout.staleness": I(0),
    "train.rollout.overlap": B(),
    "train.rollout.old_policy": S(("recompute", "behaviour")), "train.rollout.correction": S(pattern=r"[a-z][a-z0-9_]*"),
    # train.rollout.correction: its choices are the registered corrections' names (collect_specs)
    "train.rollout.correction_cap": F(1), "train.rollout.correction_lower": F(0, 1, lo_open=True, null=True),
    "train.keep_top_k": I(1, null=True),
    # memory (training/memory_plan.py; values the local engine's validate() checks further)
    "train.micro_batch_tokens": Spec("any"), "train.packing": S(("auto", "tree", "packed", "padded")),
    "train.memory_check": Spec("any"), "train.device_memory_gb": F(0, lo_open=True, null=True),
    "train.max_prompt_tokens": I(1),
    # LoRA (core/lora.py; LoraSettings.check refuses what these types let through)
    "train.lora.rank": I(0), "train.lora.alpha": F(0, lo_open=True), "train.lora.dropout": F(0, 1),
    "train.lora.target_modules": Spec("any"), "train.lora.lr": Spec("any"),
    # model
    "model.name": S(min_len=1), "model.source": S(("gguf_wheel", "tiny_random", "pretrained")),
    "model.path": S(null=True), "model.package": S(), "model.gguf_file": S(), "model.tokenizer_name": S(),
    "model.chat_template": B(), "model.hidden_size": I(1), "model.intermediate_size": I(1), "model.num_heads": I(1),
    "model.num_layers": I(1), "model.init_seed": I(0),
    # data (the task's own validate() checks values against each other)
    "data.name": S(min_len=1),  # the task's own keys: its ``config`` (core/tasks/<module>.py)
    "data.validation_prompts": I(0),  # core.tasks.load_prompts: the last N training prompts, held out of training
    # evaluation: its keys are evaluation.checks.CONFIG's (collected below)
    # tools (multi-turn rollouts)
    "tools.max_turns": I(1), "tools.max_obs_tokens": I(1), "tools.search.url": S(null=True, pattern=r"https?://\S+"),
    "tools.search.index": S(null=True), "tools.search.backend": S(("bm25", "e5")), "tools.search.topk": I(1),
    "tools.search.timeout_s": F(0, lo_open=True),
    # engine
    "engine.name": S(min_len=1),  # the engine's own keys: its CONFIG (training/engines/<name>.py)
    # algorithm (advantage.* and policy_loss.* are typed from the registered functions)
    "algo.name": S(min_len=1), "algo.kl_beta": F(0), "algo.entropy_coef": F(0),
    "algo.advantage.name": S(min_len=1), "algo.policy_loss.name": S(min_len=1),
    "algo.dynamic_sampling.enabled": B(), "algo.dynamic_sampling.max_num_gen_batches": I(1),
    "algo.overlong_buffer.enabled": B(), "algo.overlong_buffer.fraction": F(0, 1, lo_open=True, null=True),
    "algo.overlong_buffer.length": I(1, null=True), "algo.overlong_buffer.penalty_factor": F(0),
}
FREE = ("hydra", "eval.vllm.extra")
DECODING_KEYS = ("n", "ks", "temperature", "top_p", "max_new_tokens")  # eval.decoding.<benchmark>.<key>, typed as eval.<key>  # subtrees passed through as they are

def check_value(key: str, value, spec: Spec) -> None:
    """Raise :class:`ConfigError` naming ``key`` unless ``value`` fits ``spec`` (:func:`core.config_keys.check_value`)."""
    try:
        _check_value(key, value, spec)
    except BadValue as e:
        raise ConfigError(str(e)) from None


def _annotation_spec(annotation, default) -> Spec:
    """The spec of one parameter from its annotation: a real type (``float``, ``int | None``, ``Optional[str]``) or
    a postponed one (a string, as ``from __future__ import annotations`` leaves it); anything else is ``any``."""
    if isinstance(annotation, str):  # postponed and not resolvable: read the text
        text = annotation.replace("typing.", "").replace("Optional[", "").rstrip("]")
        parts = [t.strip() for t in text.split("|")]
    else:
        args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
        parts = [getattr(a, "__name__", str(a)) for a in (args or (annotation,))]
    null = "None" in parts or "NoneType" in parts or default is None
    base = next((t for t in parts if t not in ("None", "NoneType")), "")
    return {"float": F(null=null), "int": I(null=null), "bool": B(null=null), "str": S(null=null)}.get(base, Spec("any"))


def _hints(fn) -> dict:
    """``fn``'s annotations resolved (:func:`typing.get_type_hints`), with or without postponed evaluation in its
    module; the raw annotations when a name cannot be resolved."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return dict(getattr(fn, "__annotations__", {}) or {})


def algorithm_specs(cfg) -> dict[str, Spec]:
    """Specs of ``algo.advantage.*`` and ``algo.policy_loss.*`` from the registered functions' signatures."""
    from training.algorithms import get_advantage_fn, get_policy_loss_fn

    out = {}
    for kind, getter, skip in (("advantage", get_advantage_fn, 1), ("policy_loss", get_policy_loss_fn, 3)):
        name = OmegaConf.select(cfg, f"algo.{kind}.name")
        try:
            fn = getter(name)
        except (KeyError, TypeError):
            continue  # validate_config names the unknown function
        params = list(inspect.signature(fn).parameters.values())[skip:]
        hints = _hints(fn)
        on = OmegaConf.select(cfg, f"algo.{kind}.base_estimator") if kind == "advantage" else None
        if on and any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):  # a shaping estimator: its base's keys
            try:
                params = list(inspect.signature(getter(on)).parameters.values())[skip:] + params
                hints = _hints(getter(on)) | hints
            except KeyError:
                pass  # validate_config names the unknown base
        for p in params:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            default = None if p.default is inspect.Parameter.empty else p.default
            out[f"algo.{kind}.{p.name}"] = _annotation_spec(hints.get(p.name, p.annotation), default)
    return out


def leaves(cfg) -> dict:
    """``{dotted key: value}`` of every leaf of the config (lists are leaves; interpolations resolved)."""
    out = {}

    def walk(node, prefix):
        for k in node.keys():
            key = f"{prefix}{k}"
            if key in FREE:
                out[key] = OmegaConf.to_container(node[k], resolve=True) if isinstance(node[k], (DictConfig, ListConfig)) else node[k]
                continue
            try:
                child = node[k]
            except Exception as e:  # an interpolation that does not resolve
                raise ConfigError(f"{key}: {e}") from None
            if isinstance(child, DictConfig):
                walk(child, key + ".")
            else:
                out[key] = OmegaConf.to_container(child, resolve=True) if isinstance(child, ListConfig) else child
    walk(cfg, "")
    return out


def key_spec(key: str, specs: dict) -> Spec | None:
    """The :class:`Spec` of a dotted key: ``specs[key]``, or for ``eval.decoding.<benchmark>.<k>`` (one benchmark's
    own decoding, :data:`evaluation.checks.DECODING_KEYS`) the spec of ``eval.<k>``; None for a key the schema
    does not know."""
    from evaluation.checks import DECODING_KEYS

    parts = key.split(".")
    if len(parts) == 4 and key.startswith("eval.decoding.") and parts[3] in DECODING_KEYS:
        return specs.get(f"eval.{parts[3]}")
    return specs.get(key)


def collect_specs(cfg) -> dict[str, Spec]:
    """Every key the composed ``cfg`` may hold, with its :class:`Spec`: :data:`SCHEMA` (the keys of the run itself:
    seed, tracking, train, model, the evaluation protocol) and the declarations of the components the config selects
    or may select: the algorithm's functions (:func:`algorithm_specs`), the training data task's ``config``
    (``data.<key>``; a task that declares none takes any key), the engine's ``CONFIG``, every sampler's ``CONFIG``
    and every metric table's ``knobs``; ``train.rollout.correction``'s choices are the registered rollout
    corrections (:mod:`training.corrections`). Plug-in modules named in ``plugins`` are imported first.

    Raises:
        ConfigError: a plug-in module that does not import.
    """
    from core.plugins import load_plugins
    from core.sampling import SAMPLERS
    from core.tasks import TASKS
    from evaluation.tables import TABLES
    from training.engines import engine_config

    plugins = OmegaConf.select(cfg, "plugins")
    check_value("plugins", OmegaConf.to_container(plugins) if isinstance(plugins, ListConfig) else plugins, SCHEMA["plugins"])
    try:
        load_plugins(plugins)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    from evaluation.checks import CONFIG as EVAL_CONFIG

    specs = {**SCHEMA, **EVAL_CONFIG, **algorithm_specs(cfg)}
    data_name = OmegaConf.select(cfg, "data.name")
    if data_name in TASKS:
        specs.update({f"data.{k}": v for k, v in TASKS.get(data_name).config.items()})
    specs.update(engine_config(str(OmegaConf.select(cfg, "engine.name"))))
    for spec in SAMPLERS.values():
        specs.update(spec.config)
    from training.corrections import CORRECTIONS  # the built-ins and the plug-ins' (imported above)

    specs["train.rollout.correction"] = S(tuple(CORRECTIONS.keys()))
    for table in TABLES.values():
        specs.update(table.knobs)
    return specs


def free_data(cfg) -> bool:
    """True when the training data task declares no keys (a plug-in task's data config is free-form)."""
    from core.tasks import TASKS

    name = OmegaConf.select(cfg, "data.name")
    return name not in TASKS or not TASKS.get(name).config


def check_schema(cfg) -> list[str]:
    """Check every key of ``cfg`` against :data:`SCHEMA` (and the algorithm's signatures).

    Returns:
        Warnings about legal but suspicious settings (a checkpoint interval longer than the run).
    Raises:
        ConfigError: one line naming the first unknown key or bad value.
    """
    specs = collect_specs(cfg)
    data_free = free_data(cfg)
    # shallow keys first: a bad top-level knob (delta) is named itself, not where it is interpolated
    for key, value in sorted(leaves(cfg).items(), key=lambda kv: kv[0].count(".")):
        if key.split(".")[0] == "hydra":
            continue
        parts = key.split(".")
        if key.startswith("eval.decoding."):
            from evaluation.checks import DECODING_KEYS
        if key.startswith("eval.decoding.") and len(parts) == 3 and value is not None:
            raise ConfigError(f"{key}={value!r}: expected a mapping of {list(DECODING_KEYS)}")
        spec = key_spec(key, specs)
        if spec is None and key.startswith("eval.decoding.") and len(parts) == 4:
            raise ConfigError(f"{key}={value!r}: unknown key (a typo?); known keys of eval.decoding.{parts[2]}: "
                              f"{list(DECODING_KEYS)}")
        if spec is None:
            free = any(key == f or key.startswith(f + ".") for f in FREE)
            if free or (data_free and key.startswith("data.")):
                continue
            group = key.rsplit(".", 1)[0] if "." in key else ""
            known = sorted(k.rsplit(".", 1)[-1] for k in specs if (k.rsplit(".", 1)[0] if "." in k else "") == group)
            raise ConfigError(f"{key}={value!r}: unknown key (a typo?); known keys{f' of {group}' if group else ''}: {known}")
        check_value(key, value, spec)
    warnings = []
    steps, every = OmegaConf.select(cfg, "train.steps"), OmegaConf.select(cfg, "train.checkpoint_every")
    if isinstance(every, int) and isinstance(steps, int) and every > steps:
        warnings.append(f"train.checkpoint_every={every} > train.steps={steps}: the state is saved only at the end")
    return warnings
