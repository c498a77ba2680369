"""Multiple choice: lettered options, a checker that reads the chosen letter.

Tasks (ExPPO's out-of-domain suite): ``gpqa_diamond`` (198 questions; the local file of
``<data_dir>/gpqa_diamond_mcq/test.jsonl``, whose questions already list options A-D, or the hub),
``gpqa_main`` (448, hub only: ``Idavidrein/gpqa``, gated), ``mmlu_pro`` (``TIGER-Lab/MMLU-Pro``, up to ten
options A-J) and ``truthfulqa_mc1`` (``truthfulqa/truthful_qa``, config ``multiple_choice``, its ``mc1_targets``).
Each reads a local ``<data_dir>/<name>/test.jsonl`` when ``eval.data_dir`` is set, with the hub dataset's own
fields, so one normaliser serves both. Options without letters are lettered A, B, ... in their stored order;
where the source lists the right answer first (GPQA's hub records, TruthfulQA's mc1), they are shuffled with a
seed fixed per question, so the gold letter is not always A.

The checker (:func:`chosen_letter`) reads the letter from the last answer statement: ``\\boxed{B}``,
``\\boxed{B) text}``, ``\\boxed{(B)}``, ``\\boxed{\\text{B}}``, "The answer is (B)", "Answer: B", "the correct option
is B", "**B**" at the end, or a bare "B" / "(B)" / "B)" response. A response whose answer statements name two
different letters (hedging: "A or B", ``\\boxed{A, C}``, two boxes that differ) gets no letter and scores wrong.
Reward 1 for the gold letter, else 0.
"""
from __future__ import annotations

import random
import re
import string
from pathlib import Path

from .base import Score, Task, read_jsonl, register_task

LETTERS = string.ascii_uppercase[:10]
TEMPLATE = ("{problem}\n\nThink step by step, then give the letter of the correct option as your final answer "
            "within \\boxed{{}}.")

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_NOT_PRONOUN = r"(?!\s+(?i:am|think|believe|will|would|can|could|have|guess|need|must)\b)"  # "Answer: I think ..."
_LETTER = r"\**\(?\s*([A-J])\s*\)?\**(?![A-Za-z0-9])"  # the letter itself is matched case-sensitively
_STATEMENTS = [
    re.compile(r"(?i:(?:final\s+)?answer)\s*(?i:is|:|would\s+be)?\s*(?i:option\s+|choice\s+)?[:\-]?\s*" + _LETTER + _NOT_PRONOUN),
    re.compile(r"(?i:(?:correct|right|best)\s+(?:option|choice|answer)\s+(?:is|would\s+be|:))\s*" + _LETTER),
    re.compile(r"(?i:option|choice)\s+\(?([A-J])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|answer))"),
]
_HEDGE = re.compile(r"^\s*\**\(?([A-J])\)?\**\s*(?:,|/|(?i:\bor\b|\band\b)|&)\s*\**\(?([A-J])\)?(?![A-Za-z0-9])")


def _boxed_contents(text: str) -> list[str]:
    out = []
    for m in _BOXED.finditer(text):
        depth, start = 1, m.end()
        for pos in range(start, min(len(text), start + 2000)):
            if text[pos] == "{":
                depth += 1
            elif text[pos] == "}":
                depth -= 1
                if depth == 0:
                    out.append(text[start:pos])
                    break
    return out


def _letter_of_box(content: str, letters: str) -> str | None:
    """``B``, ``(B)``, ``B) text``, ``B. text``, ``\\text{B}``, ``\\mathrm{(B)}`` -> B; None for ``A, C`` or no letter."""
    c = re.sub(r"\\(?:text|mathrm|textbf|mathbf)\s*\{([^{}]*)\}", r"\1", content).strip()
    if _HEDGE.match(c):
        return None
    m = re.match(r"^\(?\s*([A-J])\s*(?:\)|\.|:|\s|$)", c + " ")
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


