"""Evaluate a policy: sample n responses per prompt, verify, compute every table.

    rows (benchmarks.py) -> sampler (core.sampling: hf | vllm) -> samples.parquet (written after every
    batch, so an interrupted evaluation resumes without resampling finished prompts) -> verifier
    -> tables (pass@k, UCC@k, similarity, entropy, modes, flip rates against a base model's samples)

:func:`evaluate_checkpoint` is the whole path for one model folder (the sweep's trained runs, the base
model, ``python -m orchestrator.evaluate``): it starts the configured sampler once, evaluates at the main and every
extra temperature, and frees the engine. What one evaluation needs beside the sampler (settings, prompts, the base
model's samples, tools, the timings it adds to) travels as one :class:`EvalJob`, built once by the caller.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from core.progress import LineProgress
from core.sampling import Sample, SamplerOptions, SamplingSettings, build_sampler
from core.tasks import get_task, score_responses

from . import protocol
from .checks import (  # noqa: F401  (re-exported:
    CONFIG,
    DECODING_KEYS,
    check_decoding,
    check_eval,
    decoding_plan,
    smallest_n,  # the evaluation's keys and checks live in evaluation/checks.py)
)
from .protocol import evaluation_sampler  # noqa: F401  (re-exported: the sampler is part of the protocol)
from .tables import TABLES, budget_metrics, compute_tables, metric_key  # noqa: F401  (metric_key re-exported)

log = logging.getLogger("rlvr")

SAMPLE_COLUMNS = [
    "benchmark", "prompt_id", "sample_idx", "prompt", "gold", "response", "n_tokens", "finish_reason",
    "extracted_answer", "correct", "reference_correct", "mean_token_entropy", "seed", "subset", "tool_calls",
    "answer_status",
]


def check_rows(rows: list[dict], responses: list[str]) -> list[tuple[bool, str | None, bool | None, str | None]]:
    """(correct, extracted answer, reference verdict, answer status) for each response to the row beside it, by the
    row's registered task; the reference verdict is plain math-verify's for math tasks, None for the others; the
    status what the task's answer form found (:mod:`core.tasks.answer_forms`; None for tasks without one)."""
    return [(s.correct, s.extracted, s.reference, s.status) for s in score_responses(responses, rows)]


SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "n", "seed", "prompt_template", "dtype", "decoding")

def _set_aside_stale_samples(eval_cfg, out_dir: Path, sampler=None) -> None:
    """Resume only samples drawn with the same sampling settings (and the same sampler and batch size):
    when ``out_dir`` holds samples drawn with others (recorded in ``sampling.json``), rename them to
    ``samples.stale-<time>.parquet`` (kept, not deleted) so this evaluation samples afresh."""
    import json

    settings = {k: (eval_cfg.get(k) if not hasattr(eval_cfg.get(k), "_content") else str(eval_cfg.get(k)))
                for k in SAMPLING_KEYS}
    if sampler is not None:
        settings["sampler"] = sampler.name
        settings["batch_prompts"] = batch_size(eval_cfg, sampler)
    meta, samples = out_dir / "sampling.json", out_dir / "samples.parquet"
    if samples.exists():
        old = json.loads(meta.read_text()) if meta.exists() else None
        if old != settings:
            stale = out_dir / f"samples.stale-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
            samples.rename(stale)
            print(f"evaluation: {samples} was drawn with other sampling settings ({old}); kept as {stale.name}")
    meta.write_text(json.dumps(settings))


def benchmark_rows(eval_cfg, heldout_rows=None) -> dict[str, list[dict]]:
    """{benchmark: rows} for ``eval_cfg.benchmarks``, each a registered task. A task whose evaluation rows are
    the held-out split of the training data set of its name (``arithmetic``, ``kk``, ``math``) takes
    ``heldout_rows`` (for ``kk``, ``max_prompts`` applies per subset, i.e. per puzzle size); the others load their
    ``test`` split, rendered with ``eval.prompt_template`` when it is set, else with the task's own template.

    Raises:
        KeyError: an unregistered benchmark; ValueError: a held-out benchmark without ``heldout_rows``.
    """
    out = {}
    limit = eval_cfg.get("max_prompts")
    template = eval_cfg.get("prompt_template")
    for name in eval_cfg.benchmarks:
        task = get_task(name)
        if task.heldout_from_data:
            if heldout_rows is None:
                raise ValueError(f"benchmark {name!r} needs the held-out split of data={name}")
            rows, seen = [], {}
            for r in heldout_rows:
                key = r.get("subset")
                seen[key] = seen.get(key, 0) + 1
                if not limit or seen[key] <= limit:
                    rows.append(r)
        else:
            rows = task.load("test", eval_cfg)
            if template:
                rows = [dict(r, prompt=task.render(r["problem"], template)) for r in rows]
        out[name] = rows
    return out


