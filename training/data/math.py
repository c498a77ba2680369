"""The MATH training set (Hendrycks et al. 2021; 7,500 problems), the QUATRO paper's training data.

``source=hub`` loads it with ``datasets.load_dataset`` (for users with network access);
``source=local`` reads a JSONL file of MATH-style records (``problem`` plus ``answer`` or a
``solution`` with a final ``\\boxed{}``), which is how tests and offline clusters use it. Both go
through the benchmark row normaliser of :mod:`evaluation.benchmarks`, so gold answers are parsed
exactly as in evaluation.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from evaluation.benchmarks import rows_from_records

DEFAULT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"data.path={str(path)!r}: file does not exist")
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
    return out


def load_math_train(source: str = "hub", path: str | None = None, hub_path: str = "DigitalLearningGmbH/MATH-lighteval",
                    hub_config: str | None = "default", hub_split: str = "train", levels=None, max_prompts=None,
                    seed: int = 0, n_eval: int = 0, template: str = DEFAULT_TEMPLATE, **load_kwargs) -> tuple[list[dict], list[dict]]:
    """MATH training prompts, shuffled by ``seed``, as (train rows, held-out rows).

    Args:
        source: ``hub`` (``datasets.load_dataset(hub_path, hub_config, split=hub_split)``; with
            ``hub_path="json"`` and ``data_files=...`` it reads local files through the same code) or
            ``local`` (a JSONL file at ``path``).
        levels: keep only these difficulty levels (1-5; records with a ``level`` field such as "Level 3").
        max_prompts: keep at most this many training rows (after shuffling).
        n_eval: hold the first ``n_eval`` shuffled rows out of training.
        template: prompt text with a ``{problem}`` field.
    Returns:
        Rows ``{"id", "prompt", "gold", "level"}``.
    Raises:
        ValueError: unknown source, a template without ``{problem}``, a record without problem or answer,
            no rows left after filtering.
        FileNotFoundError: ``source=local`` and ``path`` is missing.
    """
    if "{problem}" not in template:
        raise ValueError(f"data.template={template!r}: must contain {{problem}}")
    if source == "local":
        if not path:
            raise ValueError("data.source=local needs data.path (a JSONL file of MATH records)")
        records, where = _read_jsonl(Path(path)), str(path)
    elif source == "hub":
        from datasets import load_dataset

        records = list(load_dataset(hub_path, hub_config, split=hub_split, **load_kwargs))
        where = f"{hub_path}[{hub_split}]"
    else:
        raise ValueError(f"data.source={source!r}: expected 'hub' or 'local'")
    rows = rows_from_records(records, where)
    for row, rec in zip(rows, records):
        lv = str(rec.get("level", "")).replace("Level", "").strip()
        row["level"] = int(lv) if lv.isdigit() else None
        row["prompt"] = template.replace("{{}}", "{}").replace("{problem}", row["prompt"])
    if levels:
        keep = {int(x) for x in levels}
        rows = [r for r in rows if r["level"] in keep]
    random.Random(seed).shuffle(rows)
    held_out, train = rows[: int(n_eval)], rows[int(n_eval):]
    if max_prompts:
        train = train[: int(max_prompts)]
    if not train:
        raise ValueError(f"data: no MATH training rows left from {where} (levels={levels}, n_eval={n_eval})")
    return train, held_out
