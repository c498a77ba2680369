"""A run's settings, typed and built once from the validated config and the device (:func:`read`, packed into a
:class:`RunSettings` at once: ``RunSettings(**read(cfg))``, or :meth:`RunSettings.of`).

Every training engine builds one :class:`RunSettings` at its entry (``train``, ``validate``, ``memory_plan``) and hands
it to every phase; below the entry no function receives the Hydra config (tests/test_engine_shape.py checks it by
reading the code). The precision is resolved into it on the device the run trains on (``auto``: bf16 where the
device computes it natively), so nothing rewrites the config, and what the algorithm needs of an engine (old
log-probs before the update, a reference policy, a random generator, the path the old log-probs take) is worked out
once into :class:`AlgoNeeds`.

The defaults live in the YAML (``sweeps/config.yaml``: every ``train.*`` key an engine reads is there, so it is read
here without a fallback: a missing key is a config that did not come from the composed tree and fails loudly) and,
for the algorithm's optional subtrees that most algorithms leave out (``algo.dynamic_sampling``,
``algo.overlong_buffer``, ``algo.kl_beta``, ``algo.entropy_coef``), in the field defaults of the typed records below:
one place each. The schema (``orchestrator/checks/schema.py``) has already checked every value's type and range.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, OmegaConf

from core.lora import LoraSettings
from training.rewards import OverlongShaping  # (owned beside its penalty)


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


def _params(node) -> dict:
    """A registered function's parameters: its config node without ``name``, as a plain dict."""
    d = _plain(node)
    d.pop("name", None)
    return d


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
class AlgoTerms:
    """The algorithm's extra loss terms: ``algo.kl_beta`` (k3 KL to the reference) and ``algo.entropy_coef``
    (GRPO-H's entropy bonus), 0 where an algorithm leaves them out."""

    kl_beta: float = 0.0
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class AlgoSpec:
    """The algorithm the config names: ``algo.name``, the registered advantage estimator and policy loss
    (:mod:`training.algorithms`) with their parameters (their YAML keys, ``name`` left out)."""

    name: str
    advantage: str
    advantage_params: dict
    policy_loss: str
    policy_loss_params: dict

    @property
    def loss_agg_mode(self) -> str:
        """The policy loss's ``loss_agg_mode`` (``token-mean`` when it sets none)."""
        return str(self.policy_loss_params.get("loss_agg_mode", "token-mean"))


class OldLogprobs(enum.Enum):
    """The one path a step's old log-probs (the ratio's denominator) take (:attr:`AlgoNeeds.old_logprobs`).

    KEPT: the rollout's scoring pass gives them and the update uses them as they are (with
    ``train.rollout.old_policy=behaviour`` they are the generating policy's own, b). ALIGNED: the rollout scored them
    (an estimator or dynamic sampling read them first), and the update recomputes them on its own passes, minibatch
    by minibatch in the first epoch's order, before its first optimiser step (bf16, whose results depend on the batch
    shape; with staleness, the proximal log-probs p of the weights the step starts from). DEFERRED: the rollout
    scores nothing; the update fills them, and the rollout policy's entropies, the same way (the first minibatch from
    its own forward pass)."""

    KEPT = "kept"
    ALIGNED = "aligned"
    DEFERRED = "deferred"

    @property
    def recomputed(self) -> bool:
        """Whether the update computes them on its own path before its first optimiser step."""
        return self is not OldLogprobs.KEPT


