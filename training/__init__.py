"""Training: rollouts, rewards, algorithms and engines.

``train(cfg, run_dir, log_metrics)`` runs the engine named by ``cfg.engine.name`` (:mod:`training.engines`).
"""
from __future__ import annotations


def train(cfg, run_dir, log_metrics=lambda metrics, step: None, logged_through: int = -1, choices=None,
          validator=None):
    """Train with the configured engine and return the checkpoint directory (Hugging Face format). ``choices``: an
    :class:`training.engines.EngineChoices` the engine fills with what it chose (left empty by an engine that does
    not take one); ``validator``: the validation inside the loop (:class:`training.engines.LoopValidation`), or
    None.

    Raises:
        KeyError: unknown engine name.
    """
    from .engines import EngineChoices, engine

    return engine(str(cfg.engine.name)).run(cfg, run_dir, log_metrics, logged_through,
                                            EngineChoices() if choices is None else choices, validator)
