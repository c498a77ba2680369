"""LoRA adapters on a frozen base model (``train.lora``), through peft as transformers integrates it.

The policy stays the transformers model it was (``model.add_adapter``: peft's LoRA layers injected in place), so
every scorer, sampler and packing path works on it unchanged. What this module owns:

- :class:`LoraSettings` (``train.lora``: rank, alpha, dropout, target modules, learning rate) and their checks;
- :func:`attach`: the adapters on a loaded policy (only they train; the base is frozen and never written);
- :func:`reference`: the reference policy is the same model with its adapters disabled, no second copy;
- :func:`policy_weights`: the policy's weights under the base model's names with every adapter merged in
  (``W + scale * B @ A``, peft's own ``get_delta_weight``), what a vLLM engine loads in place after each optimiser
  step; the base tensors are read, never changed;
- :func:`save_adapter`: a checkpoint holds the adapter in peft's format (``adapter_config.json`` naming its base
  folder, ``adapter_model.safetensors``, the tokenizer); :func:`core.models.evaluable` (model I/O's, re-exported
  here) turns such a folder into the merged model folder every evaluation path loads (peft's ``merge_and_unload``,
  cached by the adapter's content).

Source: Hu et al. 2022, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3 (``h = W0 x + (alpha / r) B A x``,
B initialised to zero, so the adapted policy starts as the base); the learning-rate rule of ``lr: auto`` (10x full
fine-tuning's) is Schulman et al. 2025, "LoRA Without Regret" (Thinking Machines), which finds low ranks matching full
fine-tuning in RL when every linear layer is adapted.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from .models import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_base, evaluable, is_adapter  # noqa: F401  (model I/O)

#: ``train.lora.lr: auto`` is this multiple of ``train.lr`` (LoRA Without Regret: the optimal LoRA learning rate is
#: about 10x full fine-tuning's, across ranks, in supervised and RL training)
LR_MULTIPLE = 10.0
#: a decoder layer's linear projections (Llama, Qwen2, Mistral names): what ``all-linear`` covers (peft excludes the
#: output head)
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """``train.lora``.

    Attributes:
        rank: r, the adapters' inner dimension (0: no adapters, full fine-tuning).
        alpha: the scale numerator: the update is ``(alpha / r) B A``.
        dropout: dropout on the adapters' input during training (0 keeps the old and new log-probs of one pass equal).
        target_modules: ``all-linear`` (every linear layer of the decoder, not the output head) or module names.
        lr: the learning rate the adapters train with (``auto``: :data:`LR_MULTIPLE` x ``train.lr``).
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: object = "all-linear"
    lr: object = "auto"

    @classmethod
    def of(cls, cfg) -> "LoraSettings":
        """From a run config (``cfg.train.lora``; absent: off)."""
        node = (cfg.train.get("lora") if hasattr(cfg, "train") else None) or {}
        get = node.get
        targets = get("target_modules", "all-linear")
        if not isinstance(targets, str):
            targets = tuple(str(t) for t in targets)
        return cls(rank=int(get("rank", 0) or 0), alpha=float(get("alpha", 16)), dropout=float(get("dropout", 0.0)),
                   target_modules=targets, lr=get("lr", "auto"))

    @property
    def on(self) -> bool:
        return self.rank > 0

    def learning_rate(self, full_lr: float) -> float:
        """The adapters' learning rate: ``lr``, or :data:`LR_MULTIPLE` x ``full_lr`` for ``auto``."""
        return LR_MULTIPLE * float(full_lr) if self.lr == "auto" else float(self.lr)

    def targets(self) -> tuple[str, ...]:
        """The decoder projections adapted (for the memory plan): all of :data:`DECODER_LINEARS` for ``all-linear``."""
        if self.target_modules == "all-linear":
            return DECODER_LINEARS
        return tuple(t for t in self.target_modules if t in DECODER_LINEARS)

    def check(self) -> None:
        """Raises ValueError naming the ``train.lora`` key whose value cannot be used (every key, also with rank 0)."""
        if self.rank < 0:
            raise ValueError(f"train.lora.rank={self.rank}: expected 0 (off) or a rank >= 1")
        # the other keys are checked with LoRA off too: a bad value is a typo whether or not it is used yet
        if not self.alpha > 0:
            raise ValueError(f"train.lora.alpha={self.alpha}: expected a number > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"train.lora.dropout={self.dropout}: expected a number in [0, 1)")
        if isinstance(self.target_modules, str):
            if self.target_modules != "all-linear":
                raise ValueError(f"train.lora.target_modules={self.target_modules!r}: expected all-linear or a list "
                                 f"of module names such as {list(DECODER_LINEARS)}")
        elif not self.target_modules:
            raise ValueError("train.lora.target_modules=[]: name at least one module, or all-linear")
        if self.lr != "auto":
            try:
                lr = float(self.lr)
            except (TypeError, ValueError):
                lr = float("nan")
            if not 0.0 < lr <= 1.0:
                raise ValueError(f"train.lora.lr={self.lr!r}: expected auto ({LR_MULTIPLE:g}x train.lr) or a "
                                 "learning rate in (0, 1]")

    def peft_config(self):
        """peft's ``LoraConfig`` of these settings."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          bias="none", task_type="CAUSAL_LM")


def has_adapters(model) -> bool:
    """Whether ``model`` carries peft adapters (transformers' integration)."""
    return bool(getattr(model, "_hf_peft_config_loaded", False))


def attach(model, settings: LoraSettings):
    """Inject ``settings``' adapters into ``model`` in place (B = 0: the adapted policy starts as the base), freeze
    every base parameter. Returns ``model``.

    Raises:
        ValueError: a target module that the model does not have (peft's message, naming ``train.lora.target_modules``).
    """
    try:
        model.add_adapter(settings.peft_config())
    except ValueError as e:
        raise ValueError(f"train.lora.target_modules={settings.target_modules!r}: {e}") from None
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def trainable_count(model) -> tuple[int, int]:
    """(trainable parameters, all parameters) of ``model``."""
    n = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for p in model.parameters() if p.requires_grad), n


@contextlib.contextmanager
def reference(model):
    """Within it, ``model`` computes the reference policy: its adapters disabled when it has any (the frozen base
    itself, no copy), unchanged otherwise (a separate reference copy)."""
    if not has_adapters(model):
        yield model
        return
    model.disable_adapters()
    try:
        yield model
    finally:
        model.enable_adapters()


def _lora_layers(model) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoraLayer)}


