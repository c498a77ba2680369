"""Training engines, registered by name (``engine=<name>``, ``sweeps/engine/<name>.yaml``).

An engine is a module that calls :func:`register_engine` with its name, and has
``train(cfg, run_dir, log_metrics, logged_through[, choices]) -> checkpoint folder`` (Hugging Face format;
intermediate ones in :func:`core.lifecycle.step_checkpoint_dir`), optionally ``validate(cfg) -> warnings`` (raises
ValueError naming a setting it cannot honour; pre-flight calls it), ``has_state(run_dir)`` and
``state_paths(run_dir)`` (a resumable state), ``memory_plan(cfg, remote)`` (pre-flight's plan and refusal) and
``CONFIG`` (``{"engine.<key>": Spec}``: the keys it reads, which the schema collects). :class:`Engine` is that
protocol as one typed record (:func:`engine`): what a module leaves out gets its documented default there, so no
caller probes a module. An engine whose ``train`` takes ``choices`` fills the :class:`EngineChoices` record it is
handed (the rollout sampler, the precision, the memory plan and layout, each with its reason) as it decides, so the
orchestrator has them whether the run returns, fails or is stopped; an engine written before this record (no
``choices`` parameter) keeps working, its runs untagged with them. An engine whose ``train`` takes ``validator`` (a
:class:`LoopValidation`) validates inside its loop, at :func:`validation_steps`, with its own rollout sampler. The modules of this folder are found by a folder
scan (:func:`core.plugins.discover`, sub-packages included: an engine may be a package of phases), others by the
``plugins`` config key: adding an engine is one module (or package) plus one YAML file.
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from core.plugins import Registry

ENGINES: Registry = Registry("engine", packages=(__name__,), subpackages=True)  # name -> engine module (or package)


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
        return engine(name).config
    except KeyError:
        return {}


@dataclass
class RolloutChoice:
    """The rollout sampler a run uses and why (``train.rollout.sampler``), ``auto``'s estimated sampling time
    (seconds; None when named), the calibration factor applied to it, whether on a GPU, and the sampling time measured
    when the run ends (the sampler's start and every step's generation, seconds)."""

    sampler: str
    reason: str
    estimate_s: float | None = None
    gpu: bool = False
    calibration: float | None = None
    measured_s: float | None = None


@dataclass
class PrecisionChoice:
    """The precision a run trains in (``train.precision`` resolved on its device), why, the device and the rollout
    engine's dtype."""

    precision: str
    reason: str
    device: str
    rollout_dtype: str


@dataclass
class EngineChoices:
    """What an engine chose for a run, handed to the orchestrator (which tags the run with it and logs ``memory`` as
    the run's ``memory.json`` artifact): ``rollout``, ``precision``, and ``memory`` (the memory plan, the scoring
    layout and its reason, the micro-batch budget, the trainable parameters, the start-up check's and the run's
    measured peaks: a JSON-ready dict). Empty parts: the engine chose nothing of that kind."""

    rollout: RolloutChoice | None = None
    precision: PrecisionChoice | None = None
    memory: dict = field(default_factory=dict)


def validation_steps(every: int, steps: int) -> list[int]:
    """The steps whose policy the validation along training evaluates (``train.validate_every = every``): 0 (the
    starting model), ``every``, ``2 * every``, ... and the last (``steps``); none when ``every`` is 0. A step counts
    the optimiser steps done: the policy of step k has trained k steps."""
    if not every:
        return []
    return sorted({0, int(steps)} | set(range(int(every), int(steps), int(every))))


class LoopValidation(Protocol):
    """The validation an engine runs inside its loop (docs/curves.md), handed to ``train`` by the orchestrator, which
    owns what it samples, scores and logs. ``every``: ``train.validate_every``.

    ``validator(step, sampler, compute_flops)`` evaluates the policy after ``step`` steps through ``sampler`` (a
    :class:`core.sampling.Sampler`: the engine's rollout sampler holding that policy) and logs it at ``step``, with
    ``compute_flops`` the training compute spent before it (FLOPs, :mod:`training.compute`); a step it logged before
    (a resumed run) is not sampled again. Returns a folder to keep this policy in (for ``eval.select_on=validation``:
    the engine saves it there, in Hugging Face format), or None. An engine that samples the validation itself (verl's
    own periodic validation) reads what to sample from ``split`` (the validation prompts' rows), ``n`` (samples per
    prompt) and ``settings`` (the decoding, :class:`core.sampling.SamplingSettings`), and hands the validator a
    sampler that replays its samples."""

    every: int
    split: list
    n: int
    settings: object

    def __call__(self, step: int, sampler, compute_flops: float) -> Path | None: ...


def _no_warnings(cfg) -> list[str]:
    return []


def _no_state(run_dir) -> bool:
    return False


def _no_paths(run_dir) -> list:
    return []


@dataclass(frozen=True)
class Engine:
    """An engine as the orchestrator uses it (:func:`engine`): its module's functions, or the defaults here where a
    module leaves one out (no warnings, no resumable state, no memory plan: ``memory_plan`` None)."""

    name: str
    module: object
    train: Callable
    validate: Callable = _no_warnings
    has_state: Callable = _no_state
    state_paths: Callable = _no_paths
    memory_plan: Callable | None = None
    config: dict = field(default_factory=dict)
    takes_choices: bool = False
    takes_validator: bool = False  # ``train(..., validator=)``: it validates inside its loop (:class:`LoopValidation`)

    @classmethod
    def of(cls, name: str, module) -> "Engine":
        """The record of engine module ``module`` (the one place a module's optional parts are looked up)."""
        parts = {k: getattr(module, k) for k in ("validate", "has_state", "state_paths", "memory_plan")
                 if callable(getattr(module, k, None))}
        try:
            params = inspect.signature(module.train).parameters
        except (TypeError, ValueError):
            params = {}
        return cls(name, module, module.train, config=dict(getattr(module, "CONFIG", {}) or {}),
                   takes_choices="choices" in params, takes_validator="validator" in params, **parts)

    def run(self, cfg, run_dir, log_metrics, logged_through: int, choices: EngineChoices,
            validator: LoopValidation | None = None):
        """``train`` with ``choices`` and ``validator`` handed in where the engine takes them. Returns the checkpoint
        folder.

        Raises:
            ValueError: a ``validator`` for an engine that does not validate inside its loop.
        """
        extra = {"choices": choices} if self.takes_choices else {}
        if validator is not None:
            if not self.takes_validator:
                raise ValueError(f"engine={self.name}: train.validate_every needs an engine that validates inside "
                                 "its loop (its train takes validator)")
            extra["validator"] = validator
        return self.train(cfg, run_dir, log_metrics, logged_through=logged_through, **extra)


def engine(name: str) -> Engine:
    """Engine ``name`` as a typed record (:class:`Engine`).

    Raises:
        KeyError: naming the unknown engine and listing the available ones, or a module without ``train``.
    """
    return Engine.of(name, get_engine(name))
