"""Name -> function registries for advantage estimators and policy losses.

The config names a function (``algo.advantage.name``, ``algo.policy_loss.name``); the
training engines look it up here, so no Python code branches on algorithm names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as replace_
from typing import Callable, Mapping

from core.plugins import Registry

# what a registered function may declare it needs: batch fields beyond rewards and groups, and ``generator``: a
# torch.Generator for its random draws (passed as ``generator=``), seeded by the engine for each step, so that a draw
# never depends on torch's global generator (which another thread, such as a checkpointed backward pass, may reset)
BATCH_FIELDS = ("old_logprobs", "ref_logprobs", "generator")


@dataclass(frozen=True)
class AlgorithmSpec:
    """One registered advantage estimator or policy loss and everything it declares, in one record (the way every
    plug-in kind is declared: tasks, samplers, metric tables, report sections, engines).

    Attributes:
        kind: ``advantage`` or ``policy_loss``.
        name: the name the config uses (``algo.<kind>.name``).
        fn: the function (its keyword arguments are its YAML keys).
        needs: {batch field: why} it reads beyond rewards and groups (``why`` or ``(why, param)``: only when that
            parameter is set); an engine supplies them or refuses it (:func:`needs_of`).
        panels: training metrics of its own the report plots per step (:func:`panel_metrics`).
        couples_rows: (policy losses) why it reads other responses' log-probs (None: it does not;
            :func:`register_policy_loss`).
        validator: ``fn(**params) -> list[str]`` checking its parameters at pre-flight (:func:`register_validator`).
    """

    kind: str
    name: str
    fn: Callable
    needs: Mapping = field(default_factory=dict)
    panels: tuple = ()
    couples_rows: str | None = None
    validator: Callable | None = None


# the modules of this folder register on import (folder scan: core.plugins.discover); plug-ins via ``plugins``
_SPECS: dict[str, Registry] = {
    "advantage": Registry("advantage estimator", packages=("training.algorithms",)),
    "policy_loss": Registry("policy loss", packages=("training.algorithms",)),
}
_ADVANTAGES, _POLICY_LOSSES = _SPECS["advantage"], _SPECS["policy_loss"]
_EARLY: dict = {}  # (kind, name) -> a validator registered before its function (it joins the spec then)


def _register(spec: AlgorithmSpec, replace: bool = False) -> AlgorithmSpec:
    """Register ``spec`` in its kind's registry (its origin is its function's, so another module's function under the
    same name is refused)."""
    if spec.validator is None and (spec.kind, spec.name) in _EARLY:
        spec = replace_(spec, validator=_EARLY.pop((spec.kind, spec.name)))
    object.__setattr__(spec, "__module__", getattr(spec.fn, "__module__", __name__))
    object.__setattr__(spec, "__qualname__", getattr(spec.fn, "__qualname__", spec.name))
    return _SPECS[spec.kind].register(spec.name, spec, replace=replace)


def spec_of(kind: str, name: str) -> AlgorithmSpec:
    """The :class:`AlgorithmSpec` registered as ``name`` of ``kind`` (``advantage`` or ``policy_loss``).

    Raises:
        KeyError: naming the unknown function and listing the registered ones.
    """
    return _SPECS[kind].get(name)


def register_validator(kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator registering ``fn(**params) -> list[str]`` that checks the parameters of the
    ``kind`` ('advantage' or 'policy_loss') function ``name`` before any work starts: it raises
    ``ValueError`` naming a bad value and returns warnings (strings) for legal but suspicious ones. It becomes the
    function's :attr:`AlgorithmSpec.validator` (registered before its function, it joins the spec then)."""

    def deco(fn: Callable) -> Callable:
        registry = _SPECS[kind]
        if name in registry._items:
            _register(replace_(registry._items[name], validator=fn), replace=True)
        else:
            _EARLY[(kind, name)] = fn
        return fn

    return deco


def validate_params(kind: str, name: str, params: dict, context: dict | None = None) -> list[str]:
    """Run the validator registered for (kind, name) on ``params``; [] when none is registered.

    Args:
        context: run settings a validator may read beside its own parameters (``group_size``), passed
            to validators that declare a ``context`` parameter.
    Raises:
        ValueError: from the validator, naming the bad parameter.
    """
    import inspect

    fn = spec_of(kind, name).validator if name in _SPECS[kind] else _EARLY.get((kind, name))
    if fn is None:
        return []
    extra = {"context": dict(context or {})} if "context" in inspect.signature(fn).parameters else {}
    return list(fn(**params, **extra) or [])


