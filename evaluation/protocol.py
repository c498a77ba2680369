"""The evaluation protocol: everything that decides how a checkpoint's samples are drawn and read, resolved on the
machine that evaluates, so that numbers are compared only when they were measured alike.

A protocol is the ``eval`` settings that change what is measured (benchmarks, samples per prompt, ks, temperatures,
top-p, response length, prompt template, per-benchmark decoding, extra temperatures, prompts per benchmark, entropy)
with the two choices ``auto`` leaves to the hardware made explicit: the **sampler** (``eval.sampler``:
:func:`evaluation_sampler`, vLLM where a GPU is visible, transformers elsewhere) and its **dtype**
(``eval.dtype``, or ``eval.vllm.dtype`` for vLLM: bfloat16 where the device computes it natively), plus whether
prompts go through the model's chat template. Both are a function of the evaluation settings and of the machine the
evaluation runs on, never of how a point was trained: a point whose rollouts ran on vLLM is evaluated like one whose
rollouts ran on transformers. Not part of it (:data:`NOT_PROTOCOL`): the decoding seed (a seed sweep repeats one
protocol: ExPPO's decoding-seed table compares across seeds), whether the base model and which checkpoints are
evaluated, the flip rule's k, paths, batching and the engine's memory and parallelism knobs.

The sweep records the protocol its first evaluation resolved (:mod:`orchestrator.point.sweep_protocol`); every run carries
its protocol as tags (:func:`tags`), and a comparison is formed only between runs of one protocol.
"""
from __future__ import annotations

import hashlib
import json

from core import tags as tag_names

#: evaluation settings that do not change the protocol a number was measured with: the decoding seed (a replicate),
#: whether the base model and which checkpoints are evaluated, the flip rates' k, and where and how fast it runs
#: (paths, batching, the device, the engine's memory and parallelism knobs: the dtype they lead to is resolved)
NOT_PROTOCOL = ("seed", "base", "checkpoints", "flip_k", "data_dir", "batch_prompts", "score_rows", "score_tokens",
                "device", "vllm", "name", "select_on", "validation")
#: what ``auto`` decides from the machine (the parts a sweep records from its first evaluation)
RESOLVED = ("sampler", "dtype")
TAG = tag_names.EVAL_PROTOCOL        # the run's protocol (JSON)
ID_TAG = tag_names.EVAL_PROTOCOL_ID  # its hash


def _container(eval_cfg) -> dict:
    from omegaconf import OmegaConf

    if isinstance(eval_cfg, dict):
        return json.loads(json.dumps(eval_cfg, default=str))
    return OmegaConf.to_container(eval_cfg, resolve=True)


def evaluation_sampler(eval_cfg, sampler: str | None = None) -> str:
    """The sampler an evaluation uses: ``sampler`` or ``eval.sampler`` resolved (:func:`core.sampling.resolve_sampler`:
    ``auto`` is vLLM where a GPU is visible, transformers elsewhere), except that when a benchmark's task calls tools
    only a sampler that declares ``supports_tools`` serves it (``auto`` then takes the first of them that can run here).
    A function of the evaluation settings and the machine only, never of how the checkpoint was trained (part of the
    evaluation protocol, :mod:`evaluation.protocol`).

    Raises:
        ValueError: the sampler cannot run here, or one without tool support asked for tool benchmarks.
    """
    from core.sampling import SAMPLERS, resolve_sampler, tool_samplers
    from core.tasks import get_task

    asked = str(sampler or eval_cfg.get("sampler", "auto"))
    tool_benches = [b for b in eval_cfg.benchmarks if getattr(get_task(b), "tools", ())]
    if tool_benches:
        able = tool_samplers()
        if asked == "auto":
            ready = [n for n in able if SAMPLERS[n].missing() is None]
            asked = ready[0] if ready else (able[0] if able else "auto")
        elif asked not in able:
            raise ValueError(f"eval.sampler={asked!r}: benchmarks {tool_benches} call tools, which only the "
                             f"samplers {able} run (set eval.sampler={able[0] if able else 'hf'})")
    return resolve_sampler(asked)


def sampler_dtype(eval_cfg, sampler: str) -> str:
    """The dtype ``sampler`` samples in under ``eval_cfg`` on this machine: ``eval.vllm.dtype`` for vLLM when set,
    else ``eval.dtype`` resolved on the evaluation device (``auto``: bfloat16 where it computes it natively,
    :func:`core.models.resolve_dtype`), as a name (``float32``, ``bfloat16``, ``float16``)."""
    from core.models import DTYPES, resolve_device, resolve_dtype

    engine = eval_cfg.get(sampler) if hasattr(eval_cfg, "get") else None
    own = (engine or {}).get("dtype") if hasattr(engine or {}, "get") else None
    if own:
        return str(own)
    names = {v: k for k, v in DTYPES.items()}
    return names[resolve_dtype(str(eval_cfg.get("dtype", "auto")), resolve_device(str(eval_cfg.get("device", "auto"))))]


def settings(eval_cfg, chat_template: bool = True) -> dict:
    """The protocol's settings as configured (``auto`` not resolved): ``eval_cfg`` without :data:`NOT_PROTOCOL`,
    plus ``chat_template``. Two evaluations with equal settings on alike machines have one protocol."""
    ev = _container(eval_cfg)
    for key in NOT_PROTOCOL:
        ev.pop(key, None)
    ev.pop("sampler", None)
    ev.pop("dtype", None)
    ev["chat_template"] = bool(chat_template)
    return ev


