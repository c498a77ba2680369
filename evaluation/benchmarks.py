"""Benchmarks: name -> rows ``{"id", "prompt", "gold"}``.

Local JSONL files (``<data_dir>/<name>/test.jsonl``) are read with the field conventions seen in
the wild: the problem in ``problem`` or ``question``; the gold answer in ``answer`` (a string or a
number such as AMC's ``27.0``), in ``final_answer`` (OlympiadBench's list), after GSM8K's ``####``,
or only inside the solution's last ``\\boxed{}`` (MATH-style files without an answer field).
The generated ``arithmetic`` set needs no files.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

from .verify import last_boxed

BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "gsm8k", "arithmetic", "kk")


def _number_text(x) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def gold_from_row(row: dict, where: str = "") -> str:
    """The gold answer of one benchmark row, as a string.

    Raises:
        ValueError: naming ``where`` (file and line) when no answer can be found.
    """
    fa = row.get("final_answer")
    if fa not in (None, "", [], "None"):
        if isinstance(fa, str) and fa.startswith("["):
            try:
                fa = ast.literal_eval(fa)
            except (ValueError, SyntaxError):
                pass
        if isinstance(fa, list):
            fa = ", ".join(str(a).strip().strip("$") for a in fa)
        return str(fa).strip().strip("$")
    ans = row.get("answer")
    if ans not in (None, ""):
        if isinstance(ans, str) and "####" in ans:  # GSM8K: reasoning, then '#### 18'
            return ans.rsplit("####", 1)[1].strip().replace(",", "")
        if isinstance(ans, (int, float)):
            return _number_text(ans)
        if isinstance(ans, (list, tuple)):
            return ", ".join(str(a).strip().strip("$") for a in ans)
        if not isinstance(ans, str):
            raise ValueError(f"{where}: answer {ans!r} is neither text, a number nor a list")
        s = ans.strip()
        try:
            return _number_text(float(s)) if s.replace(".", "", 1).lstrip("-").isdigit() else s
        except ValueError:
            return s
    sol = row.get("solution")
    if isinstance(sol, str):
        boxed = last_boxed(sol)
        if boxed is not None:
            return boxed.strip()
    raise ValueError(f"{where}: no gold answer (looked for final_answer, answer, '####', \\boxed{{}} in solution)")


# Hub sources for users (never used by tests or CI): name -> (dataset path, config, split).
HUB_SOURCES = {
    "math500": ("HuggingFaceH4/MATH-500", None, "test"),
    "aime24": ("HuggingFaceH4/aime_2024", None, "train"),
    "aime25": ("yentinglin/aime_2025", None, "train"),
    "amc23": ("zwhe99/amc23", None, "test"),
    "minerva_math": ("math-ai/minervamath", None, "test"),
    "olympiadbench": ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
}


def rows_from_records(records, where: str, limit: int | None = None) -> list[dict]:
    """Normalise raw benchmark records (dicts) to rows ``{"id", "prompt", "gold"}``.

    Raises:
        ValueError: a record without a problem or a gold answer, naming ``where`` and the record number.
    """
    rows = []
    for i, row in enumerate(records, 1):
        at = f"{where}:{i}"
        if not isinstance(row, dict):
            raise ValueError(f"{at}: expected a JSON object with a problem and an answer, got {type(row).__name__}")
        problem = row.get("problem") or row.get("question")
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"{at}: no 'problem' or 'question' field")
        rid = row.get("id", row.get("unique_id", row.get("idx", i - 1)))
        rows.append({"id": str(rid), "prompt": problem, "gold": gold_from_row(row, at)})
        if limit is not None and len(rows) >= limit:
            break
    return rows


def load_hub_benchmark(name: str, limit: int | None = None, path: str | None = None, config: str | None = None,
                       split: str | None = None, **load_kwargs) -> list[dict]:
    """Rows of a benchmark from its hub dataset (``datasets.load_dataset``), for users with network access.

    ``path``/``config``/``split`` override :data:`HUB_SOURCES`; extra keyword arguments go to
    ``load_dataset`` (e.g. ``data_files``). Raises ValueError for an unknown name.
    """
    if name not in HUB_SOURCES and path is None:
        raise ValueError(f"benchmark {name!r}: no hub source; known: {sorted(HUB_SOURCES)}")
    from datasets import load_dataset

    hub_path, hub_config, hub_split = HUB_SOURCES.get(name, (None, None, None))
    ds = load_dataset(path or hub_path, config or hub_config, split=split or hub_split, **load_kwargs)
    return rows_from_records(ds, f"{path or hub_path}[{split or hub_split}]", limit)


def load_benchmark(name: str, data_dir=None, limit: int | None = None) -> list[dict]:
    """Rows of benchmark ``name``: from ``<data_dir>/<name>/test.jsonl`` when a data_dir is given, else from the hub."""
    return load_local_benchmark(name, data_dir, limit) if data_dir else load_hub_benchmark(name, limit)


def load_local_benchmark(name: str, data_dir, limit: int | None = None) -> list[dict]:
    """Rows of ``<data_dir>/<name>/test.jsonl``.

    Args:
        name: benchmark folder name; data_dir: directory holding the benchmark folders;
        limit: keep the first ``limit`` rows (None: all).
    Raises:
        FileNotFoundError: the file is missing (names the path).
        ValueError: a row without a problem or a gold answer (names file and line).
    """
    path = Path(data_dir) / name / "test.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {name!r}: {path} does not exist")
    records = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
    return rows_from_records(records, str(path), limit)
