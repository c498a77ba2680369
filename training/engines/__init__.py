"""Training engines, registered by name (``engine=<name>``, ``sweeps/engine/<name>.yaml``).

An engine is a module that calls :func:`register_engine` with its name, and has
``train(cfg, run_dir, log_metrics, logged_through) -> checkpoint folder`` (Hugging Face format; intermediate ones in
:func:`core.lifecycle.step_checkpoint_dir`), optionally ``validate(cfg) -> warnings`` (raises ValueError naming a
setting it cannot honour; pre-flight calls it) and ``CONFIG`` (``{"engine.<key>": Spec}``: the keys it reads, which
the schema collects). The modules of this folder are found by a folder scan (:func:`core.registry.discover`; parts
that are not engines live in sub-packages), others by the ``plugins`` config key: adding an engine is one module
plus one YAML file.
"""
from __future__ import annotations

import sys

from core.registry import Registry

ENGINES: Registry = Registry("engine", packages=(__name__,))  # name -> engine module


def register_engine(name: str, module: str | None = None) -> None:
    """Register an engine module as ``engine=name``: ``module`` is the module itself or its import path (default:
    the calling module, so an engine module calls ``register_engine("myengine")`` at its top level)."""
    if module is None:
        module = sys._getframe(1).f_globals["__name__"]
    ENGINES.register(name, sys.modules[module] if isinstance(module, str) and module in sys.modules else module,
                     replace=True)


def available() -> list[str]:
    """Registered engine names (the folder's and the plug-ins' imported so far)."""
    return ENGINES.names()


def get_engine(name: str):
    """The engine module for ``engine=name``.

    Raises:
        KeyError: naming the unknown engine and listing the available ones.
    """
    import importlib

    if name not in ENGINES:
        raise KeyError(f"engine={name!r}: available engines: {available()}")
    module = ENGINES.get(name)
    if isinstance(module, str):
        module = importlib.import_module(module)
    if not callable(getattr(module, "train", None)):
        raise KeyError(f"engine={name!r}: module {module.__name__} has no train(cfg, run_dir, log_metrics, logged_through)")
    return module


def engine_config(name: str) -> dict:
    """The keys engine ``name`` declares (``{"engine.<key>": Spec}``); {} for an unknown engine or none declared."""
    try:
        return dict(getattr(get_engine(name), "CONFIG", {}) or {})
    except KeyError:
        return {}
