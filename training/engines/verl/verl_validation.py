"""The verl engine's validation along training (``train.validate_every = N``, docs/curves.md): verl's own periodic
validation samples the validation split with its rollout server (``trainer.val_before_train`` for step 0,
``trainer.test_freq=N``: steps N, 2N, ... and the last), dumping each point's generations to
``trainer.validation_data_dir`` as ``<step>.jsonl`` (each sample's prompt by the reward function's ``row_index``);
:class:`VerlValidations` hands every complete dump to the suite's validator (:class:`training.engines.LoopValidation`)
through :class:`ReplaySampler`, so the suite's scorer grades verl's samples and its tables (pass@k, maj@k, ...) are
logged at their step, with the training compute before them: training/compute.py's count on verl's token counts
(:class:`VerlCompute`), the local engine's FLOP definition.

verl's validation samples at the rollout's ``response_length`` (``train.max_new_tokens``), with the validator's
temperature, top_p and samples per prompt; the protocol tag says ``verl:<rollout server>``."""
from __future__ import annotations

import json
from pathlib import Path

from training.compute import ComputeModel
from training.engines.verl.verl_keys import VerlSettings

DUMPS = "verl_validation"
COMPUTE = "verl_compute.json"  # {step: FLOPs}, kept across a stop (verl's metrics file is rewritten on resume)


def validation_overrides(validator, run_dir: Path, engine_name: str) -> list[str]:
    """verl's validation settings for ``validator``: before training, every ``validator.every`` steps and the last,
    ``validator.n`` sampled responses per prompt at its temperature and top_p, generations dumped to
    ``run_dir/verl_validation``."""
    s = validator.settings
    R = "actor_rollout_ref.rollout.val_kwargs"
    return ["trainer.val_before_train=true", f"trainer.test_freq={int(validator.every)}",
            f"++trainer.validation_data_dir={Path(run_dir) / DUMPS}", f"{R}.n={int(validator.n)}",
            f"{R}.do_sample={'true' if float(s.temperature) > 0 else 'false'}", f"{R}.temperature={float(s.temperature)}",
            f"{R}.top_p={float(s.top_p)}", f"{R}.top_k={-1 if engine_name != 'hf' else 0}"]


def merge_overrides(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with the keys ``extra`` sets replaced by ``extra``'s (Hydra refuses a key given twice)."""
    def key(o: str) -> str:
        return o.split("=", 1)[0].lstrip("+")

    keys = {key(o) for o in extra}
    return [o for o in base if key(o) not in keys] + list(extra)


class VerlCompute:
    """Each step's ``train/flops`` from verl's metrics (``perf/total_num_tokens``: the step's prompt and response
    tokens; verl samples what it trains on, or more with its group filter, not counted), kept in
    ``run_dir/verl_compute.json``; ``before(k)``: the compute of the steps before ``k``, None until each is known."""

    def __init__(self, v: VerlSettings, run_dir: Path):
        from training.memory_plan import model_shape

        s = v.run
        self.model = ComputeModel(model_shape(s.model).n_params, s.lora.on, bool(v.engine.gradient_checkpointing),
                                  s.ppo_epochs)
        self.extra = 1 + int(bool(s.needs.reference) or s.terms.kl_beta > 0)  # old log-probs, the reference's pass
        self.path = Path(run_dir) / COMPUTE
        self.flops = {int(k): float(x) for k, x in json.loads(self.path.read_text()).items()} if self.path.is_file() else {}

    def add(self, metrics: dict, step: int) -> dict:
        """``metrics`` of 0-based ``step`` with ``train/flops`` added (when verl reported its tokens), recorded."""
        tokens = metrics.get("verl/perf/total_num_tokens")
        if tokens is not None:
            self.flops[int(step)] = self.model.flops_of_tokens(tokens, tokens, self.extra)
            self.path.write_text(json.dumps(self.flops))
            metrics = dict(metrics, **{"train/flops": self.flops[int(step)]})
        return metrics

    def before(self, k: int) -> float | None:
        if any(s not in self.flops for s in range(int(k))):
            return None
        return float(sum(self.flops[s] for s in range(int(k))))


class ReplaySampler:
    """The evaluation's sampler protocol over verl's dumped validation samples of one step: ``sample(prompts, n, ...)``
    returns, for each prompt (a row of the validation split, by its text), the ``n`` responses verl drew for it."""

    preferred_batch_prompts = 64
    supports_tools = True  # verl's agent loop ran the episodes; their text is replayed
    entropy_method = None

    def __init__(self, by_row: dict, split: list, tokenizer, max_new_tokens: int, name: str, precision: str):
        import collections

        self.by_row, self.tokenizer, self.max_new_tokens = by_row, tokenizer, int(max_new_tokens)
        self.rows_of: dict = collections.defaultdict(list)
        for i, r in enumerate(split):
            self.rows_of[str(r["prompt"])].append(i)
        self.name, self.precision = name, precision
        self.timings: collections.Counter = collections.Counter()

    def sample(self, prompts, n: int, seeds, settings, **_tools) -> list[list]:
        """verl's ``n`` responses for each prompt, as :class:`core.sampling.Sample` records.

        Raises:
            KeyError: verl's dump holds fewer than ``n`` responses for a prompt."""
        from core.sampling import Sample

        out, used = [], {}
        for p in prompts:
            rows = self.rows_of[str(p)]
            i = rows[used.get(str(p), 0) % len(rows)]
            used[str(p)] = used.get(str(p), 0) + 1
            texts = self.by_row[i][: int(n)]
            if len(texts) < int(n):
                raise KeyError(f"verl's validation dump has {len(texts)} responses for row {i}, not {n}")
            lengths = [len(self.tokenizer(t, add_special_tokens=False).input_ids) for t in texts]
            out.append([Sample(t, k, "length" if k >= self.max_new_tokens else "stop", None, None)
                        for t, k in zip(texts, lengths)])
        return out

    def close(self) -> None:
        return None


class VerlValidations:
    """Hands verl's complete validation dumps (``run_dir/verl_validation/<step>.jsonl`` with every row's ``n``
    samples) to ``validator`` in step order, once each, when the compute before them is known (:meth:`poll`)."""

    def __init__(self, v: VerlSettings, run_dir: Path, validator, model_path: str, compute: VerlCompute):
        from transformers import AutoTokenizer

        self.v, self.validator, self.compute = v, validator, compute
        self.dir = Path(run_dir) / DUMPS
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.done: set[int] = set()
        self.expected = len(validator.split) * int(validator.n)
        self.name = f"verl:{v.engine.rollout.name}"

    def _read(self, path: Path) -> dict | None:
        """{row index: responses} of a complete dump, or None while verl is still writing it."""
        try:
            lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        except (OSError, ValueError):
            return None
        if len(lines) < self.expected:
            return None
        by_row: dict = {}
        for rec in lines:
            by_row.setdefault(int(float(rec.get("row_index", -1))), []).append(str(rec["output"]))
        return by_row

    def poll(self) -> None:
        """Validate every dump that is complete and whose compute is known, in step order (a later one waits)."""
        if not self.dir.is_dir():
            return
        steps = sorted(int(p.stem) for p in self.dir.glob("*.jsonl") if p.stem.isdigit())
        for step in (s for s in steps if s not in self.done):
            before = self.compute.before(step)
            by_row = self._read(self.dir / f"{step}.jsonl")
            if before is None or by_row is None:
                return
            sampler = ReplaySampler(by_row, self.validator.split, self.tokenizer, self.v.run.max_new_tokens, self.name,
                                    self.v.run.rollout_dtype)
            self.validator(step, sampler, before)
            self.done.add(step)
