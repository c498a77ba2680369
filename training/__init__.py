"""Training: rollouts, rewards, algorithms and engines.

``train(cfg, run_dir, log_metrics)`` runs the engine named by ``cfg.engine.name`` (:mod:`training.engines`).
"""
from __future__ import annotations


def train(cfg, run_dir, log_metrics=lambda metrics, step: None, logged_through: int = -1):
    """Train with the configured engine and return the checkpoint directory (Hugging Face format).

    Raises:
        KeyError: unknown engine name.
    """
    from .engines import get_engine

    return get_engine(str(cfg.engine.name)).train(cfg, run_dir, log_metrics, logged_through=logged_through)
