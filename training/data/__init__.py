"""Training prompt sets. Each loader returns rows ``{"id", "prompt", "gold"}``."""
from __future__ import annotations

from omegaconf import OmegaConf

from .arithmetic import arithmetic_splits, make_arithmetic  # noqa: F401


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
