"""The local engine's checks: its own settings at pre-flight (:func:`check`) and the memory plan, at pre-flight and on
the training machine before any weight loads (:func:`plan`)."""
from __future__ import annotations

from training.settings import RunSettings


def check(s: RunSettings) -> list[str]:
    """Pre-flight of the local engine's own settings (``train.gradient_checkpointing``, ``train.precision``,
    ``train.rollout.*``, ``train.micro_batch_tokens``, ``train.lora``, ``train.memory_check``). Returns warnings.

    Raises:
        ValueError: gradient checkpointing asked of a model class that does not support it; a rollout sampler that is
            unknown, not installed or cannot sample a policy; a correction without a sampler that returns its own
            log-probs; overlapped generation without staleness (one line, naming the key).
    """
    from core.models import model_class
    from core.sampling import SAMPLERS, choose_rollout_sampler, resolve_sampler

    warnings = []
    name, correction = s.rollout.sampler, s.rollout.correction
    if name != "auto":
        try:
            resolve_sampler(name)
            choose_rollout_sampler(name, None)
        except ValueError as e:
            raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None
    k, old_policy = s.rollout.staleness, s.rollout.old_policy
    if old_policy == "behaviour" and correction != "none":
        raise ValueError(f"train.rollout.correction={correction} with train.rollout.old_policy=behaviour: the loss's ratio "
                         "is already pi/b and there is no proximal pass p to correct by p/b; set "
                         "train.rollout.correction=none or train.rollout.old_policy=recompute")
    if correction != "none" and k == 0 and not (name in SAMPLERS and SAMPLERS[name].rollout_logprobs):
        raise ValueError(f"train.rollout.correction={correction}: corrects the mismatch between the trainer and a sampler "
                         f"with log-probs of its own: set train.rollout.sampler to one of "
                         f"{[k for k, v in SAMPLERS.items() if v.rollout_logprobs]} (it is {name}), or "
                         "train.rollout.staleness >= 1 (then it corrects the staleness)")
    if k >= s.steps:
        raise ValueError(f"train.rollout.staleness={k} with train.steps={s.steps}: every step would train on the "
                         f"starting policy's samples; set train.rollout.staleness <= {max(0, s.steps - 1)}")
    if s.rollout.overlap and k == 0:
        raise ValueError("train.rollout.overlap=true with train.rollout.staleness=0: a step's samples come from the "
                         "weights its update changes, so there is nothing to generate during it; set "
                         "train.rollout.staleness >= 1 or train.rollout.overlap=false")
    if k >= 1 and old_policy == "recompute" and correction == "none":
        warnings.append(f"train.rollout.staleness={k} with train.rollout.correction=none: the loss's ratio is pi/p (p: "
                        "the policy at the step's start) and ignores that the samples came from a policy up to "
                        f"{k} steps older; a correction (token_tis, icepop, ...) weighs them by p/b")
    if s.gradient_checkpointing:
        cls = model_class(s.model)
        if cls is not None and not getattr(cls, "supports_gradient_checkpointing", False):
            raise ValueError(f"train.gradient_checkpointing=true: model {s.model.name!r} ({cls.__name__}) does not "
                             "support gradient checkpointing; set train.gradient_checkpointing=false")
    budget = s.micro_batch_tokens
    if not (budget is None or budget == "auto" or (isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1)):
        raise ValueError(f"train.micro_batch_tokens={budget!r}: expected auto, null (the whole minibatch in one pass) "
                         "or a number of tokens >= 1")
    if isinstance(budget, int) and not isinstance(budget, bool):
        longest = s.max_prompt_tokens + s.max_new_tokens
        if budget < s.max_new_tokens + 1:
            raise ValueError(f"train.micro_batch_tokens={budget}: one pass must hold a whole sequence, prompt and "
                             f"response (train.max_new_tokens={s.max_new_tokens}); set at least {longest} or auto")
    s.lora.check()
    if s.memory_check not in ("auto", True, False):
        raise ValueError(f"train.memory_check={s.memory_check!r}: expected auto, true or false")
    from core.precision import native_bf16, phrase, probe_slowdown

    # (emulated bf16 is refused by the orchestrator's pre-flight, not warned about)
    if s.device_type == "cpu" and s.bf16 and native_bf16(s.device_type)[0]:
        ratio = probe_slowdown("cpu")  # what bf16 costs or saves on this machine, measured now (not a fixed claim)
        warnings.append(f"train.precision={s.precision_setting}: bf16 on this CPU (a probe just now: {phrase(ratio)}); "
                        "bf16's log-probabilities are coarse "
                        "(ratios are exact on the first minibatch, not after updates)")
    return warnings