def _check_needs(kind: str, name: str, needs: dict) -> dict:
    bad = [k for k in needs if k not in BATCH_FIELDS]
    if bad:
        raise ValueError(f"{kind} {name!r}: unknown needs {bad}; declarable: {list(BATCH_FIELDS)}")
    return dict(needs)


def register_advantage(name: str, needs: dict | None = None, panels: tuple = ()) -> Callable[[Callable], Callable]:
    """Decorator registering an advantage estimator under ``name`` (its :class:`AlgorithmSpec`).

    The estimator's signature is ``fn(batch: RolloutBatch, **params) -> (advantages, metrics)``
    with ``advantages`` of shape (B,) (one per response) or (B, L) (per token).

    Args:
        needs: batch fields it reads beyond rewards and groups, each with the reason, e.g.
            ``{"old_logprobs": "its surprisal classes"}`` (or ``(reason, param)``: only when that parameter is
            set); an engine supplies them or refuses the estimator (:func:`needs_of`).
        panels: training metrics of its own (``train/<key>`` of its metrics) the report plots per step
            (:func:`panel_metrics`).
    Raises:
        ValueError: if ``name`` is already registered to another function, or an unknown need.
    """
    declared = _check_needs("advantage", name, needs or {})

    def deco(fn: Callable) -> Callable:
        _register(AlgorithmSpec("advantage", name, fn, declared, tuple(panels)))  # ValueError: another function
        return fn

    return deco


