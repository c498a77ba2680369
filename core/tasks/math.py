"""Single-answer math: the benchmarks (MATH-500, AIME 2024/2025, AMC 2023, Minerva, OlympiadBench, GSM8K) as
registered tasks, checked by math-verify (:mod:`core.verify`).

Local JSONL files (``<data_dir>/<name>/test.jsonl``) are read with the field conventions seen in
the wild: the problem in ``problem`` or ``question``; the gold answer in ``answer`` (a string or a
number such as AMC's ``27.0``), in ``final_answer`` (OlympiadBench's list), after GSM8K's ``####``,
or only inside the solution's last ``\\boxed{}`` (MATH-style files without an answer field).
Without ``eval.data_dir`` the rows come from the hub (:data:`HUB_SOURCES`, for users with network access).

Adding a math benchmark is one line: ``register_task(MathBenchmark("name", hub=(path, config, split)))``.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Sequence

from core.verify import default_verifier, last_boxed

from .base import Score, Task, read_jsonl, register_task

BOXED_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


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


def local_benchmark_file(name: str, data_dir) -> Path:
    """``<data_dir>/<name>/test.jsonl``."""
    return Path(data_dir) / name / "test.jsonl"


def load_local_benchmark(name: str, data_dir, limit: int | None = None) -> list[dict]:
    """Rows of ``<data_dir>/<name>/test.jsonl``.

    Args:
        name: benchmark folder name; data_dir: directory holding the benchmark folders;
        limit: keep the first ``limit`` rows (None: all).
    Raises:
        FileNotFoundError: the file is missing (names the path).
        ValueError: a row without a problem or a gold answer (names file and line).
    """
    path = local_benchmark_file(name, data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark {name!r}: {path} does not exist")
    return rows_from_records(read_jsonl(path), str(path), limit)


class MathScored(Task):
    """Scoring by math-verify: reward 1.0 when the response's final answer, read in the form its prompt asks for
    (:mod:`core.tasks.answer_forms`: the last ``\\boxed{}`` for a template that asks for one, else the task's
    ``answer_form``), equals the row's ``gold``, else 0. An answer that restates the prompt, or an expression where a
    value is asked, earns nothing. ``extracted`` is the answer as written; ``reference`` plain math-verify's verdict
    on the whole response (the grader audit). All responses of a batch go to the verifier's worker pool at once."""

    kind = "math"
    answer_form = "boxed"

    def score_many(self, responses: Sequence[str], rows: Sequence[dict]) -> list[Score]:
        from .answer_forms import form_of

        read = [form_of(r, self.answer_form).read(resp if isinstance(resp, str) else "", str(r.get("prompt", "")),
                                                   str(r["gold"])) for resp, r in zip(responses, rows)]
        checks = default_verifier().check_many(list(responses), [r["gold"] for r in rows], [a.verify for a in read])
        return [Score(float(c.correct), bool(c.correct), a.text, c.reference, a.status) for a, c in zip(read, checks)]

    def score(self, response: str, row: dict) -> Score:
        return self.score_many([response], [row])[0]

    def same_answer(self, a: str | None, b: str | None) -> bool:
        """Two extracted answers are one mode when math-verify reads them as equal (``\\frac{1}{2}``,
        ``x=\\frac{1}{2}`` and ``0.5`` are one answer) with either as the reference (its reading of a relation
        is not symmetric), through :mod:`core.verify`."""
        if super().same_answer(a, b):
            return True
        if a is None or b is None:
            return False
        v = default_verifier()
        ab, ba = v.check_many([f"\\boxed{{{a}}}", f"\\boxed{{{b}}}"], [b, a])
        return bool(ab.correct or ba.correct)


class MathBenchmark(MathScored):
    """A math benchmark read from ``<eval.data_dir>/<name>/test.jsonl``, or from the hub without a data_dir.

    Args:
        name: the benchmark (and its folder) name; hub: ``(dataset path, config, split)`` for users online.
    """

    template = BOXED_TEMPLATE

    def __init__(self, name: str, hub: tuple | None = None):
        self.name, self.hub = name, hub

    def load(self, split: str, cfg) -> list[dict]:
        data_dir, limit = cfg.get("data_dir"), cfg.get("max_prompts")
        if data_dir:
            rows = load_local_benchmark(self.name, data_dir, limit)
        else:
            path, config, hub_split = self.hub or (None, None, None)
            rows = load_hub_benchmark(self.name, limit, path=path, config=config, split=hub_split)
        return [dict(r, task=self.name, problem=r["prompt"], prompt=self.render(r["prompt"])) for r in rows]

    def validate(self, cfg, role: str) -> None:
        data_dir = cfg.get("data_dir")
        if data_dir and not local_benchmark_file(self.name, data_dir).is_file():
            raise ValueError(f"eval.data_dir={data_dir!r}: no {self.name}/test.jsonl there")
        if not data_dir and self.hub is None:
            raise ValueError(f"eval.benchmarks: {self.name!r} has no hub source; set eval.data_dir to a folder with "
                             f"{self.name}/test.jsonl")


for _name, _hub in HUB_SOURCES.items():
    register_task(MathBenchmark(_name, _hub))
