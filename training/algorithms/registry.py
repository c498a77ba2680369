"""Name -> function registries for advantage estimators and policy losses.

The config names a function (``algo.advantage.name``, ``algo.policy_loss.name``); the
training engines look it up here, so no Python code branches on algorithm names.
"""
from __future__ import annotations

from typing import Callable, Dict

_ADVANTAGES: Dict[str, Callable] = {}
_POLICY_LOSSES: Dict[str, Callable] = {}
_VALIDATORS: Dict[tuple, Callable] = {}


def register_validator(kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(**params) -> list[str]`` that checks the parameters of the
    ``kind`` ('advantage' or 'policy_loss') function ``name`` before any work starts: it raises
    ``ValueError`` naming a bad value and returns warnings (strings) for legal but suspicious ones."""

    def deco(fn: Callable) -> Callable:
        _VALIDATORS[(kind, name)] = fn
        return fn

    return deco


def validate_params(kind: str, name: str, params: dict) -> list[str]:
    """Run the validator registered for (kind, name) on ``params``; [] when none is registered.

    Raises:
        ValueError: from the validator, naming the bad parameter.
    """
    fn = _VALIDATORS.get((kind, name))
    return list(fn(**params) or []) if fn else []


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name``.

    The estimator's signature is ``fn(batch: RolloutBatch, **params) -> (advantages, metrics)``
    with ``advantages`` of shape (B,) (one per response) or (B, L) (per token).

    Raises:
        ValueError: if ``name`` is already registered to another function.
    """

    def deco(fn: Callable) -> Callable:
        if name in _ADVANTAGES and _ADVANTAGES[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        _ADVANTAGES[name] = fn
        return fn

    return deco


def register_policy_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name``.

    The loss's signature is ``fn(logprobs (B, L), batch, advantages, **params) -> (loss, metrics)``
    where ``loss`` is a scalar tensor to minimise.

    Raises:
        ValueError: if ``name`` is already registered to another function.
    """

    def deco(fn: Callable) -> Callable:
        if name in _POLICY_LOSSES and _POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is registered twice")
        _POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_advantage_fn(name: str) -> Callable:
    """Return the advantage estimator registered as ``name``.

    Raises:
        KeyError: naming the unknown estimator and listing the registered ones.
    """
    try:
        return _ADVANTAGES[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; registered: {sorted(_ADVANTAGES)}"
        ) from None


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss registered as ``name``.

    Raises:
        KeyError: naming the unknown loss and listing the registered ones.
    """
    try:
        return _POLICY_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown policy loss {name!r}; registered: {sorted(_POLICY_LOSSES)}") from None


def registered_advantages() -> list[str]:
    """Names of all registered advantage estimators, sorted."""
    return sorted(_ADVANTAGES)


def registered_policy_losses() -> list[str]:
    """Names of all registered policy losses, sorted."""
    return sorted(_POLICY_LOSSES)