def prompt_seed(seed: int, benchmark: str, prompt_id) -> int:
    """The sampling seed of one prompt: a hash of (evaluation seed, benchmark, prompt id), so a resumed or
    re-run evaluation draws the same samples (the ``hf`` sampler seeds a batch with its first prompt's)."""
    return zlib.crc32(f"{seed}:{benchmark}:{prompt_id}".encode()) % (2**31)


def batch_size(eval_cfg, sampler) -> int:
    """Prompts per sampler call: ``eval.batch_prompts``, or the sampler's own preference when null."""
    b = eval_cfg.get("batch_prompts")
    return int(b) if b else int(getattr(sampler, "preferred_batch_prompts", 4))


def settings_from(eval_cfg, chat_template: bool = True) -> SamplingSettings:
    """The :class:`core.sampling.SamplingSettings` of an ``eval`` config."""
    return SamplingSettings(float(eval_cfg.temperature), float(eval_cfg.top_p), int(eval_cfg.max_new_tokens), bool(chat_template))


def sampler_options(eval_cfg, sampler: str = "vllm", score_budget: int | None = None) -> SamplerOptions:
    """The :class:`core.sampling.SamplerOptions` of an ``eval`` config (``device``, ``dtype``, ``entropy``,
    ``score_rows``, ``score_tokens``) for the sampler named ``sampler``, whose own options are the subtree
    ``eval.<sampler>`` (``eval.vllm.*``: the vLLM engine's arguments, ``extra`` merged in; keys declared by the
    sampler's ``CONFIG``). ``score_budget``: positions per teacher-forced entropy pass (the run's
    ``train.micro_batch_tokens`` when it is a number)."""
    from omegaconf import OmegaConf

    engine = eval_cfg.get(sampler) or {}
    if not isinstance(engine, dict):
        engine = OmegaConf.to_container(engine, resolve=True)
    extra = engine.pop("extra", None) or {}
    return SamplerOptions(device=str(eval_cfg.get("device", "auto")), dtype=str(eval_cfg.get("dtype", "auto")),
                          entropy=bool(eval_cfg.get("entropy", True)), score_rows=int(eval_cfg.get("score_rows", 16)),
                          score_tokens=int(eval_cfg.get("score_tokens", 512)), score_budget=score_budget,
                          engine={**{k: v for k, v in engine.items() if v is not None}, **dict(extra)})


@dataclass(frozen=True)
class Draw:
    """How one group of benchmarks is sampled: ``n`` responses per prompt, the evaluation ``seed`` (each prompt's own
    seed derives from it, :func:`prompt_seed`), ``batch_prompts`` prompts per sampler call, the decoding
    ``settings``."""

    n: int
    seed: int
    batch_prompts: int = 4
    settings: SamplingSettings = field(default_factory=SamplingSettings)


@dataclass
class EvalJob:
    """One evaluation's inputs beside the sampler, built once by its caller and passed down whole
    (:func:`evaluate_checkpoint` -> :func:`evaluate_temperatures` -> :func:`evaluate` -> :func:`sample_benchmarks`).

    Attributes:
        eval_cfg: ``n``, ``ks``, ``temperature``, ``top_p``, ``max_new_tokens``, ``seed``, ``benchmarks``,
            optional ``data_dir``, ``max_prompts``, ``prompt_template``, ``batch_prompts``, and the knobs of the
            registered metric tables (``ucc_ks``, ``ucc_threshold``, ``similarity_metric``, ``flip_k``, a plug-in's).
        heldout_rows: rows of the held-out training split (for the ``arithmetic`` and ``kk`` benchmarks).
        chat_template: prompts go through the tokenizer's chat template.
        base_samples: the base model's samples on the same prompts, for flip rates (main temperature only).
        tools_cfg: the run's ``tools`` config, for benchmarks whose task calls tools (:func:`sample_benchmarks`).
        rows: {benchmark: rows} to evaluate instead of :func:`benchmark_rows` (a run's validation split: the
            benchmark is the training task, its rows the prompts held out of training; the main temperature only).
        timings: wall seconds by phase (``sampling_s``, ``verify_s``, ``metrics_s``, ...), added to by every step.
    """

    eval_cfg: object
    heldout_rows: list | None = None
    chat_template: bool = True
    base_samples: pd.DataFrame | None = None
    tools_cfg: object = None
    rows: dict | None = None
    timings: collections.Counter = field(default_factory=collections.Counter)

    def __post_init__(self):
        check_decoding(self.eval_cfg)  # before any sampling: ks within n, temperatures that print apart

    def at_temperature(self, t: float) -> EvalJob:
        """The same job at sampling temperature ``t`` (no base samples: flip rates are the main temperature's)."""
        from omegaconf import OmegaConf

        return dataclasses.replace(self, eval_cfg=OmegaConf.merge(self.eval_cfg, {"temperature": float(t)}),
                                   base_samples=None)


