"""Validate a composed run config before any model is loaded.

Every check raises :class:`ConfigError` with one line naming the key and the bad value.
"""
from __future__ import annotations

import inspect
import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from training.algorithms import get_advantage_fn, get_policy_loss_fn, validate_params

from .errors import ConfigError


def _num(cfg, key: str):
    try:
        value = OmegaConf.select(cfg, key, throw_on_missing=True)
    except Exception as e:  # missing or interpolation error
        raise ConfigError(f"{key}: {e}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ConfigError(f"{key}={value!r}: expected a finite number")
    return value


def _list(cfg, key: str) -> list:
    """The list at ``key`` (empty when null); a scalar given where a list is expected is a ConfigError."""
    from omegaconf import ListConfig

    value = OmegaConf.select(cfg, key)
    if value is None:
        return []
    if not isinstance(value, (ListConfig, list, tuple)):
        raise ConfigError(f"{key}={value!r}: expected a list, e.g. {key}=[{value}]")
    return list(value)


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


def _int_at_least(cfg, key: str, low: int, allow_null: bool = False):
    value = OmegaConf.select(cfg, key)
    if value is None and allow_null:
        return None
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
             f"{key}={value!r}: expected an integer >= {low}" + (" or null" if allow_null else ""))
    return value


VLLM_KEYS = ("gpu_memory_utilization", "tensor_parallel_size", "max_model_len", "enforce_eager", "kv_cache_memory_bytes",
             "dtype", "extra")


def check_eval_engine(cfg, n: int) -> None:
    """The sampler and its settings, flip rates, checkpoint evaluation (``eval.sampler``, ``eval.dtype``, ...)."""
    from core.models import DTYPES
    from core.sampling import SAMPLERS, resolve_sampler

    name = cfg.eval.get("sampler", "auto")
    _require(isinstance(name, str) and name in ("auto", *SAMPLERS),
             f"eval.sampler={name!r}: expected one of {['auto', *SAMPLERS]}")
    try:
        resolve_sampler(name)
        from evaluation.evaluate import evaluation_sampler

        evaluation_sampler(cfg.eval)  # tool benchmarks need the hf sampler
    except (ValueError, KeyError) as e:
        raise ConfigError(str(e).strip('"')) from None
    for key in ("eval.dtype", "eval.vllm.dtype"):
        v = OmegaConf.select(cfg, key)
        _require(v is None and key != "eval.dtype" or v in ("auto", *DTYPES),
                 f"{key}={v!r}: expected auto or one of {sorted(DTYPES)}")
    dev = str(cfg.eval.get("device", "auto"))
    _require(dev in ("auto", "cpu") or dev.split(":")[0] == "cuda", f"eval.device={dev!r}: expected auto, cpu or cuda[:i]")
    _require(isinstance(cfg.eval.get("base", True), bool), f"eval.base={cfg.eval.get('base')!r}: expected true or false")
    k = _int_at_least(cfg, "eval.flip_k", 1, allow_null=True)
    _require(k is None or k <= n, f"eval.flip_k={k}: larger than eval.n={n} (a prompt has only n samples)")
    which = cfg.eval.get("checkpoints", "final")
    _require(which in ("final", "all"), f"eval.checkpoints={which!r}: expected final or all")
    save_every = _int_at_least(cfg, "train.save_every", 0) if cfg.train.get("save_every") is not None else 0
    _require(which != "all" or save_every > 0,
             "eval.checkpoints=all: no checkpoints are kept during training; set train.save_every=N (N >= 1)")
    for key in ("eval.score_rows", "eval.score_tokens"):
        if OmegaConf.select(cfg, key) is not None:
            _int_at_least(cfg, key, 1)
    vl = cfg.eval.get("vllm")
    if vl is not None:
        _require(hasattr(vl, "keys"), f"eval.vllm={vl!r}: expected a mapping of vllm.LLM arguments")
        unknown = [key for key in vl.keys() if key not in VLLM_KEYS]
        _require(not unknown, f"eval.vllm: unknown key(s) {unknown}; known: {list(VLLM_KEYS)} "
                              "(put any other vllm.LLM argument under eval.vllm.extra)")
        gmu = vl.get("gpu_memory_utilization")
        _require(gmu is None or (isinstance(gmu, (int, float)) and not isinstance(gmu, bool) and 0 < gmu <= 1),
                 f"eval.vllm.gpu_memory_utilization={gmu!r}: expected a share in (0, 1]")
        for key in ("tensor_parallel_size", "max_model_len", "kv_cache_memory_bytes"):
            _int_at_least(cfg, f"eval.vllm.{key}", 1, allow_null=True)


