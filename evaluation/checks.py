"""The evaluation's keys and checks: :data:`CONFIG` declares the ``eval.*`` keys (types and ranges, checked by the
schema with the components' own declarations); the functions here are the rules that relate them to each other. :func:`check_eval` is the one
check the sweep's pre-flight and the evaluation command run; :func:`check_decoding` also runs when an
:class:`evaluation.pipeline.EvalJob` is built, before any sampling.
"""
from __future__ import annotations

from core.config_keys import DEVICE, B, BadValue, F, I, L, S, Spec, check_value
from core.tasks import get_task

from .protocol import evaluation_sampler

# The evaluation's own keys (``eval.*``; a sampler's ``eval.<name>.*`` and a metric table's knobs are declared by them)
CONFIG: dict[str, Spec] = {
    "eval.name": S(null=True), "eval.base": B(), "eval.batch_prompts": I(1, null=True),
    "eval.benchmarks": L(S(min_len=1), min_len=1), "eval.checkpoints": S(("final", "all")),
    "eval.code_reward": S(("share", "all_pass")), "eval.data_dir": S(null=True), "eval.device": S(pattern=DEVICE),
    "eval.dtype": S(("auto", "float32", "bfloat16", "float16")), "eval.entropy": B(),
    "eval.extra_temperatures": L(F(0.01, 10), null=True), "eval.ks": L(I(1), min_len=1),
    "eval.max_new_tokens": I(1), "eval.max_prompts": I(1, null=True), "eval.n": I(1), "eval.prompt_template": S(null=True),
    "eval.sampler": S(min_len=1), "eval.score_rows": I(1), "eval.score_tokens": I(1), "eval.seed": I(0),
    "eval.temperature": F(0, 10), "eval.top_p": F(0, 1, lo_open=True), "eval.decoding": Spec("map", null=True),
    "eval.select_on": S(("final", "validation")), "eval.validation.n": I(1), "eval.validation.k": I(1),
}

#: what ``eval.decoding.<benchmark>`` may set for one benchmark (the rest of ``eval`` applies to all); the config
#: schema types each as the ``eval`` key of its name
DECODING_KEYS = ("n", "ks", "temperature", "top_p", "max_new_tokens")


def decoding_plan(eval_cfg) -> dict:
    """``{benchmark: its evaluation config}``: ``eval_cfg`` with ``eval_cfg.decoding[benchmark]`` (any of
    :data:`DECODING_KEYS`) merged in, for each of ``eval_cfg.benchmarks``. A protocol such as TR-GRPO's (greedy
    on MATH-500, Minerva, OlympiadBench; 16 samples on AMC and AIME) or ExPPO's (k = 16, 16, 8, 4) is one
    ``eval.decoding`` mapping.

    Raises:
        ValueError: a benchmark in ``eval.decoding`` that is not in ``eval.benchmarks``, or a key outside
            :data:`DECODING_KEYS`.
    """
    from omegaconf import OmegaConf

    per = eval_cfg.get("decoding") or {}
    benches = list(eval_cfg.benchmarks)
    extra = [b for b in per if b not in benches]
    if extra:
        raise ValueError(f"eval.decoding: {extra} not in eval.benchmarks={benches}")
    plan = {}
    for b in benches:
        own = OmegaConf.to_container(per[b], resolve=True) if b in per and per[b] is not None else {}
        bad = [k for k in own if k not in DECODING_KEYS]
        if bad:
            raise ValueError(f"eval.decoding.{b}: unknown key(s) {bad}; known: {list(DECODING_KEYS)}")
        plan[b] = OmegaConf.merge(eval_cfg, own) if own else eval_cfg
    return plan


def check_decoding(eval_cfg) -> list[str]:
    """The rules that relate the evaluation's decoding keys to each other, per benchmark (:func:`decoding_plan`):
    every k of ``ks`` in [1, n] (pass@k is undefined for k > n); extra temperatures that print alike (they would
    share a folder and metric keys). Types and ranges of single keys are their declarations' (the schema's).

    Returns:
        Warnings: greedy decoding (temperature 0) with n > 1 (n copies of one sequence).
    Raises:
        ValueError: naming the key and the bad value.
    """
    warnings = []
    for b, c in decoding_plan(eval_cfg).items():
        where = "eval" if c is eval_cfg else f"eval.decoding.{b}"
        n, ks = int(c.n), list(c.ks)
        bad = [k for k in ks if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n]
        if bad:
            n_key = "eval.n" if c is eval_cfg else "n"
            raise ValueError(f"{where}.ks={ks}: every k must be an integer in [1, {n_key}={n}] (pass@k is undefined "
                             f"for k > n); bad: {bad}")
        if float(c.temperature) == 0 and n > 1:
            warnings.append(f"{where}: greedy decoding (temperature 0) with n={n}: the n samples of a prompt are one "
                            "sequence, so pass@k equals pass@1 for every k; the papers' greedy protocols use n=1")
    temps = list(eval_cfg.get("extra_temperatures") or [])
    try:
        check_value("eval.extra_temperatures", temps, CONFIG["eval.extra_temperatures"])  # also for library callers
    except BadValue as e:
        raise ValueError(str(e)) from None
    temps = [float(t) for t in temps]
    if len({f"{t:g}" for t in temps}) != len(temps):
        raise ValueError(f"eval.extra_temperatures={temps}: two temperatures print alike (same folder and keys)")
    return list(dict.fromkeys(warnings))


def smallest_n(eval_cfg) -> int:
    """The smallest number of samples per prompt over the benchmarks (``eval.n`` or a benchmark's own)."""
    return min(int(c.n) for c in decoding_plan(eval_cfg).values())


def check_eval(eval_cfg, data_name: str | None = None) -> list[str]:
    """The one evaluation check, for the sweep's pre-flight and the evaluation command alike: every benchmark is a
    registered task and passes its own ``validate``; a held-out benchmark is the split of the training data
    (``data_name``; None: no training run); :func:`check_decoding`; the sampler can run here and can serve the
    benchmarks (:func:`evaluation_sampler`); every metric table's own ``validate`` (flip rates within n, ...).

    Returns:
        Warnings (legal but suspicious settings).
    Raises:
        ValueError: naming the key and the bad value (types and ranges of single keys are checked by the schema
            before this runs).
    """
    from core.tasks import task_names

    from .tables import TABLES

    benches = list(eval_cfg.benchmarks)
    for b in benches:
        try:
            task = get_task(b)
        except KeyError:
            raise ValueError(f"eval.benchmarks={benches}: unknown benchmark {b!r}; registered tasks: "
                             f"{task_names()}") from None
        if task.heldout_from_data:
            if data_name is not None and data_name != b:
                raise ValueError(f"eval.benchmarks={benches}: {b!r} is the held-out split of data={b}, but "
                                 f"data={data_name}")
        else:
            task.validate(eval_cfg, "eval")
    warnings = check_decoding(eval_cfg)
    evaluation_sampler(eval_cfg)
    n = smallest_n(eval_cfg)
    for table in TABLES.values():
        table.validate(eval_cfg, n)
    return warnings