def sample_benchmarks(sampler, rows_by_bench: dict, draw: Draw, samples_path: Path, tools_cfg=None,
                      timings: collections.Counter | None = None) -> pd.DataFrame:
    """Sample ``draw.n`` responses per prompt for every benchmark (:class:`Draw`), appending to ``samples_path``.

    Prompts already present in ``samples_path`` with n rows are skipped (resume); rows of benchmarks not in
    ``rows_by_bench`` are kept in the file as they are (another decoding group's) and not returned. Each prompt's seed is
    :func:`prompt_seed`, so a resumed run draws the same samples. Progress: a tqdm bar on a terminal and
    one log line per chunk of prompts otherwise (SLURM output files, ``> log``). Benchmarks whose task declares
    tools (question answering with search) are sampled as multi-turn episodes with those tools, opened from
    ``tools_cfg`` for this call (:func:`core.tools.open_tools_for`; the ``hf`` sampler only). ``timings``, when
    given, accumulates the wall seconds of sampling (``sampling_s``) and verification (``verify_s``).

    Raises:
        ValueError: tool benchmarks with a sampler that cannot call tools.
        core.tools.ToolUnavailable: a tool's service is gone.
    """
    from core.tools import close_tools, open_tools_for, tool_names
    n, seed, settings = draw.n, draw.seed, draw.settings
    timings = collections.Counter() if timings is None else timings
    samples_path = Path(samples_path)
    others, done, finished = _resume(samples_path, rows_by_bench, n)
    todo = [(b, r) for b, rows in rows_by_bench.items() for r in rows if (b, r["id"]) not in finished]
    frames = [done] if len(done) else []
    with_tools = {b: bool(tool_names(rows[:1])) for b, rows in rows_by_bench.items()}
    if any(with_tools[b] for b, _ in todo) and not getattr(sampler, "supports_tools", False):
        from core.sampling import tool_samplers

        raise ValueError(f"benchmarks {sorted(b for b, t in with_tools.items() if t)} call tools, which only the "
                         f"samplers {tool_samplers()} run: set eval.sampler=hf (got {getattr(sampler, 'name', sampler)!r})")
    tools = open_tools_for([r for b, r in todo if with_tools[b]], tools_cfg)
    tc = tools_cfg if tools_cfg is not None else {}
    chunks = _chunks(todo, draw.batch_prompts, with_tools)
    lines = LineProgress(f"eval sampling ({getattr(sampler, 'name', 'sampler')})", len(todo), unit="prompt")
    try:
        with tqdm(total=len(todo), desc=f"eval sampling ({getattr(sampler, 'name', 'sampler')})", unit="prompt",
                  disable=None) as bar:
            done_prompts, right, drawn = 0, 0, 0
            for chunk in chunks:
                seeds = [prompt_seed(seed, b, r["id"]) for b, r in chunk]
                t0 = time.perf_counter()
                extra = dict(tools=tools, max_turns=int(tc.get("max_turns", 4)),
                             max_obs_tokens=int(tc.get("max_obs_tokens", 256)),
                             prefixes=[r.get("response_prefix", "") for _, r in chunk]) if with_tools[chunk[0][0]] else {}
                outs = sampler.sample([r["prompt"] for _, r in chunk], n, seeds, settings, **extra)
                timings["sampling_s"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                records = _sample_records(chunk, outs, seeds)
                timings["verify_s"] += time.perf_counter() - t0
                frames.append(pd.DataFrame.from_records(records, columns=SAMPLE_COLUMNS))
                pd.concat(([others] if len(others) else []) + frames, ignore_index=True).to_parquet(samples_path, index=False)
                bar.update(len(chunk))
                done_prompts += len(chunk)
                right += sum(r["correct"] for r in records)
                drawn += len(records)
                lines.update(done_prompts, correct=right / max(drawn, 1))  # so far, not the last chunk's
    finally:
        lines.close()
        close_tools(tools)
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    table["mean_token_entropy"] = table["mean_token_entropy"].astype("float64")
    return table


def _resume(samples_path: Path, rows_by_bench: dict, n: int) -> tuple[pd.DataFrame, pd.DataFrame, set]:
    """(the rows of ``samples_path`` of benchmarks not in ``rows_by_bench``, kept as they are; the rows of the prompts
    already sampled ``n`` times, graded again when drawn before answer forms; those prompts' (benchmark, prompt id))."""
    done = pd.read_parquet(samples_path) if samples_path.exists() else pd.DataFrame(columns=SAMPLE_COLUMNS)
    mine = done["benchmark"].isin(list(rows_by_bench))
    others, done = done[~mine], done[mine]
    finished = set()
    if len(done):
        counts = done.groupby(["benchmark", "prompt_id"]).size()
        finished = {key for key, c in counts.items() if c >= n}
        done = done[[(b, p) in finished for b, p in zip(done["benchmark"], done["prompt_id"])]]
    if len(done) and "answer_status" not in done:  # drawn before answer forms (issue 55): graded again, not resampled
        done = regrade(done, rows_by_bench)
    return others, done, finished


def _chunks(todo: list, batch_prompts: int, with_tools: dict) -> list[list]:
    """``todo``'s (benchmark, row) items in chunks of ``batch_prompts`` prompts, never mixing benchmarks with and
    without tools (``with_tools``: {benchmark: whether its task calls tools})."""
    chunks, cur = [], []
    for item in todo:
        if cur and (len(cur) >= batch_prompts or with_tools[cur[0][0]] != with_tools[item[0]]):
            chunks.append(cur)
            cur = []
        cur.append(item)
    if cur:
        chunks.append(cur)
    return chunks


def _sample_records(chunk: list, outs: list, seeds: list) -> list[dict]:
    """One :data:`SAMPLE_COLUMNS` record per sample the sampler drew (``outs``) for ``chunk``'s (benchmark, row)
    prompts, verified by the row's task (:func:`check_rows`); ``seeds``: the prompts' seeds."""
    records = []
    for (bench, row), drawn in zip(chunk, outs):
        samples = [Sample.of(s) for s in drawn]  # a plug-in sampler may still return dicts
        checks = check_rows([row] * len(samples), [s.response for s in samples])
        for j, (s, (correct, extracted, reference, status)) in enumerate(zip(samples, checks)):
            records.append({
                "benchmark": bench, "prompt_id": row["id"], "sample_idx": j, "prompt": row["prompt"],
                "gold": row["gold"], "response": s.response, "n_tokens": s.n_tokens,
                "finish_reason": s.finish_reason, "extracted_answer": extracted, "correct": bool(correct),
                "reference_correct": None if reference is None else bool(reference),
                "mean_token_entropy": s.mean_token_entropy,
                "seed": int(s.seed if s.seed is not None else seeds[0]),
                "subset": row.get("subset"), "tool_calls": s.tool_calls, "answer_status": status,
            })
    return records


def regrade(samples: pd.DataFrame, rows_by_bench: dict) -> pd.DataFrame:
    """``samples`` with ``correct``, ``extracted_answer``, ``reference_correct`` and ``answer_status`` recomputed by
    today's checkers (:func:`check_rows`) from each sample's response and its prompt's row in ``rows_by_bench``
    (``{benchmark: rows}``); samples of a prompt not in ``rows_by_bench`` keep their verdicts."""
    out = samples.copy()
    if "answer_status" not in out:
        out["answer_status"] = None
    out["answer_status"] = out["answer_status"].astype(object)
    index = {(b, str(r["id"])): r for b, rows in rows_by_bench.items() for r in rows}
    keys = [(b, str(p)) for b, p in zip(out["benchmark"], out["prompt_id"])]
    have = [i for i, k in enumerate(keys) if k in index]
    if have:
        checks = check_rows([index[keys[i]] for i in have], [out["response"].iloc[i] for i in have])
        for col, j in (("correct", 0), ("extracted_answer", 1), ("reference_correct", 2), ("answer_status", 3)):
            out[col] = out[col].astype(object)
            out.iloc[have, out.columns.get_loc(col)] = [c[j] for c in checks]
        out["correct"] = out["correct"].astype(bool)
    return out


def evaluate(sampler, job: EvalJob, out_dir) -> tuple[dict, dict]:
    """Evaluate with ``sampler``: sample, verify, and write ``samples.parquet`` plus one CSV per table.

    Args:
        sampler: a :class:`core.sampling.Sampler` (see :func:`evaluate_checkpoint` to build one from a folder).
        job: the settings, prompts, base samples and tools (:class:`EvalJob`); its ``timings`` gain this
            evaluation's phases.
        out_dir: where the files go (an existing samples.parquet there is resumed).
    Returns:
        (metrics, files): metrics keyed ``eval/<benchmark>/<metric>`` and ``eval/mean/<metric>``
        (``pass_at_<k>``, ``avg_at_<n>``, ``ucc_at_<k>``, ``ucr``, ``rouge_l_mean``..., ``entropy``,
        ``effective_yield``..., ``flip/<bucket>/<measure>``, ``verifier_disagreement``...); files {name: path}.
    Raises:
        ValueError: a k in ``eval_cfg.ks`` larger than ``eval_cfg.n`` (:func:`check_decoding`: when ``job`` was
            built, before any sampling).
    """
    eval_cfg, timings = job.eval_cfg, job.timings
    plan = decoding_plan(eval_cfg)  # the job checked its decoding keys when it was built (EvalJob)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _set_aside_stale_samples(eval_cfg, out_dir, sampler)
    rows = benchmark_rows(eval_cfg, job.heldout_rows) if job.rows is None else job.rows
    groups: dict = {}  # benchmarks sampled with the same settings go through the sampler together
    for b, c in plan.items():
        key = (int(c.n), float(c.temperature), float(c.top_p), int(c.max_new_tokens))
        groups.setdefault(key, (c, []))[1].append(b)
    parts = [sample_benchmarks(sampler, {b: rows[b] for b in benches},
                               Draw(int(c.n), int(eval_cfg.seed), batch_size(eval_cfg, sampler),
                                    settings_from(c, job.chat_template)),
                               out_dir / "samples.parquet", job.tools_cfg, timings)
             for c, benches in groups.values()]
    samples = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) else parts[0]
    t0 = time.perf_counter()
    per_bench = eval_cfg.get("decoding") or {}
    ks_of = {b: [int(k) for k in c.ks] for b, c in plan.items()}
    tables, metrics = compute_tables(
        samples, ks_of if per_bench else ks_of[next(iter(plan))], base_samples=job.base_samples,
        kinds={b: get_task(b).kind for b in rows}, same_answer={b: get_task(b).same_answer for b in rows},
        eval_cfg=eval_cfg,  # every registered table's knobs (eval.ucc_ks, eval.flip_k, a plug-in's keys...)
    )
    if per_bench:  # each benchmark at its own budget (its largest k), and the suite's unweighted means
        metrics.update(budget_metrics(tables, {b: max(k) for b, k in ks_of.items()}))
    timings["metrics_s"] += time.perf_counter() - t0
    if "entropy" in tables and len(tables["entropy"]) and getattr(sampler, "entropy_method", None):
        tables["entropy"] = tables["entropy"].assign(method=sampler.entropy_method)
    files = {"samples.parquet": out_dir / "samples.parquet"}
    listings = {n for e in TABLES.values() for n in e.listings}  # written even when empty: none is a result
    for name, table in tables.items():
        if len(table) or name in listings:
            table.to_csv(out_dir / f"{name}.csv")
            files[f"{name}.csv"] = out_dir / f"{name}.csv"
    return metrics, files