def register_policy_loss(name: str, needs: dict | None = None, couples_rows: str | None = None,
                         panels: tuple = ()) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under ``name`` (its :class:`AlgorithmSpec`).

    The loss's signature is ``fn(logprobs (B, L), batch, advantages, **params) -> (loss, metrics)``
    where ``loss`` is a scalar tensor to minimise. Every loss reads ``old_logprobs`` (the importance ratio);
    ``needs`` declares more (``ref_logprobs`` for a KL term inside the loss), with the reason.

    Micro-batches: a loss whose only reduction across responses is
    :func:`training.algorithms.aggregation.agg_loss` is split exactly (the trainer sets the whole minibatch's
    normalisers, :func:`~training.algorithms.aggregation.over_minibatch`). A loss that reads other responses'
    log-probs (a group statistic of the current policy, say) declares ``couples_rows`` (why); the trainer then
    scores the minibatch without gradients, takes the loss's gradient with respect to its log-probs over the whole
    minibatch, and back-propagates it micro-batch by micro-batch: exact too, one more forward pass.
    ``panels``: training metrics of its own the report plots per step (:func:`panel_metrics`).

    Raises:
        ValueError: if ``name`` is already registered to another function, or an unknown need.
    """
    declared = _check_needs("policy loss", name, needs or {})

    def deco(fn: Callable) -> Callable:
        _register(AlgorithmSpec("policy_loss", name, fn, declared, tuple(panels),
                                str(couples_rows) if couples_rows else None))
        return fn

    return deco


def couples_rows(name: str) -> str | None:
    """Why the registered policy loss ``name`` couples responses beyond its aggregation's normalisers (None: it
    does not; see :func:`register_policy_loss`).

    Raises:
        KeyError: an unknown loss.
    """
    return spec_of("policy_loss", name).couples_rows


def panel_metrics() -> list[str]:
    """The training metrics the registered estimators and losses declared for the report's per-step panels
    (``panels=``), each once, in registration order (the suite's own after its folder scan, then plug-ins')."""
    return list(dict.fromkeys(k for kind in ("advantage", "policy_loss") for spec in _SPECS[kind].values()
                              for k in spec.panels))


def _declared(kind: str, name: str) -> Mapping:
    """The needs ``name`` of ``kind`` declared ({} for a name not registered)."""
    return spec_of(kind, name).needs if name in _SPECS[kind] else {}


def need_param(kind: str, name: str, field: str) -> str | None:
    """The parameter a declared need depends on (``kl_beta`` for TR-GRPO's ``ref_logprobs``), or None."""
    why = _declared(kind, name).get(field)
    return why[1] if isinstance(why, tuple) else None


def needs_of(kind: str, name: str, params: dict | None = None) -> dict:
    """{batch field: why} that the registered ``kind`` (``advantage`` or ``policy_loss``) function ``name``
    declared it needs with these ``params`` ({} when none). A need declared as ``(why, param)`` counts only when
    ``params[param]`` is set and non-zero (TR-GRPO's reference log-probs, only with its KL term)."""
    out = {}
    on = (params or {}).get("base_estimator") if kind == "advantage" else None
    if on and on != name and on in _ADVANTAGES:  # a shaping estimator (exppo) needs its base's too
        out.update(needs_of("advantage", on, base_params(name, params)[1]))
    for need, why in _declared(kind, name).items():
        if isinstance(why, tuple):
            why, param = why
            if not (params or {}).get(param):
                continue
        out[need] = why
    return out


def get_advantage_fn(name: str) -> Callable:
    """Return the advantage estimator registered as ``name``.

    Raises:
        KeyError: naming the unknown estimator and listing the registered ones.
    """
    return spec_of("advantage", name).fn


def get_policy_loss_fn(name: str) -> Callable:
    """Return the policy loss registered as ``name``.

    Raises:
        KeyError: naming the unknown loss and listing the registered ones.
    """
    return spec_of("policy_loss", name).fn


@dataclass(frozen=True)
class BoundLoss:
    """A registered policy loss bound once to its parameters (the YAML keys of ``algo.policy_loss``): what the update
    calls, function and parameters travelling together. ``loss(logprobs, batch, advantages)`` is
    ``fn(logprobs, batch, advantages, **params)`` -> (loss, metrics dict).

    Attributes:
        fn: the registered loss (:func:`get_policy_loss_fn`).
        params: its keyword arguments.
    """

    fn: Callable
    params: dict = field(default_factory=dict)

    @classmethod
    def named(cls, name: str, params: dict | None = None) -> BoundLoss:
        """The loss registered as ``name`` with ``params``.

        Raises:
            KeyError: naming the unknown loss and listing the registered ones.
        """
        return cls(get_policy_loss_fn(name), dict(params or {}))

    def __call__(self, logprobs, batch, advantages):
        return self.fn(logprobs, batch, advantages, **self.params)

    @property
    def agg_mode(self) -> str:
        """How the loss aggregates over tokens (``loss_agg_mode``; the KL and entropy terms follow it)."""
        return self.params.get("loss_agg_mode", "token-mean")

    @property
    def norm_constant(self):
        """``seq-mean-token-sum-norm``'s constant when the loss sets one, else None."""
        return self.params.get("norm_constant")


def registered_advantages() -> list[str]:
    """Names of all registered advantage estimators, sorted."""
    return _ADVANTAGES.names()


def registered_policy_losses() -> list[str]:
    """Names of all registered policy losses, sorted."""
    return _POLICY_LOSSES.names()


def base_params(name: str, params: dict) -> tuple[dict, dict]:
    """Split an advantage estimator's config parameters into (its own, its base estimator's). An estimator that
    shapes another one's advantages (ExPPO with ``base_estimator: grpo``) declares ``base_estimator`` and ``**base``: the keys its
    signature does not name belong to the estimator named by ``base_estimator`` (so ``algo=dapo`` with ``advantage.name=exppo``
    and ``advantage.base_estimator=grpo`` hands DAPO's ``norm_by_std`` to GRPO). Without ``base_estimator``: (params, {})."""
    import inspect

    params = dict(params or {})
    fn = get_advantage_fn(name) if name in _ADVANTAGES else None
    if fn is None or not params.get("base_estimator"):
        return params, {}
    sig = inspect.signature(fn).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.values()):
        return params, {}
    own = {k: v for k, v in params.items() if k in sig}
    return own, {k: v for k, v in params.items() if k not in sig}