def validate_config(cfg: DictConfig) -> list[str]:
    """Check a composed run config; raise :class:`ConfigError` (one line) on the first problem.

    Checks: the algorithm's advantage estimator and policy loss exist, accept the configured
    parameters and pass their own registered validators (delta > 0, clip bounds >= 0, a known loss
    aggregation mode, ...); kl_beta and entropy_coef >= 0; DAPO's dynamic sampling and overlong buffer
    settings; training sizes positive; evaluation ks within [1, eval.n]; sampling parameters in range.

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
    delta = _num(cfg, "delta")
    _require(delta > 0, f"delta={delta!r}: the trust-region radius must be > 0")
    for key in ("kl_beta", "entropy_coef"):
        if algo.get(key) is not None:
            v = _num(cfg, f"algo.{key}")
            _require(v >= 0, f"algo.{key}={v!r}: must be >= 0")
    dyn = algo.get("dynamic_sampling")
    if dyn and dyn.get("enabled", False):
        v = _num(cfg, "algo.dynamic_sampling.max_num_gen_batches")
        _require(int(v) == v and v >= 1, f"algo.dynamic_sampling.max_num_gen_batches={v!r}: expected an integer >= 1")
    over = algo.get("overlong_buffer")
    if over and over.get("enabled", False):
        from training.rewards import overlong_buffer_length

        if over.get("length") is not None:
            _num(cfg, "algo.overlong_buffer.length")
        if over.get("fraction") is not None:
            _num(cfg, "algo.overlong_buffer.fraction")
        try:
            overlong_buffer_length(over, int(_num(cfg, "train.max_new_tokens")))
        except ValueError as e:   # names the bad key and value
            raise ConfigError(str(e)) from None
        _require(_num(cfg, "algo.overlong_buffer.penalty_factor") >= 0,
                 f"algo.overlong_buffer.penalty_factor={over.penalty_factor!r}: must be >= 0")

    # -- training
    for key in ("train.steps", "train.prompts_per_step", "train.group_size", "train.ppo_epochs", "train.max_new_tokens"):
        v = _num(cfg, key)
        _require(int(v) == v and v >= 1, f"{key}={v!r}: expected an integer >= 1")
    mb = cfg.train.get("minibatch_size")
    if mb is not None:
        v = _num(cfg, "train.minibatch_size")
        _require(int(v) == v and v >= 1, f"train.minibatch_size={v!r}: expected an integer >= 1 or null")
    for key in ("train.lr", "train.temperature", "train.max_grad_norm"):
        v = _num(cfg, key)
        _require(v > 0, f"{key}={v!r}: must be > 0")
    top_p = _num(cfg, "train.top_p")
    _require(0 < top_p <= 1, f"train.top_p={top_p!r}: must be in (0, 1]")

    # -- data: the training task's own checks
    from core.tasks import get_task, load_plugins, task_names

    try:
        load_plugins(cfg.get("plugins"))
    except ImportError as e:
        raise ConfigError(str(e)) from None
    try:
        data_task = get_task(cfg.data.name)
    except KeyError as e:
        raise ConfigError(f"data={cfg.data.name!r}: {e.args[0]}") from None
    try:
        data_task.validate(cfg.data, "data")
    except ValueError as e:
        raise ConfigError(str(e)) from None

    # -- evaluation
    n = _num(cfg, "eval.n")
    _require(int(n) == n and n >= 1, f"eval.n={n!r}: expected an integer >= 1")
    ks = _list(cfg, "eval.ks")
    bad = [k for k in ks if not isinstance(k, int) or k < 1 or k > n]
    _require(not bad, f"eval.ks={ks}: every k must be an integer in [1, eval.n={int(n)}] (pass@k is undefined for k > n); bad: {bad}")
    _require(_num(cfg, "eval.temperature") >= 0, f"eval.temperature={cfg.eval.temperature!r}: must be >= 0 (0: greedy)")
    if _num(cfg, "eval.temperature") == 0 and n > 1:
        warnings.append(f"eval.temperature=0 (greedy decoding) with eval.n={int(n)}: the n samples of a prompt are "
                        "one sequence, so pass@k equals pass@1 for every k; the papers' greedy protocols use n=1")
    extra_t = _list(cfg, "eval.extra_temperatures")
    bad_t = [t for t in extra_t if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.01 <= t <= 10]
    _require(not bad_t, f"eval.extra_temperatures={extra_t}: every temperature must be a number in [0.01, 10]; bad: {bad_t}")
    _require(len({f"{float(t):g}" for t in extra_t}) == len(extra_t),
             f"eval.extra_temperatures={extra_t}: repeated temperature")
    _require(0 < _num(cfg, "eval.top_p") <= 1, f"eval.top_p={cfg.eval.top_p!r}: must be in (0, 1]")
    benches = _list(cfg, "eval.benchmarks")
    _require(len(benches) > 0, "eval.benchmarks is empty")
    for b in benches:  # every benchmark is a registered task, with its own checks
        try:
            task = get_task(b)
        except KeyError:
            raise ConfigError(f"eval.benchmarks={benches}: unknown benchmark {b!r}; registered tasks: {task_names()}") from None
        _require(not task.heldout_from_data or cfg.data.name == b,
                 f"eval.benchmarks={benches}: {b!r} is the held-out split of data={b}, but data={cfg.data.name}")
        if not task.heldout_from_data:
            try:
                task.validate(cfg.eval, "eval")
            except ValueError as e:
                raise ConfigError(str(e)) from None
    try:
        from evaluation.evaluate import decoding_plan

        plan = decoding_plan(cfg.eval)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for b, c in plan.items():
        if c is cfg.eval:
            continue
        nb, ksb = c.n, list(c.ks)
        bad = [k for k in ksb if not isinstance(k, int) or k < 1 or k > nb]
        _require(not bad, f"eval.decoding.{b}.ks={ksb}: every k must be an integer in [1, n={nb}] for {b}; bad: {bad}")
        if float(c.temperature) == 0 and nb > 1:
            warnings.append(f"eval.decoding.{b}: greedy decoding (temperature 0) with n={nb}: one sequence n times; "
                            "use n: 1")
        n = min(n, nb)  # flip_k must fit every benchmark
    check_eval_engine(cfg, int(n))
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
