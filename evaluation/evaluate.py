"""Evaluate a policy: sample n responses per prompt, verify, compute pass@k, write tables.

    rows (benchmarks.py) -> sampler -> samples.parquet (written after every batch, so an
    interrupted evaluation resumes without resampling finished prompts) -> verifier -> pass@k table
"""
from __future__ import annotations

import zlib
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .benchmarks import load_local_benchmark
from .metrics.passk import passk_table
from .sampling import HFSampler
from .verify import check_answer

SAMPLE_COLUMNS = [
    "benchmark", "prompt_id", "sample_idx", "prompt", "gold", "response", "n_tokens", "finish_reason",
    "extracted_answer", "correct", "mean_token_entropy", "seed",
]


def metric_key(name: str) -> str:
    """MLflow-safe metric name: ``pass@8`` -> ``pass_at_8`` (MLflow rejects '@')."""
    return name.replace("@", "_at_")


def benchmark_rows(eval_cfg, heldout_rows=None) -> dict[str, list[dict]]:
    """{benchmark: rows} for ``eval_cfg.benchmarks``; ``arithmetic`` uses the held-out training split."""
    out = {}
    limit = eval_cfg.get("max_prompts")
    for name in eval_cfg.benchmarks:
        if name == "arithmetic":
            if heldout_rows is None:
                raise ValueError("benchmark 'arithmetic' needs the held-out split of data=arithmetic")
            rows = list(heldout_rows)[: limit or None]
        else:
            if not eval_cfg.get("data_dir"):
                raise ValueError(f"benchmark {name!r} needs eval.data_dir (a folder of <name>/test.jsonl files)")
            rows = load_local_benchmark(name, eval_cfg.data_dir, limit=limit)
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
                for j, s in enumerate(samples):
                    correct, extracted = check_answer(s["response"], row["gold"])
                    records.append({
                        "benchmark": bench, "prompt_id": row["id"], "sample_idx": j, "prompt": row["prompt"],
                        "gold": row["gold"], "response": s["response"], "n_tokens": s["n_tokens"],
                        "finish_reason": s["finish_reason"], "extracted_answer": extracted, "correct": bool(correct),
                        "mean_token_entropy": s.get("mean_token_entropy"), "seed": batch_seed,
                    })
            frames.append(pd.DataFrame.from_records(records, columns=SAMPLE_COLUMNS))
            pd.concat(frames, ignore_index=True).to_parquet(samples_path, index=False)
            bar.update(len(chunk))
    if not frames:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    table = pd.concat(frames, ignore_index=True)
    table["mean_token_entropy"] = table["mean_token_entropy"].astype("float64")
    return table


def evaluate(model, tokenizer, eval_cfg, out_dir, heldout_rows=None, chat_template: bool = True) -> tuple[dict, dict]:
    """Evaluate ``model`` on ``eval_cfg.benchmarks`` and write ``samples.parquet`` and ``passk.csv``.

    Args:
        model, tokenizer: a causal LM and its tokenizer (e.g. from a training checkpoint).
        eval_cfg: ``n``, ``ks``, ``temperature``, ``top_p``, ``max_new_tokens``, ``seed``, ``benchmarks``,
            optional ``data_dir``, ``max_prompts``, ``prompt_template``, ``batch_prompts``.
        out_dir: where the files go.
        heldout_rows: rows of the held-out training split (for the ``arithmetic`` benchmark).
    Returns:
        (metrics, files): metrics keyed ``eval/<benchmark>/pass_at_<k>``, ``eval/<benchmark>/avg_at_<n>``
        and ``eval/mean/...``; files {name: path}.
    Raises:
        ValueError: a k in ``eval_cfg.ks`` larger than ``eval_cfg.n`` (checked before sampling).
    """
    n, ks = int(eval_cfg.n), [int(k) for k in eval_cfg.ks]
    bad = [k for k in ks if k > n or k < 1]
    if bad:
        raise ValueError(f"eval.ks={ks}: every k must be in [1, eval.n={n}]; bad: {bad}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = benchmark_rows(eval_cfg, heldout_rows)
    sampler = HFSampler(model, tokenizer, float(eval_cfg.temperature), float(eval_cfg.top_p), int(eval_cfg.max_new_tokens), chat_template)
    samples = sample_benchmarks(sampler, rows, n, int(eval_cfg.seed), out_dir / "samples.parquet", int(eval_cfg.get("batch_prompts", 4)))
    table = passk_table(samples, ks).rename(columns={"avg@n": f"avg@{n}"})
    table.index.name = "benchmark"
    table.to_csv(out_dir / "passk.csv")
    metrics = {f"eval/{bench}/{metric_key(col)}": float(v) for bench, row in table.iterrows() for col, v in row.items()}
    return metrics, {"samples.parquet": out_dir / "samples.parquet", "passk.csv": out_dir / "passk.csv"}
