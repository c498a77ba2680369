"""Training: rollouts, rewards, algorithms and engines.

``train(cfg, run_dir, log_metrics)`` runs the engine named by ``cfg.engine.name``.
"""
from __future__ import annotations


def train(cfg, run_dir, log_metrics=lambda metrics, step: None, logged_through: int = -1):
    """Train with the configured engine and return the checkpoint directory (Hugging Face format).

    Raises:
        ValueError: unknown engine name.
    """
    name = cfg.engine.name
    if name == "local":
        from .engines.local import train as local_train

        return local_train(cfg, run_dir, log_metrics, logged_through=logged_through)
    if name == "verl":
        from .engines.verl import train as verl_train

        return verl_train(cfg, run_dir, log_metrics, logged_through=logged_through)
    raise ValueError(f"engine={name!r}: available engines: ['local', 'verl']")