def _check_signature(kind: str, fn, params: dict) -> None:
    """``params`` are the parameters ``fn`` (a registered estimator or loss) accepts, and every parameter it requires
    (a shaping estimator's ``base_estimator`` gets the keys its signature does not take).

    Raises:
        ValueError: one line naming ``algo.<kind>`` and the unknown or missing parameters.
    """
    import inspect

    sig = inspect.signature(fn)
    skip = 3 if kind == "policy_loss" else 1  # (logprobs, batch, advantages) or (batch)
    names = [p for p, v in sig.parameters.items() if v.kind is not inspect.Parameter.VAR_KEYWORD][skip:]
    if kind == "advantage" and params.get("base_estimator") and len(names) < len(sig.parameters) - 1:  # shaping another estimator
        try:
            base_fn = get_advantage_fn(params["base_estimator"])
        except KeyError as e:
            raise ValueError(f"algo.advantage.base_estimator={params['base_estimator']!r}: {e.args[0]}") from None
        _check_signature(kind, base_fn, {k: v for k, v in params.items() if k not in names})  # the base's own keys
        params = {k: v for k, v in params.items() if k in names}
    unknown = [k for k in params if k not in names]
    if unknown:
        raise ValueError(f"algo.{kind}: unknown parameter(s) {unknown} for {fn.__name__}; accepted: {names}")
    missing = [p.name for p in list(sig.parameters.values())[skip:]
               if p.default is inspect.Parameter.empty and p.name not in params
               and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
    if missing:
        raise ValueError(f"algo.{kind}: missing parameter(s) {missing} for {fn.__name__}")


def _policy_can_change(name: str, params: dict, group_size) -> None:
    """Refuse a group of one response per prompt when the estimator ``name`` gives every such response advantage 0
    (measured: the estimator run on four groups of one with rewards 1, 0, 1, 0): the loss gradient is then 0 at every
    step and the policy never moves. An estimator that does not centre on its group passes.

    Raises:
        ValueError: naming ``train.group_size``.
    """
    if group_size != 1:
        return
    import torch

    from training.batch import RolloutBatch

    B, L = 4, 3
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, L, generator=g) * 3
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    batch = RolloutBatch(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                         response_ids=torch.ones(B, L, dtype=torch.long), response_mask=torch.ones(B, L),
                         old_logprobs=old, rewards=rewards, group_index=torch.arange(B),
                         response_lengths=torch.full((B,), L), ref_logprobs=old.clone(), correct=rewards > 0)
    try:
        adv, _ = get_advantage_fn(name)(batch, **params)
    except Exception:  # an estimator that cannot run on this batch is not judged here
        return
    if bool(torch.all(torch.as_tensor(adv) == 0)):
        raise ValueError(f"train.group_size=1: {name}'s advantages are all 0 in a group of one response per prompt, "
                         "so the policy never changes; use train.group_size >= 2")


def check_algorithm(algo: dict, group_size=None, max_new_tokens: int | None = None) -> list[str]:
    """The algorithm's own checks, before any work: its estimator and loss are registered, accept the configured
    parameters (their signatures) and pass their registered validators (:func:`validate_params`), the estimator
    can move the policy at ``group_size`` (``train.group_size``), and DAPO's overlong buffer, when on, fits within
    the response length ``max_new_tokens`` (``train.max_new_tokens``;
    :meth:`training.rewards.OverlongShaping.buffer_length`).

    Args:
        algo: the ``algo`` group as a plain dict (``advantage`` and ``policy_loss`` nodes with ``name``).
    Returns:
        The validators' warnings.
    Raises:
        ValueError: one line naming the key.
    """
    warnings: list[str] = []
    for kind, getter in (("advantage", get_advantage_fn), ("policy_loss", get_policy_loss_fn)):
        node = algo.get(kind)
        if not (node is not None and node.get("name")):
            raise ValueError(f"algo.{kind}.name is missing (algo={algo.get('name')!r})")
        try:
            fn = getter(node["name"])
        except KeyError as e:
            raise ValueError(f"algo.{kind}.name={node['name']!r}: {e.args[0]}") from None
        params = {k: v for k, v in node.items() if k != "name"}
        _check_signature(kind, fn, params)
        try:
            warnings += validate_params(kind, node["name"], params, context={"group_size": group_size})
        except ValueError as e:
            raise ValueError(f"algo.{kind} ({node['name']}): {e}") from None
    adv = algo["advantage"]
    _policy_can_change(str(adv["name"]), {k: v for k, v in adv.items() if k != "name"}, group_size)
    from training.rewards import OverlongShaping

    over = OverlongShaping.of(algo.get("overlong_buffer"))
    if over.enabled and max_new_tokens is not None:  # its length within the response length
        over.buffer_length(int(max_new_tokens))  # ValueError naming the bad key and value
    return warnings
