"""The verl engine's settings: the run's (:class:`training.settings.RunSettings`) with the ``engine.*`` keys verl
reads (:class:`EngineKeys`), built once at the engine's entry (:meth:`VerlSettings.of`) and handed to every part."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from omegaconf import DictConfig, OmegaConf

from training.settings import RunSettings


@dataclass(frozen=True)
class RolloutKeys:
    """``engine.rollout.*``: verl's rollout server (``sweeps/engine/verl.yaml``)."""

    name: str = "vllm"
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True)
class EngineKeys:
    """``engine.*`` as written (``sweeps/engine/verl.yaml`` has the defaults and a line on each; the sizes are kept as
    given, so the checks can name a value that is not an integer): the cluster (``nnodes``, ``n_gpus_per_node``,
    ``device``), the actor (``strategy``, ``attn_implementation``, ``micro_batch_size_per_gpu``,
    ``gradient_checkpointing``, ``use_remove_padding``, offloading), the data (``max_prompt_length``,
    ``dataloader_num_workers``), ``keep_checkpoints``, the rollout server and ``extra_overrides``."""

    nnodes: object = 1
    n_gpus_per_node: object = 1
    device: str = "cuda"
    strategy: str = "auto"
    attn_implementation: str = "auto"
    micro_batch_size_per_gpu: object = 4
    max_prompt_length: int = 1024
    gradient_checkpointing: bool = True
    use_remove_padding: bool = True
    param_offload: bool = False
    optimizer_offload: bool = False
    dataloader_num_workers: int = 2
    keep_checkpoints: int = 2
    rollout: RolloutKeys = field(default_factory=RolloutKeys)
    extra_overrides: tuple = ()

    @classmethod
    def of(cls, node) -> "EngineKeys":
        """The record of an ``engine`` node (keys it does not name, such as ``name``, left out)."""
        d = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        out = {f.name: d[f.name] for f in fields(cls) if f.name in d and f.name != "rollout"}
        roll = d.get("rollout") or {}
        out["rollout"] = RolloutKeys(**{f.name: roll[f.name] for f in fields(RolloutKeys) if f.name in roll})
        out["extra_overrides"] = tuple(str(x) for x in (d.get("extra_overrides") or []))
        return cls(**out)


@dataclass(frozen=True)
class VerlSettings:
    """A verl run's settings: ``run`` (the run's :class:`training.settings.RunSettings`, its device the engine's),
    ``engine`` (:class:`EngineKeys`) and the training data's name (``data.name``: the parquet's ``data_source``)."""

    run: RunSettings
    engine: EngineKeys
    data_name: str

    @classmethod
    def of(cls, cfg) -> "VerlSettings":
        """The settings of a composed ``engine=verl`` run config.

        Raises:
            omegaconf.errors.ConfigAttributeError: a key the composed tree always has is missing.
        """
        engine = EngineKeys.of(cfg.engine)
        device = "cpu" if str(engine.device) == "cpu" else "cuda"
        return cls(RunSettings.of(cfg, device), engine, str(cfg.data.name))


AUTO = {  # engine.<key>=auto resolved per device: verl's own default on GPUs; what runs on the CPU platform
    "strategy": {"cuda": "fsdp", "cpu": "fsdp2"},
    # verl's default is FlashAttention 2, which verl[vllm] does not install (a CUDA build): sdpa where it is absent
    "attn_implementation": {"cuda": lambda: "flash_attention_2" if _has("flash_attn") else "sdpa", "cpu": "sdpa"},
}


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def resolved(e: EngineKeys, key: str) -> str:
    """``engine.<key>`` with ``auto`` replaced by :data:`AUTO`'s choice for ``engine.device``."""
    value = str(getattr(e, key))
    if value != "auto":
        return value
    choice = AUTO[key][str(e.device)]
    return choice() if callable(choice) else choice


def tool_task(v: VerlSettings) -> bool:
    """Whether the run's training task calls tools (``Task.tools``)."""
    from core.tasks import get_task

    return bool(getattr(get_task(v.data_name), "tools", ()))
