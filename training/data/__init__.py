"""Training prompt sets. Each loader returns rows ``{"id", "prompt", "gold"}``."""
from __future__ import annotations

from omegaconf import OmegaConf

from .arithmetic import arithmetic_splits, make_arithmetic  # noqa: F401


def check_data_config(cfg) -> None:
    """Check a ``data`` config before any work starts (cheap: no generation, no download).

    Raises:
        ValueError: naming the key and the bad value.
    """
    name = cfg.get("name")
    if name == "kk":
        from .knights_knaves import MAX_PEOPLE, MIN_PEOPLE

        for key in ("train_sizes", "eval_sizes"):
            raw = cfg.get(key)
            if not isinstance(raw, (list, tuple)) and not hasattr(raw, "__len__") or isinstance(raw, str):
                raise ValueError(f"data.{key}={raw!r}: expected a list, e.g. data.{key}=[{raw}]")
            sizes = list(raw or [])
            if len(set(sizes)) != len(sizes):
                raise ValueError(f"data.{key}={sizes}: a size appears twice")
            bad = [n for n in sizes if not isinstance(n, int) or not MIN_PEOPLE <= n <= MAX_PEOPLE]
            if not sizes or bad:
                raise ValueError(f"data.{key}={sizes}: people per puzzle must be integers in "
                                 f"[{MIN_PEOPLE}, {MAX_PEOPLE}]; bad: n_people={bad[0] if bad else None}")
        for key in ("train_per_size", "eval_per_size"):
            v = cfg.get(key)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"data.{key}={v!r}: expected an integer >= 1")
    elif name == "math":
        if cfg.get("source") not in ("hub", "local"):
            raise ValueError(f"data.source={cfg.get('source')!r}: expected 'hub' or 'local'")
        if cfg.get("source") == "local":
            from pathlib import Path

            if not cfg.get("path") or not Path(str(cfg.path)).is_file():
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


def load_prompts(cfg, split: str) -> list[dict]:
    """Rows of the prompt set named by ``cfg.name`` for ``split`` ('train' or 'eval').

    Raises:
        ValueError: unknown data set name or split.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split={split!r}: expected 'train' or 'eval'")
    if cfg.name == "arithmetic":
        train, held_out = arithmetic_splits(
            difficulty=int(cfg.difficulty), operations=list(cfg.operations), seed=int(cfg.seed),
            n_eval=int(cfg.n_eval), template=str(cfg.template),
        )
        return train if split == "train" else held_out
    if cfg.name == "math":
        from .math import load_math_train

        params = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "name"}
        train, held_out = load_math_train(**params)
        return train if split == "train" else held_out
    if cfg.name == "kk":
        from .knights_knaves import kk_splits

        train, held_out = kk_splits(train_sizes=list(cfg.train_sizes), eval_sizes=list(cfg.eval_sizes),
                                    train_per_size=int(cfg.train_per_size), eval_per_size=int(cfg.eval_per_size),
                                    seed=int(cfg.seed))
        return train if split == "train" else held_out
    raise ValueError(f"unknown data set {cfg.name!r}; available: ['arithmetic', 'math', 'kk']")
