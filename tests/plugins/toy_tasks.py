"""A plugin module a sweep imports with ``plugins=[tests.plugins.toy_tasks]``: registering a math benchmark is
one line, and a task of a new kind is one small class."""
from core.tasks import Score, Task, register_task
from core.tasks.math import MathBenchmark

register_task(MathBenchmark("toy_math"))  # reads <eval.data_dir>/toy_math/test.jsonl, checked by math-verify


@register_task
class FlakyMath(MathBenchmark):
    """A math benchmark (``<eval.data_dir>/toy_flaky/test.jsonl``) whose scorer fails while a file ``FAIL`` sits
    beside its data: a failure only the evaluation meets (pre-flight reads the rows, which are fine), for the test of
    a failing point among others and its re-run once the cause is removed (tests/orchestrator/test_sweep_lifecycle.py)."""

    def __init__(self):
        super().__init__("toy_flaky")

    def load(self, split, cfg):
        from pathlib import Path

        flag = str(Path(str(cfg.get("data_dir"))) / self.name / "FAIL")
        return [dict(r, fail_flag=flag) for r in super().load(split, cfg)]

    def score_many(self, responses, rows):
        import os

        for r in rows:
            if os.path.exists(r.get("fail_flag", "")):
                raise RuntimeError(f"toy_flaky: {r['fail_flag']} exists (the scorer fails while it does)")
        return super().score_many(responses, rows)


@register_task
class Echo(Task):
    """Say the given word: correct when the response contains it."""

    name = "toy_echo"
    kind = "echo"

    def load(self, split, cfg):
        words = ["apple", "river", "stone", "cloud"][: cfg.get("max_prompts") or 4]
        return [{"id": w, "problem": f"Say the word {w}.", "prompt": f"Say the word {w}.", "gold": w, "task": self.name}
                for w in words]

    def score(self, response, row):
        ok = isinstance(response, str) and row["gold"] in response.lower()
        return Score(float(ok), ok, row["gold"] if ok else None)


@register_task
class Parity(Task):
    """A training task whose reward varies between the samples of any model, a random one included, for end-to-end
    training tests (engine=verl on the CPU) that need non-zero advantages where a random model scores 0 on every real
    task: a response is correct when it has an even number of characters, except on every fourth prompt (ids p3, p7,
    ...), which is never answered correctly (its groups have no reward variance: what DAPO's group filter evicts)."""

    name = "toy_parity"
    kind = "parity"

    def load(self, split, cfg):
        n = int(cfg.get("n_prompts") or cfg.get("max_prompts") or 8)
        return [{"id": f"p{i}", "problem": f"Write {i} words.", "prompt": f"Write {i} words.",
                 "gold": "never" if i % 4 == 3 else "even", "task": self.name} for i in range(n)]

    def score(self, response, row):
        ok = isinstance(response, str) and row["gold"] == "even" and len(response) % 2 == 0
        return Score(float(ok), ok, "even" if isinstance(response, str) and len(response) % 2 == 0 else "odd")


@register_task
class SlowParity(Parity):
    """toy_parity whose scoring takes ``TOY_SLOW_SCORING_S`` seconds from the second call of a process on (the
    second training step), for the test of a stop request inside a step longer than a scheduler's grace period
    (tests/orchestrator/test_faults.py). Without the variable it is toy_parity."""

    name = "toy_slow_parity"
    calls = 0

    def score_many(self, responses, rows):
        import os
        import time

        SlowParity.calls += 1
        if SlowParity.calls >= 2:
            time.sleep(float(os.environ.get("TOY_SLOW_SCORING_S", "0")))
        return [self.score(r, row) for r, row in zip(responses, rows)]
