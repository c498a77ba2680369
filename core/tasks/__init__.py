"""Tasks as plug-ins: one registry owns prompts, templates, checkers and splits (see :mod:`core.tasks.base`).

Every module of this folder registers its tasks on import; the registry imports them all (a folder scan,
:func:`core.plugins.discover`) on its first look-up. Registered here: the math benchmarks and the MATH training set (:mod:`.math`, :mod:`.math_train`), generated
arithmetic (:mod:`.arithmetic`), Knights and Knaves (:mod:`.knights_knaves`), multiple choice (:mod:`.choice`:
GPQA, MMLU-Pro, TruthfulQA-MC1), code execution (:mod:`.code`: HumanEval(+), MBPP(+), APPS) and question answering
with a search tool (:mod:`.search_qa`).
"""
from .base import TASKS, Score, Task, get_task, load_plugins, load_prompts, register_task, score_responses, task_names

__all__ = ["TASKS", "Score", "Task", "get_task", "load_plugins", "load_prompts", "register_task", "score_responses",
           "task_names"]