@dataclass(frozen=True)
class AlgoNeeds:
    """What the algorithm and the run's settings need of an engine, worked out once (:meth:`RunSettings.of`).

    Attributes:
        estimator_reads_old: the advantage estimator reads the old log-probs (ExPPO's surprisal): they exist before
            the update.
        estimator_random: the estimator draws random numbers (ExPPO's shuffled-surprisal control): the engine hands it
            a generator seeded per step (``generator=``), never torch's global one, which another thread may reset.
        reference: a reference policy scores the samples (``algo.kl_beta > 0``, or a loss that reads them).
        off_policy: a step's samples may come from another policy than the one the step starts from, or the loss
            divides by the generating policy's log-probs: the rollout keeps the behaviour log-probs b.
        old_logprobs: the one path the old log-probs take (:class:`OldLogprobs`).
        proximal_in_update: with staleness under ``recompute``, the proximal log-probs p come from the update's own
            passes (the ALIGNED path) rather than a scoring pass when the step starts (the estimator reads them).
        couples_rows: the policy loss reads other responses' log-probs (two passes per split minibatch).
    """

    estimator_reads_old: bool
    estimator_random: bool
    reference: bool
    off_policy: bool
    old_logprobs: OldLogprobs
    proximal_in_update: bool
    couples_rows: bool

    @classmethod
    def of(cls, algo: AlgoSpec, terms: AlgoTerms, rollout: RolloutSettings, dynamic: DynamicSampling,
           bf16: bool) -> "AlgoNeeds":
        """The needs of ``algo`` (its registered functions' declarations, :func:`training.algorithms.needs_of`) under
        the run's loss terms, rollout, dynamic sampling and precision."""
        from training.algorithms import couples_rows, needs_of

        adv_needs = needs_of("advantage", algo.advantage, algo.advantage_params)
        reads_old = "old_logprobs" in adv_needs
        off_policy = rollout.staleness > 0 or rollout.old_policy == "behaviour"
        proximal = rollout.staleness > 0 and rollout.old_policy == "recompute" and not reads_old
        if not reads_old and not dynamic.enabled and not off_policy:
            path = OldLogprobs.DEFERRED  # the update's first forward pass is the rollout policy: no pass of its own
        elif rollout.old_policy == "behaviour":
            path = OldLogprobs.KEPT  # the ratio's denominator is b, never recomputed on the update's path
        elif proximal or bf16:
            path = OldLogprobs.ALIGNED
        else:
            path = OldLogprobs.KEPT
        return cls(estimator_reads_old=reads_old, estimator_random="generator" in adv_needs,
                   reference=terms.kl_beta > 0 or "ref_logprobs" in needs_of("policy_loss", algo.policy_loss,
                                                                             algo.policy_loss_params),
                   off_policy=off_policy, old_logprobs=path, proximal_in_update=proximal,
                   couples_rows=couples_rows(algo.policy_loss) is not None)


def resolve_device(setting: str) -> str:
    """``cuda`` or ``cpu``: where a run with ``train.device`` = ``setting`` trains on this machine (``auto``: one CUDA
    GPU when present)."""
    import torch

    return "cuda" if (setting.startswith("cuda") or (setting == "auto" and torch.cuda.is_available())) else "cpu"


@dataclass(frozen=True)
class RunSettings:
    """What a training engine reads of a run's config, typed, with the precision resolved on ``device_type``.

    Attributes (beside the ``train.*`` keys of the same names):
        device: ``train.device`` as given (``auto``, ``cpu``, ``cuda``); device_type: ``cuda`` or ``cpu``, where the
            run trains (:func:`resolve_device`, or the device a cluster node has).
        precision_setting: ``train.precision`` as given (``auto``); precision: ``fp32`` or ``bf16`` on
            ``device_type``, and precision_reason why (:func:`core.precision.choose`).
        seed: the run's ``seed``; chat_template: ``model.chat_template``.
        model, data, tools: the ``model``, ``data`` and ``tools`` config nodes, handed as they are to core's loaders
            (:func:`core.models.load_policy`, :func:`core.tasks.load_prompts`, :func:`core.tools.open_tools_for`),
            which own their keys. eval_vllm: ``eval.vllm`` (the process's vLLM engine is shared with the evaluation).
        plugins: the ``plugins`` modules (tasks, algorithms of the user's); experiment: ``experiment_name``.
        engine: the ``engine`` node (an engine's own keys, read by its own settings record).
        lora: ``train.lora`` (:class:`core.lora.LoraSettings`); algo: the algorithm (:class:`AlgoSpec`); needs: what it
            needs of an engine (:class:`AlgoNeeds`).
    """

    device: str
    device_type: str
    precision_setting: str
    precision: str
    precision_reason: str
    seed: int
    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    lr: float
    betas: tuple
    weight_decay: float
    ppo_epochs: int
    minibatch_size: int | None
    max_grad_norm: float
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
    lora: LoraSettings
    algo: AlgoSpec
    needs: AlgoNeeds
    model: object = None
    data: object = None
    tools: object = None
    eval_vllm: dict = field(default_factory=dict)
    plugins: tuple = ()
    experiment: str = "rlvr"
    engine: object = None

    @property
    def bf16(self) -> bool:
        """bf16 autocast (``train.precision`` resolved to bf16)."""
        return self.precision == "bf16"

    @property
    def rollout_dtype(self) -> str:
        """``train.rollout.dtype``: ``auto`` is the precision the trainer computes in (float32, or bfloat16 with bf16):
        the least training-inference mismatch."""
        if self.rollout.dtype != "auto":
            return self.rollout.dtype
        return "bfloat16" if self.bf16 else "float32"

    @property
    def rows_per_step(self) -> int:
        """Responses one generation round samples: prompts per step x group size."""
        return self.prompts_per_step * self.group_size

    @classmethod
    def of(cls, cfg, device: str | None = None) -> "RunSettings":
        """The settings of a composed, validated run config, trained on ``device``: ``RunSettings(**read(cfg,
        device))`` (:func:`read`)."""
        return cls(**read(cfg, device))


