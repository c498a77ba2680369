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


def _check_against_the_model(cfg) -> None:
    """Every length against the model's context (:func:`core.models.context_length`: prompt and response share it):
    the training and evaluation response lengths, each benchmark's own, vLLM's ``max_model_len``, and an engine's prompt
    budget (``engine.max_prompt_length``) with the training response length. A model whose
    context cannot be read here (a hub model not downloaded yet) is not checked."""
    from core.models import context_length

    ctx = context_length(cfg.model)
    if ctx is None:
        return
    model = cfg.model.get("name")
    lengths = {"train.max_new_tokens": OmegaConf.select(cfg, "train.max_new_tokens"),
               "eval.max_new_tokens": OmegaConf.select(cfg, "eval.max_new_tokens")}
    for bench, over in (OmegaConf.select(cfg, "eval.decoding") or {}).items():
        if over is not None and over.get("max_new_tokens") is not None:
            lengths[f"eval.decoding.{bench}.max_new_tokens"] = over.get("max_new_tokens")
    for key, n in lengths.items():
        _require(n is None or int(n) < ctx, f"{key}={n}: the model {model} holds {ctx} tokens of context, prompt and "
                                            "response together: a response that long leaves no room for the prompt")
    max_len = OmegaConf.select(cfg, "eval.vllm.max_model_len")
    _require(max_len is None or int(max_len) <= ctx,
             f"eval.vllm.max_model_len={max_len}: the model {model} holds {ctx} tokens of context")
    # an engine that budgets the prompt itself (verl: data.max_prompt_length, its rollout server's max_model_len is
    # prompt + response) must fit both in the context
    prompt = OmegaConf.select(cfg, "engine.max_prompt_length")
    new = OmegaConf.select(cfg, "train.max_new_tokens")
    _require(prompt is None or new is None or int(prompt) + int(new) <= ctx,
             f"engine.max_prompt_length={prompt}: with train.max_new_tokens={new} that is {int(prompt or 0) + int(new or 0)} "
             f"tokens, and the model {model} holds {ctx} tokens of context")


def _check_the_policy_can_change(cfg) -> None:
    """Refuse a group of one response per prompt when the configured advantage estimator gives every such response
    advantage 0 (measured: the estimator run on four groups of one with rewards 1, 0, 1, 0): the loss gradient is
    then 0 at every step and the policy never moves. An estimator that does not centre on its group passes."""
    if OmegaConf.select(cfg, "train.group_size") != 1:
        return
    import torch

    from training.batch import RolloutBatch

    node = cfg.algo.advantage
    params = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k != "name"}
    B, L = 4, 3
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, L, generator=g) * 3
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    batch = RolloutBatch(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                         response_ids=torch.ones(B, L, dtype=torch.long), response_mask=torch.ones(B, L),
                         old_logprobs=old, rewards=rewards, group_index=torch.arange(B),
                         response_lengths=torch.full((B,), L), ref_logprobs=old.clone(), correct=rewards > 0)
    try:
        adv, _ = get_advantage_fn(str(node.name))(batch, **params)
    except Exception:  # an estimator that cannot run on this batch is not judged here
        return
    _require(not bool(torch.all(torch.as_tensor(adv) == 0)),
             f"train.group_size=1: {node.name}'s advantages are all 0 in a group of one response per prompt, so the "
             "policy never changes; use train.group_size >= 2")


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
    the response length, every length within the model's context, no group of one under an estimator that then
    gives advantage 0, checkpoint evaluation needing kept checkpoints, search-tool tasks needing a corpus.

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

    # -- the model and the algorithm against the rest: lengths within its context, a policy that can change, a
    # minibatch within the batch (the model's files and the data are read by orchestrator.preflight.check_inputs)
    _check_against_the_model(cfg)
    _check_the_policy_can_change(cfg)
    mb, per, g = (OmegaConf.select(cfg, f"train.{k}") for k in ("minibatch_size", "prompts_per_step", "group_size"))
    _require(mb is None or per is None or g is None or int(mb) <= int(per) * int(g),
             f"train.minibatch_size={mb}: larger than the batch (train.prompts_per_step={per} x train.group_size={g} = "
             f"{int(per or 0) * int(g or 0)} responses); null takes the whole batch in one optimiser step")

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
    select_on = str(cfg.eval.get("select_on", "final"))
    n_val = int(OmegaConf.select(cfg, "data.validation_prompts") or 0)
    if select_on == "validation":
        _require(n_val > 0, "eval.select_on=validation: no validation split; set data.validation_prompts=N (N >= 1 "
                            "training prompts held out of training)")
        _require(save_every > 0, "eval.select_on=validation: only the final checkpoint is kept; set train.save_every=N "
                                 "(N >= 1) so there is a choice")
        _require(int(cfg.eval.validation.k) <= int(cfg.eval.validation.n),
                 f"eval.validation.k={cfg.eval.validation.k}: larger than eval.validation.n={cfg.eval.validation.n}")
        _require(cfg.eval.get("checkpoints", "final") != "all",
                 "eval.select_on=validation with eval.checkpoints=all: the run's benchmark metrics would mix the "
                 "chosen checkpoint's with later ones'; use one or the other")
    _require(not cfg.train.get("keep_top_k") or select_on == "validation",
             f"train.keep_top_k={cfg.train.get('keep_top_k')}: checkpoints are ranked on the validation split; set "
             "eval.select_on=validation")
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