def temperature_key(t: float) -> str:
    """Metric prefix of an extra evaluation temperature: 1.5 -> ``eval_T1.5`` (``eval/`` is the main one)."""
    return f"eval_T{float(t):g}"


def evaluate_temperatures(sampler, job: EvalJob, out_dir) -> tuple[dict, dict]:
    """:func:`evaluate` at ``job.eval_cfg.temperature`` and again at every ``extra_temperatures``
    (the QUATRO paper's diversity check: UCR and pass@k at temperatures such as 1.0 and 1.5).

    The main evaluation keeps its keys (``eval/<bench>/<metric>``, files in ``out_dir``); temperature t adds
    ``eval_T<t>/<bench>/<metric>`` with its files in ``out_dir/T<t>`` (each resumable on its own).

    Args:
        sampler: one :class:`core.sampling.Sampler`, used at every temperature (its engine starts once).
        job: :class:`EvalJob` (its base samples give flip rates at the main temperature only; its timings add up
            every temperature's phases).
    Returns:
        (metrics, files) with files keyed by their path relative to ``out_dir``.
    Raises:
        ValueError: bad decoding settings (:func:`check_decoding`, before any sampling: the main evaluation checks
            the extra temperatures too).
    """
    eval_cfg = job.eval_cfg
    temps = [float(t) for t in (eval_cfg.get("extra_temperatures") or [])]
    out_dir = Path(out_dir)
    metrics, files = evaluate(sampler, job, out_dir)
    for t in temps:
        if t == float(eval_cfg.temperature):
            continue
        sub = out_dir / f"T{t:g}"
        m_t, f_t = evaluate(sampler, job.at_temperature(t), sub)
        metrics.update({temperature_key(t) + k[len("eval"):]: v for k, v in m_t.items() if k.startswith("eval/")})
        files.update({f"T{t:g}/{name}": path for name, path in f_t.items()})
    return metrics, files


