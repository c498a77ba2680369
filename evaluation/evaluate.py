"""Evaluate a policy: sample n responses per prompt, verify, compute pass@k, write tables.

    rows (benchmarks.py) -> sampler -> samples.parquet (written after every batch, so an
    interrupted evaluation resumes without resampling finished prompts) -> verifier -> pass@k table
"""
from __future__ import annotations

import zlib
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .benchmarks import load_benchmark
from .sampling import HFSampler
from .tables import compute_tables, metric_key  # noqa: F401  (metric_key re-exported)
from .verify import default_verifier

SAMPLE_COLUMNS = [
    "benchmark", "prompt_id", "sample_idx", "prompt", "gold", "response", "n_tokens", "finish_reason",
    "extracted_answer", "correct", "mean_token_entropy", "seed", "subset",
]
HELDOUT_BENCHMARKS = ("arithmetic", "kk")  # the held-out split of the training data set of the same name


def check_rows(rows: list[dict], responses: list[str]) -> list[tuple[bool, str | None]]:
    """(correct, extracted answer) for each response to the row beside it, by the row's ``checker``:
    ``math`` (default; math-verify) or ``kk`` (the full Knights-and-Knaves assignment must be right)."""
    out: list = [None] * len(rows)
    math_idx = [i for i, r in enumerate(rows) if r.get("checker", "math") == "math"]
    if math_idx:
        checks = default_verifier().check_many([responses[i] for i in math_idx], [rows[i]["gold"] for i in math_idx])
        for i, c in zip(math_idx, checks):
            out[i] = (bool(c[0]), c[1])
    for i, r in enumerate(rows):
        if r.get("checker", "math") == "kk":
            from training.data.knights_knaves import kk_reward

            res = kk_reward(responses[i], r["gold"])
            out[i] = (bool(res["correct"]), res["extracted"])
        elif out[i] is None:
            raise ValueError(f"row {r.get('id')!r}: unknown checker {r.get('checker')!r}")
    return out


SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "n", "seed", "prompt_template")


def _set_aside_stale_samples(eval_cfg, out_dir: Path) -> None:
    """Resume only samples drawn with the same sampling settings: when ``out_dir`` holds samples drawn
    with others (recorded in ``sampling.json``), rename them to ``samples.<time>.parquet`` (kept, not
    deleted) so this evaluation samples afresh."""
    import json
    import time

    settings = {k: (eval_cfg.get(k) if not hasattr(eval_cfg.get(k), "_content") else str(eval_cfg.get(k)))
                for k in SAMPLING_KEYS}
    meta, samples = out_dir / "sampling.json", out_dir / "samples.parquet"
    if samples.exists():
        old = json.loads(meta.read_text()) if meta.exists() else None
        if old != settings:
            stale = out_dir / f"samples.stale-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
            samples.rename(stale)
            print(f"evaluation: {samples} was drawn with other sampling settings ({old}); kept as {stale.name}")
    meta.write_text(json.dumps(settings))


def benchmark_rows(eval_cfg, heldout_rows=None) -> dict[str, list[dict]]:
    """{benchmark: rows} for ``eval_cfg.benchmarks``; ``arithmetic`` and ``kk`` use the held-out split of the
    training data set of that name (for ``kk``, ``max_prompts`` applies per subset, i.e. per puzzle size)."""
    out = {}
    limit = eval_cfg.get("max_prompts")
    for name in eval_cfg.benchmarks:
        if name in HELDOUT_BENCHMARKS:
            if heldout_rows is None:
                raise ValueError(f"benchmark {name!r} needs the held-out split of data={name}")
            rows, seen = [], {}
            for r in heldout_rows:
                key = r.get("subset")
                seen[key] = seen.get(key, 0) + 1
                if not limit or seen[key] <= limit:
                    rows.append(r)
        else:
            rows = load_benchmark(name, eval_cfg.get("data_dir"), limit=limit)
            tmpl = eval_cfg.get("prompt_template") or "{problem}"
            rows = [dict(r, prompt=tmpl.format(problem=r["prompt"])) for r in rows]
        out[name] = rows
    return out


