"""Training engines, registered by name (``engine=<name>``, ``sweeps/engine/<name>.yaml``).

An engine is a module with ``train(cfg, run_dir, log_metrics, logged_through) -> checkpoint folder`` (Hugging
Face format; intermediate ones in :func:`core.lifecycle.step_checkpoint_dir`) and, optionally,
``validate(cfg) -> warnings`` (raises ValueError naming a setting it cannot honour; pre-flight calls it).
``engine=<name>`` finds the module registered under that name, else ``training.engines.<name>`` itself, so
adding an engine is one module plus one YAML file (or ``register_engine`` from a plugin module).
"""
from __future__ import annotations

import importlib
import pkgutil

ENGINES: dict[str, str] = {}  # name -> module path
HELPERS = {"verl_main", "verl_reward", "verl_platform", "verl_search_tool"}  # modules of this package that are not engines


def register_engine(name: str, module: str) -> None:
    """Register the engine module ``module`` (an import path) as ``engine=name``."""
    ENGINES[name] = module


def available() -> list[str]:
    """Engine names: the registered ones and the modules of this package."""
    here = [m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and m.name not in HELPERS]
    return sorted(set(ENGINES) | set(here))


def get_engine(name: str):
    """The engine module for ``engine=name``.

    Raises:
        KeyError: naming the unknown engine and listing the available ones.
    """
    if name not in available():
        raise KeyError(f"engine={name!r}: available engines: {available()}")
    module = importlib.import_module(ENGINES.get(name, f"{__name__}.{name}"))
    if not callable(getattr(module, "train", None)):
        raise KeyError(f"engine={name!r}: module {module.__name__} has no train(cfg, run_dir, log_metrics, logged_through)")
    return module
