"""A generated multi-answer task: every prompt has several correct answers, each its own mode.

RECONSTRUCTED (the ExPPO paper's controlled multi-answer evaluation: 64 prompts, K = 128 samples, each prompt
with several correct answers; its generator is not published). Task ``products``: "give two whole numbers,
each greater than 1, whose product is N", for N with at least ``min_pairs`` such unordered pairs; every
valid pair is correct and each distinct unordered pair is one answer mode, so observed yield counts the
distinct factorisations a policy finds (at most the number of pairs of N).
"""
from __future__ import annotations

import math
import random
import re

from .base import Score, Task, register_task

PROBLEM = "Give two whole numbers, each greater than 1, whose product is {n}."


def factor_pairs(n: int) -> list[tuple[int, int]]:
    """The unordered pairs (a, b), 1 < a <= b, with a b = n, in order of a."""
    return [(a, n // a) for a in range(2, math.isqrt(n) + 1) if n % a == 0]


def make_products(count: int = 64, seed: int = 0, min_pairs: int = 3, low: int = 12, high: int = 2000) -> list[dict]:
    """``count`` prompts, the numbers N in [low, high] with at least ``min_pairs`` factor pairs, shuffled by ``seed``.

    Returns:
        Rows ``{"id": "N", "problem", "prompt", "gold": "a,b;..." (every valid pair), "n": N}``.
    Raises:
        ValueError: more prompts asked than such numbers exist (names the count).
    """
    pool = [n for n in range(low, high + 1) if len(factor_pairs(n)) >= min_pairs]
    if not 1 <= count <= len(pool):
        raise ValueError(f"max_prompts={count!r}: the products task has {len(pool)} numbers in [{low}, {high}] "
                         f"with >= {min_pairs} factor pairs")
    random.Random(seed).shuffle(pool)
    return [{"id": str(n), "n": n, "problem": PROBLEM.format(n=n), "prompt": PROBLEM.format(n=n),
             "gold": ";".join(f"{a},{b}" for a, b in factor_pairs(n))} for n in pool[:count]]


def _pair(text) -> tuple[int, int] | None:
    """The two whole numbers an answer names (sorted), or None when it names another count."""
    nums = re.findall(r"\d+", str(text or ""))
    return tuple(sorted(int(x) for x in nums)) if len(nums) == 2 and all(len(x) < 12 for x in nums) else None


@register_task
class Products(Task):
    """``products``: correct when the last boxed answer (else the response's last line) names two numbers > 1 whose
    product is N. ``extracted`` is the pair as ``a,b`` (a <= b), so equal pairs written differently are one mode."""

    name = "products"
    kind = "multi_answer"
    template = "{problem}\nPut the two numbers within \\boxed{{}}, separated by a comma."

    def load(self, split: str, cfg) -> list[dict]:
        rows = make_products(int(cfg.get("max_prompts") or 64), int(cfg.get("seed", 0)))
        return [dict(r, task=self.name, prompt=self.render(r["problem"])) for r in rows]

    def validate(self, cfg, role: str) -> None:
        make_products(int(cfg.get("max_prompts") or 64), int(cfg.get("seed", 0)))

    def score(self, response: str, row: dict) -> Score:
        """Restating the prompt earns nothing: it names one number (N), and "N, 1" fails the "greater than 1" rule.
        ``status`` is ``stated`` when two numbers were read, else ``missing`` (:mod:`core.tasks.answer_forms`)."""
        from core.tasks.answer_forms import MISSING, STATED
        from core.verify import last_boxed

        if not isinstance(response, str) or not response.strip():
            return Score(0.0, False, None, status=MISSING)
        tail = response[-2000:]
        box = last_boxed(tail)
        answer = box if box is not None else tail.strip().splitlines()[-1]
        pair = _pair(answer)
        if pair is None:
            return Score(0.0, False, answer[:100] if answer else None, status=MISSING)
        ok = pair[0] > 1 and pair[0] * pair[1] == int(row["n"] if "n" in row else row["id"])
        return Score(float(ok), ok, f"{pair[0]},{pair[1]}", status=STATED)

    def same_answer(self, a, b) -> bool:
        pa, pb = _pair(a), _pair(b)
        return pa == pb if pa is not None and pb is not None else super().same_answer(a, b)