def sample_benchmarks(sampler, rows_by_bench: dict, n: int, seed: int, samples_path: Path, batch_prompts: int = 4) -> pd.DataFrame:
    """Sample ``n`` responses per prompt for every benchmark, appending to ``samples_path``.

    Prompts already present in ``samples_path`` with n rows are skipped (resume). The seed of a
    batch is derived from (seed, benchmark, first prompt id), so a resumed run draws the same samples.
    """
    samples_path = Path(samples_path)
    done = pd.read_parquet(samples_path) if samples_path.exists() else pd.DataFrame(columns=SAMPLE_COLUMNS)
    finished = set()
    if len(done):
        counts = done.groupby(["benchmark", "prompt_id"]).size()
        finished = {key for key, c in counts.items() if c >= n}
        done = done[[(b, p) in finished for b, p in zip(done["benchmark"], done["prompt_id"])]]
    todo = [(b, r) for b, rows in rows_by_bench.items() for r in rows if (b, r["id"]) not in finished]
    frames = [done] if len(done) else []
    with tqdm(total=len(todo), desc="eval sampling", unit="prompt", disable=None) as bar:
        for start in range(0, len(todo), batch_prompts):
            chunk = todo[start:start + batch_prompts]
            batch_seed = zlib.crc32(f"{seed}:{chunk[0][0]}:{chunk[0][1]['id']}".encode()) % (2**31)
            outs = sampler.sample([r["prompt"] for _, r in chunk], n=n, seed=batch_seed)
            records = []
            for (bench, row), samples in zip(chunk, outs):
                checks = check_rows([row] * len(samples), [s["response"] for s in samples])
                for j, (s, (correct, extracted)) in enumerate(zip(samples, checks)):
                    records.append({
                        "benchmark": bench, "prompt_id": row["id"], "sample_idx": j, "prompt": row["prompt"],
                        "gold": row["gold"], "response": s["response"], "n_tokens": s["n_tokens"],
                        "finish_reason": s["finish_reason"], "extracted_answer": extracted, "correct": bool(correct),
                        "mean_token_entropy": s.get("mean_token_entropy"), "seed": batch_seed,
                        "subset": row.get("subset"),
                    })
            frames.append(pd.DataFrame.from_records(records, columns=SAMPLE_COLUMNS))
            pd.concat(frames, ignore_index=True).to_parquet(samples_path, index=False)
            bar.update(len(chunk))
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    table["mean_token_entropy"] = table["mean_token_entropy"].astype("float64")
    return table


