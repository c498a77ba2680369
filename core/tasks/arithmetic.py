"""Generated arithmetic prompts: easy, seeded, with an exact integer answer.

The default SmolLM2-135M-Instruct model gets a usable reward signal on one-digit sums
(about 30% of samples correct at temperature 1.0), which is what a CPU run needs. Registered as the task
``arithmetic`` (``data=arithmetic``; its held-out split is the benchmark ``arithmetic``), scored by math-verify.
"""
from __future__ import annotations

import itertools
import random

from core.config_keys import I, L, S

from .base import register_task
from .math import MathScored

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_arithmetic(difficulty: int = 1, operations=("+",), seed: int = 0, template: str = "Compute {a} {op} {b}. Answer with just the number.") -> list[dict]:
    """Every problem ``a op b`` with operands of up to ``difficulty`` digits, shuffled by ``seed``.

    Args:
        difficulty: number of decimal digits per operand (1: 0..9, 2: 0..99, ...), 1 to 3.
        operations: subset of ``+``, ``-``, ``*``.
        seed: shuffling seed.
        template: prompt text with ``{a}``, ``{op}``, ``{b}`` fields.
    Returns:
        Rows ``{"id": "a+b", "prompt": str, "gold": str}``.
    Raises:
        ValueError: difficulty outside 1..3, unknown operation, or a template without the fields.
    """
    if not 1 <= int(difficulty) <= 3:
        raise ValueError(f"difficulty={difficulty!r}: expected 1, 2 or 3 (digits per operand)")
    bad = [op for op in operations if op not in _OPS]
    if bad or not operations:
        raise ValueError(f"operations={list(operations)!r}: expected a non-empty subset of {list(_OPS)}")
    for fieldname in ("{a}", "{b}"):
        if fieldname not in template:
            raise ValueError(f"template={template!r} lacks the field {fieldname}")
    top = 10 ** int(difficulty)
    rows = [
        {"id": f"{a}{op}{b}", "prompt": template.format(a=a, op=op, b=b), "gold": str(_OPS[op](a, b))}
        for op, a, b in itertools.product(operations, range(top), range(top))
    ]
    random.Random(seed).shuffle(rows)
    return rows


def arithmetic_splits(difficulty: int = 1, operations=("+",), seed: int = 0, n_eval: int = 20, template: str = "Compute {a} {op} {b}. Answer with just the number.") -> tuple[list[dict], list[dict]]:
    """(train, held_out): the first ``n_eval`` shuffled problems are held out, the rest train.

    The two splits never share a problem. Raises ValueError when ``n_eval`` leaves no training rows.
    """
    rows = make_arithmetic(difficulty, operations, seed, template)
    if not 0 <= n_eval < len(rows):
        raise ValueError(f"n_eval={n_eval}: must be in [0, {len(rows)}) for difficulty={difficulty}")
    return rows[n_eval:], rows[:n_eval]


@register_task
class Arithmetic(MathScored):
    """Generated arithmetic as a task: ``load("train" | "eval", data_cfg)`` (see :func:`arithmetic_splits`)."""

    name = "arithmetic"
    config = {"difficulty": I(1, 3), "operations": L(S(("+", "-", "*")), min_len=1), "seed": I(0), "n_eval": I(0),
              "template": S()}
    heldout_from_data = True
    answer_form = "number"  # "Answer with just the number": a number stated as a value (core.tasks.answer_forms)

    def load(self, split: str, cfg) -> list[dict]:
        train, held_out = arithmetic_splits(difficulty=int(cfg.difficulty), operations=list(cfg.operations),
                                            seed=int(cfg.seed), n_eval=int(cfg.n_eval), template=str(cfg.template))
        return [dict(r, task=self.name) for r in (train if split == "train" else held_out)]

    def validate(self, cfg, role: str) -> None:
        if role == "data":
            arithmetic_splits(difficulty=cfg.get("difficulty", 1), operations=list(cfg.get("operations") or []),
                              seed=int(cfg.get("seed", 0)), n_eval=int(cfg.get("n_eval", 0)),
                              template=str(cfg.get("template", "{a}{op}{b}")))
