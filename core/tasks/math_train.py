"""The MATH training set (Hendrycks et al. 2021; 7,500 problems), the QUATRO paper's training data.

``source=hub`` loads it with ``datasets.load_dataset`` (for users with network access);
``source=local`` reads a JSONL file of MATH-style records (``problem`` plus ``answer`` or a
``solution`` with a final ``\\boxed{}``), which is how tests and offline clusters use it. Both go
through the benchmark row normaliser of :mod:`core.tasks.math`, so gold answers are parsed
exactly as in evaluation. Registered as the task ``math`` (``data=math``; its ``n_eval`` held-out rows are
the benchmark ``math``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from pathlib import Path

from core.config_keys import I, L, S

from .base import HUB_KEYS, read_jsonl, register_task
from .math import MathScored, rows_from_records

DEFAULT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


@dataclass(frozen=True)
class MathData:
    """Where MATH-style training data comes from and which rows a run takes (the task's ``data.*`` keys).

    Attributes:
        source: ``hub`` (``datasets.load_dataset(hub_path, hub_config, split=hub_split)``; with
            ``hub_path="json"`` and ``data_files=...`` in ``load_kwargs`` it reads local files through the same
            code) or ``local`` (a JSONL file, or one JSON array, at ``path``).
        levels: keep only these difficulty levels (1-5; records with a ``level`` field such as "Level 3").
        max_prompts: keep at most this many training rows (after shuffling).
        seed: the shuffle's seed; n_eval: hold the first ``n_eval`` shuffled rows out of training.
        template: prompt text with a ``{problem}`` field.
        load_kwargs: further arguments of ``datasets.load_dataset`` (``data_files``...).
    """

    source: str = "hub"
    path: str | None = None
    hub_path: str = "DigitalLearningGmbH/MATH-lighteval"
    hub_config: str | None = "default"
    hub_split: str = "train"
    levels: object = None
    max_prompts: int | None = None
    seed: int = 0
    n_eval: int = 0
    template: str = DEFAULT_TEMPLATE
    load_kwargs: dict = field(default_factory=dict)

    @classmethod
    def of(cls, **keys) -> "MathData":
        """The record of the ``data.*`` keys given (the task's config, ``name`` aside): keys that are not fields go
        to ``load_kwargs``."""
        names = {f.name for f in fields(cls)} - {"load_kwargs"}
        return cls(**{k: v for k, v in keys.items() if k in names},
                   load_kwargs={k: v for k, v in keys.items() if k not in names and k != "name"})


def load_math_train(data: MathData, normalise=None) -> tuple[list[dict], list[dict]]:
    """MATH training prompts, shuffled by ``data.seed``, as (train rows, held-out rows).

    Args:
        data: where the records come from and which rows to take (:class:`MathData`).
        normalise: ``normalise(records, where) -> records`` turning a data set's own record format into MATH-style
            records (``problem``, ``answer``) before parsing; None for MATH-style records (ORZ: :func:`orz_records`).
    Returns:
        Rows ``{"id", "prompt", "gold", "level"}``.
    Raises:
        ValueError: unknown source, a template without ``{problem}``, a record without problem or answer,
            no rows left after filtering.
        FileNotFoundError: ``source=local`` and ``path`` is missing.
    """
    source, path, template, levels, n_eval = data.source, data.path, data.template, data.levels, data.n_eval
    if "{problem}" not in template:
        raise ValueError(f"data.template={template!r}: must contain {{problem}}")
    if source == "local":
        if not path:
            raise ValueError("data.source=local needs data.path (a JSONL file of MATH records)")
        if not Path(path).is_file():
            raise FileNotFoundError(f"data.path={str(path)!r}: file does not exist")
        if str(path).endswith(".json"):  # one JSON array (ORZ's release file) instead of JSON lines
            import json

            try:
                records = json.loads(Path(path).read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"data.path={str(path)!r}: not valid JSON ({e})") from None
            if not isinstance(records, list):
                raise ValueError(f"data.path={str(path)!r}: expected a JSON array of records")
        else:
            records = read_jsonl(path)
        where = str(path)
    elif source == "hub":
        from datasets import load_dataset

        records = list(load_dataset(data.hub_path, data.hub_config, split=data.hub_split, **data.load_kwargs))
        where = f"{data.hub_path}[{data.hub_split}]"
    else:
        raise ValueError(f"data.source={source!r}: expected 'hub' or 'local'")
    if normalise is not None:
        records = normalise(records, where)
    rows = rows_from_records(records, where)
    for row, rec in zip(rows, records):
        lv = str(rec.get("level", "")).replace("Level", "").strip()
        row["level"] = int(lv) if lv.isdigit() else None
        row["prompt"] = template.replace("{{}}", "{}").replace("{problem}", row["prompt"])
    if levels:
        keep = {int(x) for x in levels}
        rows = [r for r in rows if r["level"] in keep]
    random.Random(data.seed).shuffle(rows)
    held_out, train = rows[: int(n_eval)], rows[int(n_eval):]
    if data.max_prompts:
        train = train[: int(data.max_prompts)]
    if not train:
        raise ValueError(f"data: no MATH training rows left from {where} (levels={levels}, n_eval={n_eval})")
    return train, held_out


def orz_records(records: list, where: str) -> list[dict]:
    """Open-Reasoner-Zero's release format -> MATH-style records. Each record is a two-turn conversation,
    ``[{"from": "human", "value": <problem>}, {"from": "assistant", "ground_truth": {"value": <answer>}}]`` (a
    list, or a mapping with the turns under ``conversations``); records already MATH-style (``problem``,
    ``answer``) pass as they are.

    Raises:
        ValueError: a record in neither form, naming its place.
    """
    out = []
    for i, rec in enumerate(records):
        if isinstance(rec, dict) and "problem" in rec:
            out.append(rec)
            continue
        turns = rec.get("conversations") if isinstance(rec, dict) else rec
        try:
            human = next(t for t in turns if t.get("from") in ("human", "user"))
            reply = next(t for t in turns if t.get("from") in ("assistant", "gpt"))
            truth = reply["ground_truth"]
            answer = truth.get("value") if isinstance(truth, dict) else truth
            out.append({"problem": human["value"], "answer": str(answer)})
        except (StopIteration, KeyError, TypeError, AttributeError):
            raise ValueError(f"{where}: record {i + 1} is neither an ORZ conversation (human value, assistant "
                             "ground_truth.value) nor a record with problem and answer") from None
    return out


@register_task
class MathTrain(MathScored):
    """The MATH training set as a task: ``load("train" | "eval", data_cfg)`` (see :func:`load_math_train`)."""

    name = "math"
    config = {**HUB_KEYS, "levels": L(I(1, 5), null=True), "template": S()}
    heldout_from_data = True
    normalise = None  # records -> MATH-style records (data sets in another format)

    def load(self, split: str, cfg) -> list[dict]:
        from omegaconf import OmegaConf

        params = {k: v for k, v in (OmegaConf.to_container(cfg, resolve=True) if not isinstance(cfg, dict)
                                    else dict(cfg)).items() if k != "name"}
        train, held_out = load_math_train(MathData.of(**params), normalise=type(self).normalise)
        rows = train if split == "train" else held_out
        return [dict(r, task=self.name) for r in rows]

    def validate(self, cfg, role: str) -> None:
        if role != "data":
            return
        if cfg.get("source") not in ("hub", "local"):
            raise ValueError(f"data.source={cfg.get('source')!r}: expected 'hub' or 'local'")
        if cfg.get("source") == "local" and (not cfg.get("path") or not Path(str(cfg.path)).is_file()):
            raise ValueError(f"data.path={cfg.get('path')!r}: data.source=local needs an existing JSONL file")
        if "{problem}" not in str(cfg.get("template", "")):
            raise ValueError(f"data.template={cfg.get('template')!r}: must contain {{problem}}")
        n_eval, cap, levels = cfg.get("n_eval", 0), cfg.get("max_prompts"), cfg.get("levels")
        if not isinstance(n_eval, int) or n_eval < 0:
            raise ValueError(f"data.n_eval={n_eval!r}: expected an integer >= 0")
        if cap is not None and (not isinstance(cap, int) or cap < 1):
            raise ValueError(f"data.max_prompts={cap!r}: expected null or an integer >= 1")
        if levels is not None:
            if isinstance(levels, str) or not hasattr(levels, "__len__"):
                raise ValueError(f"data.levels={levels!r}: expected a list of levels 1-5, e.g. [3, 4, 5]")
            bad = [lv for lv in levels if not isinstance(lv, int) or not 1 <= lv <= 5]
            if bad:
                raise ValueError(f"data.levels={list(levels)}: MATH levels are integers 1-5; bad: {bad}")


@register_task
class DSRUniform(MathTrain):
    """DSR-Uniform (TR-GRPO's Table 2 training set, about 10k problems): a uniform draw from DeepScaleR's 40k
    competition problems (``agentica-org/DeepScaleR-Preview-Dataset``: ``problem``, ``answer``, ``solution``).
    The issue gives no rule for the draw: ``max_prompts`` problems after the seeded shuffle (RECONSTRUCTED)."""

    name = "dsr_uniform"


@register_task
class ORZ(MathTrain):
    """Open-Reasoner-Zero's 57k math collection (TR-GRPO's Table 2), in its release format (:func:`orz_records`)."""

    name = "orz"
    normalise = staticmethod(orz_records)