def evaluate(model, tokenizer, eval_cfg, out_dir, heldout_rows=None, chat_template: bool = True,
             base_samples: pd.DataFrame | None = None, sampler=None) -> tuple[dict, dict]:
    """Evaluate ``model``: sample, verify, and write ``samples.parquet`` plus one CSV per table.

    Args:
        model, tokenizer: a causal LM and its tokenizer (e.g. from a training checkpoint); ignored
            when ``sampler`` is given.
        eval_cfg: ``n``, ``ks``, ``temperature``, ``top_p``, ``max_new_tokens``, ``seed``, ``benchmarks``,
            optional ``data_dir``, ``max_prompts``, ``prompt_template``, ``batch_prompts``, ``ucc_ks``,
            ``ucc_threshold``, ``similarity_metric``, ``entropy`` (score each sample's token entropy).
        out_dir: where the files go (an existing samples.parquet there is resumed).
        heldout_rows: rows of the held-out training split (for the ``arithmetic`` benchmark).
        base_samples: the base model's samples on the same prompts, for flip rates.
        sampler: a :class:`evaluation.sampling.Sampler` (default: transformers on ``model``).
    Returns:
        (metrics, files): metrics keyed ``eval/<benchmark>/<metric>`` and ``eval/mean/<metric>``
        (``pass_at_<k>``, ``avg_at_<n>``, ``ucc_at_<k>``, ``ucr``, ``rouge_l_mean``..., ``entropy``,
        ``effective_yield``...); files {name: path}.
    Raises:
        ValueError: a k in ``eval_cfg.ks`` larger than ``eval_cfg.n`` (checked before sampling).
    """
    n, ks = int(eval_cfg.n), [int(k) for k in eval_cfg.ks]
    bad = [k for k in ks if k > n or k < 1]
    if bad:
        raise ValueError(f"eval.ks={ks}: every k must be in [1, eval.n={n}]; bad: {bad}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _set_aside_stale_samples(eval_cfg, out_dir)
    rows = benchmark_rows(eval_cfg, heldout_rows)
    if sampler is None:
        sampler = HFSampler(model, tokenizer, float(eval_cfg.temperature), float(eval_cfg.top_p),
                            int(eval_cfg.max_new_tokens), chat_template, with_entropy=bool(eval_cfg.get("entropy", True)))
    samples = sample_benchmarks(sampler, rows, n, int(eval_cfg.seed), out_dir / "samples.parquet", int(eval_cfg.get("batch_prompts", 4)))
    tables, metrics = compute_tables(
        samples, ks, ucc_ks=eval_cfg.get("ucc_ks"), similarity_metric=eval_cfg.get("similarity_metric", "rouge_l"),
        ucc_threshold=float(eval_cfg.get("ucc_threshold", 0.7)), base_samples=base_samples,
    )
    files = {"samples.parquet": out_dir / "samples.parquet"}
    for name, table in tables.items():
        if len(table):
            table.to_csv(out_dir / f"{name}.csv")
            files[f"{name}.csv"] = out_dir / f"{name}.csv"
    return metrics, files


MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 10.0  # keys stay plain decimals (MLflow rejects '+' in 1e+06)


def temperature_key(t: float) -> str:
    """Metric prefix of an extra evaluation temperature: 1.5 -> ``eval_T1.5`` (``eval/`` is the main one)."""
    return f"eval_T{float(t):g}"


def evaluate_temperatures(model, tokenizer, eval_cfg, out_dir, heldout_rows=None, chat_template: bool = True,
                          sampler_factory=None, base_samples: pd.DataFrame | None = None) -> tuple[dict, dict]:
    """:func:`evaluate` at ``eval_cfg.temperature`` and again at every ``eval_cfg.extra_temperatures``
    (the QUATRO paper's diversity check: UCR and pass@k at temperatures such as 1.0 and 1.5).

    The main evaluation keeps its keys (``eval/<bench>/<metric>``, files in ``out_dir``); temperature t adds
    ``eval_T<t>/<bench>/<metric>`` with its files in ``out_dir/T<t>`` (each resumable on its own).

    Args:
        sampler_factory: optional ``fn(eval_cfg) -> Sampler`` (default: transformers on ``model``).
        base_samples: the base model's samples, for flip rates (main temperature only).
    Returns:
        (metrics, files) with files keyed by their path relative to ``out_dir``.
    Raises:
        ValueError: an extra temperature <= 0 (checked before any sampling).
    """
    from omegaconf import OmegaConf

    temps = [float(t) for t in (eval_cfg.get("extra_temperatures") or [])]
    bad = [t for t in temps if not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE]
    if bad:
        raise ValueError(f"eval.extra_temperatures={temps}: every temperature must be in "
                         f"[{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]; bad: {bad}")
    if len({f"{t:g}" for t in temps}) != len(temps):
        raise ValueError(f"eval.extra_temperatures={temps}: two temperatures print alike (same folder and keys)")
    out_dir = Path(out_dir)
    sampler = sampler_factory(eval_cfg) if sampler_factory else None
    metrics, files = evaluate(model, tokenizer, eval_cfg, out_dir, heldout_rows, chat_template,
                              base_samples=base_samples, sampler=sampler)
    for t in temps:
        if t == float(eval_cfg.temperature):
            continue
        cfg_t = OmegaConf.merge(eval_cfg, {"temperature": t})
        sub = out_dir / f"T{t:g}"
        sampler = sampler_factory(cfg_t) if sampler_factory else None
        m_t, f_t = evaluate(model, tokenizer, cfg_t, sub, heldout_rows, chat_template, sampler=sampler)
        metrics.update({temperature_key(t) + k[len("eval"):]: v for k, v in m_t.items() if k.startswith("eval/")})
        files.update({f"T{t:g}/{name}": path for name, path in f_t.items()})
    return metrics, files