def policy_weights(model, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of ``model``'s weights under the base model's names, each adapter merged in
    (``W + get_delta_weight``), detached, in ``dtype`` (default: as stored). For a model without adapters, its
    ``state_dict``. The base tensors are not modified (the merge is a new tensor)."""
    if not has_adapters(model):
        for k, v in model.state_dict().items():
            yield k, (v.detach() if dtype is None else v.detach().to(dtype))
        return
    layers = _lora_layers(model)
    with torch.no_grad():
        for k, v in model.state_dict().items():
            if "lora_" in k:
                continue
            owner, _, leaf = k.rpartition(".base_layer.")
            if owner and owner in layers and leaf == "weight":
                layer = layers[owner]
                v = v + sum(layer.get_delta_weight(a).to(v.dtype) for a in layer.active_adapters
                            if a in layer.lora_A)
                k = f"{owner}.weight"
            elif owner:
                k = f"{owner}.{leaf}"
            yield k, (v.detach() if dtype is None else v.detach().to(dtype))


def adapter_state(model) -> dict:
    """The adapters' tensors (what training changes), by ``state_dict`` name."""
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def save_adapter(model, tokenizer, path: Path, base_path: str) -> None:
    """Save ``model``'s adapter in peft's format to ``path`` with the tokenizer, ``adapter_config.json`` naming
    ``base_path`` (the local folder the base loads from) as its base."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    conf = json.loads((path / ADAPTER_CONFIG).read_text())
    conf["base_model_name_or_path"] = str(Path(base_path).resolve()) if Path(base_path).exists() else str(base_path)
    (path / ADAPTER_CONFIG).write_text(json.dumps(conf, indent=2))


PEFT_PREFIX = "base_model.model."  # peft's PeftModel state-dict prefix (what verl's hf_model export of a LoRA actor holds)


def merge_saved_peft_model(folder, rank: int, alpha: float) -> bool:
    """Turn a Hugging Face folder whose weights are a peft-wrapped model's state dict (``base_model.model.`` names,
    ``base_layer`` and ``lora_A``/``lora_B`` tensors: what verl saves as ``hf_model`` for a LoRA actor, which
    ``from_pretrained`` would load as a randomly initialised model, silently) into the plain model with the adapters
    merged (peft's ``get_delta_weight``, :func:`policy_weights`), in place. Returns whether it had adapters.

    Args:
        rank, alpha: the adapters' r and lora_alpha (the scale is alpha / r, as peft's).
    Raises:
        ValueError: the adapters' tensors do not fit the model's config (names the folder).
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    if not any("lora_" in k for k in state):
        return False
    targets = sorted({k.split(".lora_A.")[0].rsplit(".", 1)[-1] for k in state if ".lora_A." in k})
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=torch.float32)
    attach(model, LoraSettings(rank=int(rank), alpha=float(alpha), target_modules=tuple(targets)))
    names = {k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(names, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{folder}: the saved LoRA model does not fit its config: unexpected {unexpected[:3]}, "
                         f"missing {sorted(set(missing) - tied)[:3]}")
    merged = dict(policy_weights(model))
    plain = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    plain.load_state_dict(merged, strict=not tied)
    for f in files:
        f.unlink()
    plain.save_pretrained(folder)
    return True