def _say_done(model_path, metrics: dict, seconds: float) -> None:
    """One console line when an evaluation ends: the model and each benchmark's pass@1 (the numbers the run logs)."""
    import logging

    rates = {k.split("/")[1]: v for k, v in metrics.items()
             if k.startswith("eval/") and k.endswith("/pass_at_1") and k.count("/") == 2 and not k.startswith("eval/mean/")}
    said = ", ".join(f"{b} pass@1 {v:.4f}" for b, v in rates.items())
    logging.getLogger("rlvr").info("evaluation of %s done in %.0f s: %s", Path(str(model_path)).name or model_path,
                                   seconds, said or "no benchmark")


def evaluate_checkpoint(model_path, job: EvalJob, out_dir, sampler: str | None = None, temperatures: bool = True,
                        score_budget: int | None = None) -> tuple[dict, dict, dict]:
    """Evaluate the model at ``model_path`` (a Hugging Face folder or hub id, or a LoRA adapter folder: evaluated as
    its base with the adapter merged, :func:`core.lora.evaluable`) with the configured sampler.

    The sampler (``sampler`` or ``job.eval_cfg.sampler``: ``auto`` | ``hf`` | ``vllm``) starts once, samples at
    the main temperature and (with ``temperatures``, and no ``job.rows``) every ``extra_temperatures``, then frees
    its engine (GPU memory, vLLM's worker processes) before returning, also on an error. ``job``: what is evaluated
    (:class:`EvalJob`). ``score_budget``: positions per teacher-forced entropy pass (:func:`sampler_options`).

    Returns:
        (metrics, files, info): as :func:`evaluate_temperatures` (files with ``protocol.json``); info = {"sampler":
        resolved name, "protocol": the evaluation protocol (:mod:`evaluation.protocol`),
        "entropy_method": how ``mean_token_entropy`` was computed or None, "eval_time_s": wall seconds,
        "phases": wall seconds by phase (``engine_start_s``, ``sampling_s`` with ``entropy_s`` inside it,
        ``verify_s``, ``metrics_s``)}.
    Raises:
        ValueError: the sampler cannot run here, or bad evaluation settings.
    """
    from core.lora import evaluable

    t0 = time.time()
    eval_cfg, timings = job.eval_cfg, job.timings

    model_path = evaluable(model_path)  # a LoRA adapter folder: its base with the adapter merged
    name = evaluation_sampler(eval_cfg, sampler)
    proto = {**protocol.settings(eval_cfg, job.chat_template), "sampler": name, "dtype": protocol.sampler_dtype(eval_cfg, name)}
    protocol.write(proto, out_dir)
    smp = build_sampler(name, model_path, sampler_options(eval_cfg, name, score_budget))
    timings["engine_start_s"] += time.time() - t0
    try:
        if temperatures and job.rows is None:
            metrics, files = evaluate_temperatures(smp, job, out_dir)
        else:
            metrics, files = evaluate(smp, job, out_dir)
    finally:
        smp.close()
    files = {**files, "protocol.json": Path(out_dir) / "protocol.json"}
    _say_done(model_path, metrics, time.time() - t0)
    return metrics, files, {"sampler": name, "protocol": proto, "entropy_method": getattr(smp, "entropy_method", None),
                            "eval_time_s": time.time() - t0,
                            "phases": dict(timings + getattr(smp, "timings", collections.Counter()))}