def settings_key(eval_cfg, chat_template: bool = True) -> str:
    """12-hex-digit SHA-256 of :func:`settings` plus the configured (unresolved) ``sampler`` and ``dtype`` words: the
    key under which a sweep records how its first evaluation resolved them."""
    ev = settings(eval_cfg, chat_template)
    ev["sampler"], ev["dtype"] = str(eval_cfg.get("sampler", "auto")), str(eval_cfg.get("dtype", "auto"))
    vllm = eval_cfg.get("vllm") if hasattr(eval_cfg, "get") else None
    ev["vllm_dtype"] = str((vllm or {}).get("dtype") if hasattr(vllm or {}, "get") else None)
    return hashlib.sha256(json.dumps(ev, sort_keys=True, default=str).encode()).hexdigest()[:12]


def resolve(eval_cfg, chat_template: bool = True) -> dict:
    """The protocol ``eval_cfg`` runs under on this machine: :func:`settings` with ``sampler`` and ``dtype``
    resolved (:func:`evaluation_sampler`, :func:`sampler_dtype`).

    Raises:
        ValueError: the configured sampler cannot run here (names it and why).
    """
    own = settings(eval_cfg, chat_template)
    sampler = evaluation_sampler(eval_cfg)
    return {**own, "sampler": sampler, "dtype": sampler_dtype(eval_cfg, sampler)}


def identity(eval_cfg, chat_template: bool = True) -> str:
    """The id of the protocol ``eval_cfg`` runs under on this machine (:func:`resolve`); when its sampler cannot run
    here (a cluster point decides on its node), the id of its settings alone (:func:`settings`)."""
    own = settings(eval_cfg, chat_template)
    try:
        return protocol_id(resolve(eval_cfg, chat_template))
    except Exception:  # the sampler or dtype cannot be resolved here
        return protocol_id(own)


def pin(eval_cfg, resolved: dict):
    """``eval_cfg`` with the resolved choices of a protocol (``sampler``, ``dtype``) written in, so the evaluation
    takes them instead of choosing again (an OmegaConf config; ``eval.vllm.dtype`` follows the dtype)."""
    from omegaconf import OmegaConf

    over = {"sampler": resolved["sampler"]}
    if resolved["sampler"] == "vllm" and (eval_cfg.get("vllm") or {}).get("dtype"):
        over["vllm"] = {"dtype": resolved["dtype"]}
    elif resolved["dtype"] in ("float32", "bfloat16", "float16"):
        over["dtype"] = resolved["dtype"]
    return OmegaConf.merge(eval_cfg, over)


def protocol_id(protocol: dict) -> str:
    """16-hex-digit SHA-256 of a protocol (keys sorted)."""
    return hashlib.sha256(json.dumps(protocol, sort_keys=True, default=str).encode()).hexdigest()[:16]


def summary(protocol: dict) -> str:
    """One line: ``vllm, bfloat16, n 8, T 1.0, top-p 0.7, 48 tokens, arithmetic``."""
    p = protocol or {}
    parts = [str(p.get("sampler", "?")), str(p.get("dtype", "?"))]
    for key, name in (("n", "n"), ("temperature", "T"), ("top_p", "top-p")):
        if key in p:
            parts.append(f"{name} {p[key]}")
    if "max_new_tokens" in p:
        parts.append(f"{p['max_new_tokens']} tokens")
    if p.get("benchmarks"):
        parts.append(", ".join(map(str, p["benchmarks"])))
    if p.get("decoding"):
        parts.append(f"per-benchmark decoding {json.dumps(p['decoding'], sort_keys=True)}")
    return ", ".join(parts)


def differences(a: dict, b: dict) -> list[str]:
    """The settings two protocols differ in, one ``key: a vs b`` each (sampler and dtype first); [] when equal."""
    a, b = a or {}, b or {}
    keys = [k for k in RESOLVED if k in a or k in b] + sorted(k for k in set(a) | set(b) if k not in RESOLVED)
    return [f"{k}: {a.get(k, '-')} vs {b.get(k, '-')}" for k in keys if a.get(k) != b.get(k)]


def tags(protocol: dict) -> dict:
    """The MLflow tags of a run evaluated under ``protocol``: the protocol (JSON), its id, ``rlvr.sampler`` and
    ``rlvr.eval_dtype``."""
    text = json.dumps(protocol, sort_keys=True, default=str)
    return {TAG: text[:5000], ID_TAG: protocol_id(protocol), tag_names.SAMPLER: str(protocol.get("sampler")),
            tag_names.EVAL_DTYPE: str(protocol.get("dtype"))}


def of_tags(run_tags: dict) -> dict | None:
    """The protocol a run's tags record (:func:`tags`), or None (a run evaluated before protocols were recorded)."""
    text = (run_tags or {}).get(TAG)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def write(protocol: dict, folder) -> None:
    """``protocol.json`` in an evaluation's folder (beside ``samples.parquet``: ``python -m evaluation.recompute``
    compares two samples files' protocols from it)."""
    from pathlib import Path

    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "protocol.json").write_text(json.dumps(protocol, sort_keys=True, indent=1, default=str))


def read_beside(samples_path) -> dict | None:
    """The ``protocol.json`` beside a samples file, or None."""
    from pathlib import Path

    path = Path(samples_path).parent / "protocol.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
