"""The task registry: one owner for everything about a kind of problem.

A task knows where its prompts come from (``load``), how they are rendered (``template``), how a response
is checked (``score``), whether its evaluation rows are the held-out split of the training data set of the
same name (``heldout_from_data``), and which settings it needs (``validate``). Training rewards, evaluation,
the verl reward function and pre-flight all ask the registry; nothing else branches on a task name.

Rows are plain dicts: ``id``, ``prompt`` (the rendered model input), ``problem`` (the raw text, re-rendered
when ``eval.prompt_template`` is set), ``gold`` (or ``tests`` for code), ``task`` (the registered name), and
optional ``subset`` plus task-specific metadata.

Register a task with ``register_task(MyTask())`` (or ``@register_task`` on a class), in a module this suite
imports or one named in the ``plugins`` config key (``python sweep.py 'plugins=[mypkg.tasks]' ...``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from core.config_keys import I, S, Spec
from core.plugins import Registry, load_plugins  # noqa: F401  (load_plugins: re-exported)


@dataclass(frozen=True)
class Score:
    """The verdict on one response: ``reward`` (what training optimises), ``correct`` (what pass@k counts) and
    ``extracted`` (the answer read from the response, for the samples table and answer modes; None when none)
    and ``reference`` (a reference grader's verdict, for the disagreement audit: plain math-verify's for math
    tasks; None where a task has no second grader) and ``status`` (whether the response gave an answer in the form
    its prompt asks for, and whether the answer was refused as an echo of the prompt)."""

    reward: float
    correct: bool
    extracted: str | None = None
    reference: bool | None = None
    status: str | None = None   # what the task's answer form found (:mod:`core.tasks.answer_forms`: stated, missing,
                                # restated, not_a_value); None for tasks without one


class Task:
    """Base class of a registered task. Subclasses set ``name``, ``kind`` and implement :meth:`load` and
    :meth:`score` (or :meth:`score_many` for batched checkers)."""

    name: str = ""
    kind: str = "math"                 # the report groups benchmarks by kind: math, multiple_choice, code, logic
    heldout_from_data: bool = False    # eval rows = load("eval", <training data config of this name>)
    template: str = "{problem}"        # default rendering of ``problem`` (``eval.prompt_template`` overrides)
    config: dict[str, Spec] = {}       # keys of its training data config it reads (relative: ``difficulty``), declared
                                       # next to its code and collected by the schema (none declared: free-form)
    answer_form: str = ""              # how its checker reads the final answer (core.tasks.answer_forms: boxed, number;
                                       # a template asking for \boxed{} means boxed); "" for checkers of their own
    tools: tuple = ()                  # tools its responses may call (core.tools: "search"): multi-turn rollouts;
                                       # rows may name a ``corpus`` file the search tool indexes when none is set

    def load(self, split: str, cfg) -> list[dict]:
        """Rows of ``split``: ``train``/``eval`` from a ``data`` config (training sets), ``test`` from an ``eval``
        config (benchmarks: ``data_dir``, ``max_prompts``).

        Raises:
            ValueError / FileNotFoundError: naming the bad file, record or setting.
        """
        raise NotImplementedError(f"task {self.name!r} has no {split!r} split")

    def score(self, response: str, row: dict) -> Score:
        """Score one response to ``row``. Never raises on model output (a bad one scores the lowest reward)."""
        raise NotImplementedError

    def score_many(self, responses: Sequence[str], rows: Sequence[dict]) -> list[Score]:
        """Score responses to rows (same length), in order. Override for checkers that batch."""
        return [self.score(r, row) for r, row in zip(responses, rows)]

    def same_answer(self, a: str | None, b: str | None) -> bool:
        """True when two extracted answers are the same answer (one *mode* for ExPPO's yield and disagreement).
        Default: equal after removing whitespace and case; tasks with a verifier override it."""
        if a is None or b is None:
            return a is b
        return "".join(str(a).split()).lower() == "".join(str(b).split()).lower()

    def validate(self, cfg, role: str) -> None:
        """Check the settings this task will read, before any work: ``role`` is ``data`` (``cfg`` is the training
        data config) or ``eval`` (``cfg`` is the eval config). Raises ValueError naming the key and value."""

    def render(self, problem: str, template: str | None = None) -> str:
        """``template`` (or the task's own) with ``{problem}`` filled in; ``{{``/``}}`` are literal braces."""
        return (template or self.template).format(problem=problem)


def read_jsonl(path) -> list:
    """The records of a JSONL file (blank lines skipped).

    Raises:
        FileNotFoundError: naming the path; ValueError: a line that is not JSON, naming file and line.
    """
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    out = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
    return out


# keys shared by training sets read from the Hugging Face hub or a local file (each task's ``config`` combines them)
HUB_KEYS: dict[str, Spec] = {"source": S(("hub", "local"), null=True), "path": S(null=True), "hub_path": S(),
                             "hub_config": S(null=True), "hub_split": S(), "max_prompts": I(1, null=True),
                             "seed": I(0), "n_eval": I(0)}

TASKS: Registry = Registry("task", packages=("core.tasks",))  # the folder's modules register on first look-up


def register_task(task):
    """Register a :class:`Task` instance (or, as a class decorator, an instance of the class) under its ``name``.

    Raises:
        ValueError: the name is empty or already taken by another task.
    """
    obj = task() if isinstance(task, type) else task
    if not obj.name:
        raise ValueError(f"task {obj!r} has no name")
    TASKS.register(obj.name, obj)
    return task


def get_task(name: str) -> Task:
    """The task registered as ``name``.

    Raises:
        KeyError: naming the unknown task and listing the registered ones.
    """
    return TASKS.get(str(name))


def task_names() -> list[str]:
    """Registered task names, sorted."""
    return TASKS.names()


def load_prompts(data_cfg, split: str) -> list[dict]:
    """Rows of the training data set ``data_cfg.name`` for ``split``: ``train``; ``eval``, its held-out split;
    or ``validation``: the last ``data_cfg.validation_prompts`` rows of the task's training split, which ``train``
    then leaves out (the split checkpoints are chosen on, ``eval.select_on=validation``, never trained on and
    never a benchmark). Without ``validation_prompts`` (0), ``validation`` is empty and ``train`` is the whole split.

    Raises:
        KeyError: no task of that name; ValueError: a split the task does not have, or a validation split that
            would leave no training prompt.
    """
    if split not in ("train", "eval", "validation"):
        raise ValueError(f"split={split!r}: expected 'train', 'eval' or 'validation'")
    task = get_task(data_cfg.name)
    if split == "eval":
        return task.load(split, data_cfg)
    rows = task.load("train", data_cfg)
    n_val = int(data_cfg.get("validation_prompts", 0) or 0)
    if n_val and n_val >= len(rows):
        raise ValueError(f"data.validation_prompts={n_val}: the training split of {data_cfg.name!r} has only "
                         f"{len(rows)} prompts")
    if split == "validation":
        return rows[len(rows) - n_val:]
    return rows[:len(rows) - n_val]


def score_responses(responses: Sequence[str], rows: Sequence[dict]) -> list[Score]:
    """Score each response against the row beside it, by the row's ``task``; rows of one task are scored
    together (batched checkers such as math-verify's worker pool see them at once).

    Raises:
        ValueError: the lengths differ, or a row without a registered ``task`` (a data error, not a model error).
    """
    if len(responses) != len(rows):
        raise ValueError(f"{len(responses)} responses but {len(rows)} rows")
    by_task: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_task.setdefault(r.get("task"), []).append(i)
    out: list = [None] * len(rows)
    for name, idx in by_task.items():
        if name not in TASKS:
            raise ValueError(f"row {rows[idx[0]].get('id')!r}: task {name!r} is not registered; registered: {sorted(TASKS)}")
        for i, s in zip(idx, TASKS[name].score_many([responses[i] for i in idx], [rows[i] for i in idx])):
            out[i] = s
    return out