def chosen_letter(response, n_options: int = 4) -> str | None:
    """The option letter a response chooses, or None (no answer, an invalid letter, or two different letters).

    Args:
        response: model output (any object; non-strings choose nothing).
        n_options: options A.. in the question (letters beyond are invalid).
    """
    if not isinstance(response, str) or not response.strip():
        return None
    letters = LETTERS[:max(1, min(int(n_options), len(LETTERS)))]
    text = response[-6000:]
    boxes = _boxed_contents(text)
    if boxes:
        picks = [_letter_of_box(b, letters) for b in boxes]
        if any(p is None for p in picks) or len(set(picks)) != 1:
            return None
        return picks[0]
    found = []
    for rx in _STATEMENTS:
        for m in rx.finditer(text):
            if re.search(r"(?i:\bif\b|\bwhether\b|\bnot\b)", text[max(0, m.start() - 12):m.start()]):
                continue  # "if the answer is A, ...", "the answer is not B": no choice stated
            if _HEDGE.match(text[m.start(1) - (1 if text[m.start(1) - 1:m.start(1)] == "(" else 0):m.start(1) + 16]):
                return None
            found.append((m.start(1), m.group(1)))
    if found:
        chosen = {letter for _, letter in found}
        if len(chosen) != 1:
            return None
        letter = chosen.pop()
        return letter if letter in letters else None
    bare = re.fullmatch(r"\s*\**\(?([A-J])\)?\.?\**\s*", text)
    if bare and bare.group(1).upper() in letters:
        return bare.group(1).upper()
    return None


def lettered(question: str, options: list[str]) -> str:
    """The question followed by ``A) option`` lines."""
    return question.rstrip() + "\n\n" + "\n".join(f"{LETTERS[i]}) {str(o).strip()}" for i, o in enumerate(options))


def shuffled(options: list[str], correct: int, key: str) -> tuple[list[str], int]:
    """``options`` in an order fixed by ``key`` (a seed per question) and the correct option's new index."""
    order = list(range(len(options)))
    random.Random(f"choice:{key}").shuffle(order)
    return [options[i] for i in order], order.index(correct)


class MultipleChoice(Task):
    """A multiple-choice benchmark. Subclasses turn one raw record into (question text with lettered options,
    gold letter, number of options) in :meth:`record`.

    Args:
        name: task name; hub: ``(path, config, split)`` for users online; folders: local folder names tried
        under ``eval.data_dir`` (default: the name).
    """

    kind = "multiple_choice"
    template = TEMPLATE

    def __init__(self, name: str, hub: tuple | None = None, folders: tuple = ()):
        self.name, self.hub, self.folders = name, hub, folders or (name,)

    def record(self, rec: dict, index: int) -> tuple[str, str, int]:
        raise NotImplementedError

    def _local(self, data_dir) -> Path | None:
        for f in self.folders:
            p = Path(data_dir) / f / "test.jsonl"
            if p.is_file():
                return p
        return None

    def load(self, split: str, cfg) -> list[dict]:
        data_dir, limit = cfg.get("data_dir"), cfg.get("max_prompts")
        if data_dir:
            path = self._local(data_dir)
            if path is None:
                raise FileNotFoundError(f"benchmark {self.name!r}: no {' or '.join(self.folders)}/test.jsonl in {data_dir}")
            records, where = read_jsonl(path), str(path)
        else:
            from datasets import load_dataset

            path_, config, hub_split = self.hub
            records, where = list(load_dataset(path_, config, split=hub_split)), f"{path_}[{hub_split}]"
        rows = []
        for i, rec in enumerate(records):
            if not isinstance(rec, dict):
                raise ValueError(f"{where}:{i + 1}: expected a JSON object")
            try:
                question, gold, n = self.record(rec, i)
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise ValueError(f"{where}:{i + 1}: not a {self.name} record ({type(e).__name__}: {e})") from None
            if gold not in LETTERS[:n]:
                raise ValueError(f"{where}:{i + 1}: gold {gold!r} is not one of the {n} option letters")
            rows.append({"id": str(rec.get("id", rec.get("question_id", i))), "problem": question,
                         "prompt": self.render(question), "gold": gold, "n_options": n, "task": self.name})
            if limit and len(rows) >= int(limit):
                break
        return rows

    def score(self, response: str, row: dict) -> Score:
        got = chosen_letter(response, int(row.get("n_options", 4)))
        ok = got is not None and got == row["gold"]
        return Score(float(ok), ok, got)

    def validate(self, cfg, role: str) -> None:
        data_dir = cfg.get("data_dir")
        if data_dir and self._local(data_dir) is None:
            raise ValueError(f"eval.data_dir={data_dir!r}: no {' or '.join(self.folders)}/test.jsonl there")
        if not data_dir and self.hub is None:
            raise ValueError(f"eval.benchmarks: {self.name!r} has no hub source; set eval.data_dir")


