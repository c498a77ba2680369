"""A local run's settings, typed and built once from the validated config (:meth:`RunSettings.of`).

The defaults live in the YAML (``sweeps/config.yaml``: every ``train.*`` key the local engine reads is there, so it
is read here without a fallback: a missing key is a config that did not come from the composed tree and fails
loudly) and, for the algorithm's optional subtrees that most algorithms leave out (``algo.dynamic_sampling``,
``algo.overlong_buffer``, ``algo.kl_beta``, ``algo.entropy_coef``), in the field defaults of the typed records below:
one place each. The schema (``orchestrator/checks/schema.py``) has already checked every value's type and range.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from omegaconf import DictConfig, OmegaConf


def _plain(node) -> dict:
    """A config node as a plain dict (resolved); {} for None."""
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node)


def _record(cls, node):
    """``cls`` built from the keys of ``node`` that name its fields; absent keys keep the field's default.

    Raises:
        TypeError: a field without a default is absent from ``node``.
    """
    d = _plain(node)
    return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class RolloutSettings:
    """``train.rollout.*``: the rollout sampler and its engine (all keys in ``sweeps/config.yaml``)."""

    sampler: str
    dtype: str
    gpu_memory_utilization: float
    staleness: int      # k: the policy versions between the one that generated a step's samples and the one it updates
    old_policy: str     # recompute | behaviour: what the loss's ratio divides by (docs/staleness.md)
    correction: str
    correction_cap: float
    correction_lower: float | None  # null: 1 / correction_cap (training/corrections.py)
    overlap: bool = False  # k >= 1: step t+k generated in a background thread during step t's update (docs/staleness.md)


@dataclass(frozen=True)
class DynamicSampling:
    """``algo.dynamic_sampling`` (DAPO, Yu et al. 2025, eq. 11): refill groups whose rewards all agree, for at most
    ``max_num_gen_batches`` generation rounds per step. Off for algorithms that do not set it."""

    enabled: bool = False
    max_num_gen_batches: int = 1

    @property
    def rounds(self) -> int:
        """Generation rounds per step at most (1 when off)."""
        return int(self.max_num_gen_batches) if self.enabled else 1


@dataclass(frozen=True)
class OverlongShaping:
    """``algo.overlong_buffer`` (DAPO's overlong reward shaping, Yu et al. 2025 eq. 13): a penalty growing linearly
    over the last ``length`` tokens (or ``fraction`` of ``train.max_new_tokens``) before the maximum length. Off for
    algorithms that do not set it."""

    enabled: bool = False
    fraction: float | None = 0.2
    length: int | None = None
    penalty_factor: float = 1.0

    def buffer_length(self, max_new_tokens: int) -> int:
        """The buffer B in tokens: ``length`` when set, else ``fraction`` (0.2 when null: DAPO's 4,096 of 20,480) of
        ``max_new_tokens``, rounded, at least 1.

        Raises:
            ValueError: a fraction outside (0, 1] or a length outside [1, max_new_tokens] (names the key).
        """
        length = self.length
        if length is None:
            fraction = float(OverlongShaping.fraction if self.fraction is None else self.fraction)
            if not 0 < fraction <= 1:
                raise ValueError(f"algo.overlong_buffer.fraction={fraction!r}: must be in (0, 1]")
            length = max(1, round(fraction * int(max_new_tokens)))
        if not (int(length) == length and 1 <= length <= int(max_new_tokens)):
            raise ValueError(f"algo.overlong_buffer.length={length!r}: expected an integer in [1, train.max_new_tokens="
                             f"{int(max_new_tokens)}]")
        return int(length)

    @classmethod
    def of(cls, node) -> "OverlongShaping":
        """The record of an ``algo.overlong_buffer`` node (None: off)."""
        return _record(cls, node)


@dataclass(frozen=True)
class AlgoTerms:
    """The algorithm's extra loss terms: ``algo.kl_beta`` (k3 KL to the reference) and ``algo.entropy_coef``
    (GRPO-H's entropy bonus), 0 where an algorithm leaves them out."""

    kl_beta: float = 0.0
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class RunSettings:
    """What the local engine reads of a run's config, typed (``train.*``, ``model.chat_template``, the algorithm's
    optional subtrees). ``precision`` is as given (``auto``) before :func:`training.engines.local.resolve_precision`
    and ``fp32`` or ``bf16`` after."""

    device: str
    precision: str
    gradient_checkpointing: bool
    micro_batch_tokens: object  # "auto", None or a number of tokens
    packing: str
    memory_check: object  # "auto", True or False
    device_memory_gb: float | None
    max_prompt_tokens: int
    warmup_steps: int
    checkpoint_every: int
    save_every: int
    validate_every: int
    max_nonfinite_steps: int
    chat_template: bool
    rollout: RolloutSettings
    dynamic: DynamicSampling
    overlong: OverlongShaping
    terms: AlgoTerms

    @property
    def bf16(self) -> bool:
        """bf16 autocast (a resolved ``train.precision=bf16``)."""
        return self.precision == "bf16"

    @classmethod
    def of(cls, cfg) -> "RunSettings":
        """The settings of a composed, validated run config.

        Raises:
            omegaconf.errors.ConfigAttributeError: a ``train.*`` key the composed tree always has is missing.
        """
        t = cfg.train
        return cls(device=str(t.device), precision=str(t.precision), gradient_checkpointing=bool(t.gradient_checkpointing),
                   micro_batch_tokens=t.micro_batch_tokens, packing=str(t.packing), memory_check=t.memory_check,
                   device_memory_gb=None if t.device_memory_gb is None else float(t.device_memory_gb),
                   max_prompt_tokens=int(t.max_prompt_tokens), warmup_steps=int(t.warmup_steps),
                   checkpoint_every=int(t.checkpoint_every or 0), save_every=int(t.save_every or 0),
                   validate_every=int(t.validate_every or 0),
                   max_nonfinite_steps=int(t.max_nonfinite_steps), chat_template=bool(cfg.model.chat_template),
                   rollout=_record(RolloutSettings, t.rollout),
                   dynamic=_record(DynamicSampling, cfg.algo.get("dynamic_sampling")),
                   overlong=_record(OverlongShaping, cfg.algo.get("overlong_buffer")),
                   terms=_record(AlgoTerms, cfg.algo))