def plan(s: RunSettings, remote: bool = False):
    """The run's memory plan (:func:`training.memory_plan.plan_for`) and the one-line refusal when it does not fit
    its device (None when it fits or the device's size is unknown).

    Args:
        remote: the run trains on another machine (a cluster launcher): its device's size is
            ``train.device_memory_gb`` when set, else unknown (nothing refused here; the job checks on its node).
    Raises:
        ValueError: the model's shape is not known here (names ``model.path``).
    """
    from training.memory_plan import model_shape, plan_for, refusal

    sampler = planned_sampler(s, model_shape(s.model).n_params, s.device_type == "cuda")
    if remote:
        p = plan_for(s, detect=False, rollout=sampler)
        return p, refusal(p)
    p = plan_for(s, longest_prompt=preflight_longest_prompt(s), rollout=sampler)
    return p, refusal(p)


_LONGEST: dict = {}  # (model, data) -> the longest training prompt in tokens: a sweep's points share it


def preflight_longest_prompt(s: RunSettings) -> int | None:
    """The longest training prompt in tokens, as the run will measure it (:func:`longest_prompt`), when the
    tokenizer is on this machine and the prompts load here; else None (the plan then bounds it by
    ``train.max_prompt_tokens``). Cached per model, data and template: a sweep's points share it."""
    import json

    from omegaconf import OmegaConf

    try:
        key = (json.dumps(OmegaConf.to_container(s.model, resolve=True), sort_keys=True, default=str),
               json.dumps(OmegaConf.to_container(s.data, resolve=True), sort_keys=True, default=str))
    except Exception:
        return None
    if key not in _LONGEST:
        try:
            from core.models import load_tokenizer
            from core.tasks import load_prompts

            tokenizer = load_tokenizer(s.model)
            _LONGEST[key] = longest_prompt(tokenizer, load_prompts(s.data, "train"), bool(s.chat_template)) or None
        except Exception:  # a hub model not cached here, data elsewhere: the plan keeps its upper bound
            _LONGEST[key] = None
    return _LONGEST[key]


def longest_prompt(tokenizer, prompts: list, chat: bool) -> int:
    """Tokens of the longest training prompt as the model sees it (chat template and a task's prefill included)."""
    from core.sampling import prompt_texts

    if not prompts:
        return 0
    texts = prompt_texts(tokenizer, [r["prompt"] for r in prompts], chat)
    texts = [x + r.get("response_prefix", "") for x, r in zip(texts, prompts)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return max(len(x) for x in ids)


def rollout_choice(s: RunSettings, n_params: int, gpu: bool, steps: int | None = None) -> tuple[str, str, float | None]:
    """The rollout sampler a run uses, why (``train.rollout.sampler``; ``auto``: the lowest estimated sampling time
    for the run's size, :func:`core.sampling.choose_rollout_sampler`) and, for ``auto``, the chosen sampler's
    estimated sampling time in seconds (None when asked for by name).

    Raises:
        ValueError: naming ``train.rollout.sampler`` (unknown, or not installed here).
    """
    from core.models import model_path
    from core.sampling import RolloutPlan, choose_rollout_sampler, vllm_engine_defaults
    from core.sampling.rollout import rollout_estimate_s

    ready = False
    try:  # a vLLM engine of this process that would serve the run needs no start
        from core import vllm_engine

        engine = vllm_engine.current_engine()
        if engine is not None:
            kwargs = {**vllm_engine_defaults(gpu), **({"gpu_memory_utilization": s.rollout.gpu_memory_utilization}
                                                      if gpu else {})}
            ready = vllm_engine.serves(engine, model_path(s.model), s.rollout_dtype, kwargs,
                                       any_cache=True)  # (a cache of another size: still no start)
    except (ImportError, OSError):
        ready = False
    plan = RolloutPlan(steps=int(steps if steps is not None else s.steps),
                       sequences=s.rows_per_step * s.dynamic.rounds,
                       max_new_tokens=s.max_new_tokens, n_params=int(n_params), gpu=bool(gpu), engine_ready=ready)
    try:
        name, reason = choose_rollout_sampler(s.rollout.sampler, plan)
    except ValueError as e:
        raise ValueError(str(e).replace("eval.sampler=", "train.rollout.sampler=")) from None
    return name, reason, (rollout_estimate_s(name, plan) if s.rollout.sampler == "auto" else None)


def planned_sampler(s: RunSettings, n_params: int, gpu: bool) -> str:
    """The rollout sampler the memory plan counts: ``train.rollout.sampler``, with ``auto`` resolved as the run will
    resolve it (:func:`rollout_choice`), so the plan holds only the engine the run uses; ``auto`` where the choice
    cannot be made here (a sampler not installed: the run refuses it anyway)."""
    if s.rollout.sampler != "auto":
        return s.rollout.sampler
    try:
        return rollout_choice(s, n_params, gpu)[0]
    except ValueError:
        return "auto"