class GPQA(MultipleChoice):
    """GPQA: local records ``{"question": text with "A) ..." lines, "answer": "A"}``; hub records (gated
    ``Idavidrein/gpqa``) ``Question``, ``Correct Answer``, ``Incorrect Answer 1-3`` (shuffled per question)."""

    def record(self, rec, index):
        if "Question" in rec:
            opts = [rec["Correct Answer"]] + [rec[f"Incorrect Answer {k}"] for k in (1, 2, 3)]
            opts, correct = shuffled(opts, 0, str(rec.get("Record ID", index)))
            return lettered(rec["Question"], opts), LETTERS[correct], 4
        letters = re.findall(r"^\s*([A-J])\)", rec["question"], flags=re.MULTILINE)
        n = max(4, len(set(letters)))
        return rec["question"], str(rec["answer"]).strip().upper(), n


class MMLUPro(MultipleChoice):
    """MMLU-Pro (``TIGER-Lab/MMLU-Pro``): ``question``, ``options`` (up to 10), ``answer`` (a letter) or
    ``answer_index``."""

    def record(self, rec, index):
        opts = list(rec["options"])
        gold = rec.get("answer")
        gold = str(gold).strip().upper() if gold not in (None, "") else LETTERS[int(rec["answer_index"])]
        return lettered(rec["question"], opts), gold, len(opts)


class TruthfulQAMC1(MultipleChoice):
    """TruthfulQA MC1 (``truthfulqa/truthful_qa``, config ``multiple_choice``): ``question`` and ``mc1_targets``
    ``{"choices": [...], "labels": [1, 0, ...]}`` with exactly one true label (listed first in the source, so
    the options are shuffled per question)."""

    def record(self, rec, index):
        choices, labels = list(rec["mc1_targets"]["choices"]), list(rec["mc1_targets"]["labels"])
        if labels.count(1) != 1 or len(choices) != len(labels):
            raise ValueError("mc1_targets needs exactly one label 1 per choice list")
        true = labels.index(1)
        if len(choices) > len(LETTERS):  # at most ten options: the true one and the first nine others
            keep = [true] + [i for i in range(len(choices)) if i != true][:len(LETTERS) - 1]
            choices, true = [choices[i] for i in sorted(keep)], sorted(keep).index(true)
        opts, correct = shuffled(choices, true, rec["question"])
        return lettered(rec["question"], opts), LETTERS[correct], len(opts)


register_task(GPQA("gpqa_diamond", hub=("Idavidrein/gpqa", "gpqa_diamond", "train"), folders=("gpqa_diamond", "gpqa_diamond_mcq")))
register_task(GPQA("gpqa_main", hub=("Idavidrein/gpqa", "gpqa_main", "train")))
register_task(MMLUPro("mmlu_pro", hub=("TIGER-Lab/MMLU-Pro", None, "test")))
register_task(TruthfulQAMC1("truthfulqa_mc1", hub=("truthfulqa/truthful_qa", "multiple_choice", "validation")))
