"""A plugin module a sweep imports with ``plugins=[tests.plugins.toy_tasks]``: registering a math benchmark is
one line, and a task of a new kind is one small class."""
from core.tasks import Score, Task, register_task
from core.tasks.math import MathBenchmark

register_task(MathBenchmark("toy_math"))  # reads <eval.data_dir>/toy_math/test.jsonl, checked by math-verify


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