def read(cfg, device: str | None = None) -> dict:
    """Every field of :class:`RunSettings` read from a composed, validated run config, trained on ``device`` (``cuda``
    or ``cpu``; default: where it would train on this machine, :func:`resolve_device`): the one place the config's
    ``train.*`` keys, its algorithm and its precision are read. An engine's entry packs them into the record at once
    (``RunSettings(**read(cfg))``).

    Raises:
        omegaconf.errors.ConfigAttributeError: a ``train.*`` key the composed tree always has is missing.
        ValueError: an unknown ``train.precision``.
    """
    from core.precision import choose

    t, algo = cfg.train, cfg.algo
    device_type = device or resolve_device(str(t.device))
    choice = choose(str(t.precision), device_type)
    spec = AlgoSpec(str(algo.name), str(algo.advantage.name), _params(algo.advantage), str(algo.policy_loss.name),
                    _params(algo.policy_loss))
    rollout, dynamic, terms = (_record(RolloutSettings, t.rollout), _record(DynamicSampling, algo.get("dynamic_sampling")),
                               _record(AlgoTerms, algo))
    mb = t.minibatch_size
    return dict(device=str(t.device), device_type=device_type, precision_setting=str(t.precision),
                precision=choice.precision, precision_reason=choice.reason, seed=int(cfg.seed), steps=int(t.steps),
                prompts_per_step=int(t.prompts_per_step), group_size=int(t.group_size),
                max_new_tokens=int(t.max_new_tokens), temperature=float(t.temperature), top_p=float(t.top_p),
                lr=float(t.lr), betas=tuple(float(b) for b in t.betas), weight_decay=float(t.weight_decay),
                ppo_epochs=int(t.ppo_epochs), minibatch_size=None if mb is None else int(mb),
                max_grad_norm=float(t.max_grad_norm), gradient_checkpointing=bool(t.gradient_checkpointing),
                micro_batch_tokens=t.micro_batch_tokens, packing=str(t.packing), memory_check=t.memory_check,
                device_memory_gb=None if t.device_memory_gb is None else float(t.device_memory_gb),
                max_prompt_tokens=int(t.max_prompt_tokens), warmup_steps=int(t.warmup_steps),
                checkpoint_every=int(t.checkpoint_every or 0), save_every=int(t.save_every or 0),
                validate_every=int(t.validate_every or 0), max_nonfinite_steps=int(t.max_nonfinite_steps),
                chat_template=bool(cfg.model.chat_template), rollout=rollout, dynamic=dynamic,
                overlong=_record(OverlongShaping, algo.get("overlong_buffer")), terms=terms,
                lora=LoraSettings.of(cfg), algo=spec,
                needs=AlgoNeeds.of(spec, terms, rollout, dynamic, choice.bf16),
                model=cfg.model, data=cfg.data, tools=cfg.get("tools"),
                eval_vllm=_plain(OmegaConf.select(cfg, "eval.vllm")),
                plugins=tuple(str(m) for m in (cfg.get("plugins") or [])),
                experiment=str(cfg.get("experiment_name", "rlvr")), engine=cfg.get("engine"))
