"""Run identity: a hash of the effective config, so identical sweep points are trained once.

Two identities: :func:`config_hash` (everything: a point with the same one is a duplicate) and
:func:`training_hash` (everything but the ``eval`` group: points that differ only in how they are evaluated, e.g.
``eval.seed=0,1,2``, share one trained checkpoint and are evaluated in runs of their own).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

#: keys added after runs were logged, with the value that does what the code did before them: at that value a key is
#: left out of the identity, so a finished run stays recognised ("a key at its default does not change a run's
#: identity"); any other value is part of it
NEUTRAL: dict[str, object] = {
    "train.rollout.staleness": 0,          # on-policy (issue 58)
    "train.rollout.old_policy": "recompute",
    "train.rollout.overlap": False,
    "train.rollout.correction_lower": None,
    "train.validate_every": 0,             # no validation along training (issue 60)
}


def effective_config(cfg: DictConfig) -> dict:
    """The resolved config minus the keys listed in ``cfg.identity_exclude`` (and Hydra's own).

    Top-level knobs such as ``delta`` are excluded because their effect is already captured where
    an algorithm interpolates them (``algo.advantage.delta`` for QUATRO): GSPO at delta=0.01 and at
    delta=0.1 is the same run. Dotted keys remove one key of a group: ``train.checkpoint_every`` (how often the
    state is saved does not change what is computed, so turning checkpointing on keeps finished runs recognised).
    ``train.lora`` counts only when its rank is above 0; a key of :data:`NEUTRAL` only away from its neutral value.
    """
    container = OmegaConf.to_container(cfg, resolve=True)
    for key in list(cfg.get("identity_exclude", [])) + ["hydra"]:
        *parents, leaf = str(key).split(".")  # dotted keys reach into a group (train.checkpoint_every)
        node = container
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    for key, neutral in NEUTRAL.items():
        *parents, leaf = key.split(".")
        node = container
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf in node and node[leaf] == neutral:
            node.pop(leaf)
    train = container.get("train") if isinstance(container, dict) else None
    if isinstance(train, dict) and not ((train.get("lora") or {}).get("rank") or 0):
        train.pop("lora", None)  # LoRA off: its other keys change nothing, and full fine-tuning runs stay recognised
    return container


def config_hash(cfg: DictConfig) -> str:
    """16-hex-digit SHA-256 of :func:`effective_config` (keys sorted)."""
    blob = json.dumps(effective_config(cfg), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: the config groups that say how a checkpoint is evaluated, not how it is trained
EVALUATION_GROUPS = ("eval",)
#: the ``eval`` keys the validation inside the training loop reads (``train.validate_every > 0``): part of the
#: training's identity then, since the loop makes the validation and what it keeps on disk for selection
VALIDATION_KEYS = ("validation", "temperature", "top_p", "max_new_tokens", "seed", "select_on")


def training_hash(cfg: DictConfig) -> str:
    """16-hex-digit SHA-256 of :func:`effective_config` without :data:`EVALUATION_GROUPS` (but, with
    ``train.validate_every > 0``, the :data:`VALIDATION_KEYS` of ``eval``: the loop validates under them): the
    identity of the trained checkpoint. Points with equal training hashes and different :func:`config_hash` es train
    once; the run that evaluates the checkpoint again takes the training's validation with it."""
    container = effective_config(cfg)
    ev = container.get("eval") if isinstance(container.get("eval"), dict) else {}
    for group in EVALUATION_GROUPS:
        container.pop(group, None)
    if int((container.get("train") or {}).get("validate_every") or 0):  # validated inside the training loop
        container["validation_protocol"] = {k: ev.get(k) for k in VALIDATION_KEYS}
    blob = json.dumps(container, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_commit() -> str:
    """The git commit of the suite's checkout (``git rev-parse HEAD``), or ``"unknown"`` outside a checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def point_name(override_dirname: str) -> str:
    """A sweep point's name from Hydra's ``hydra.job.override_dirname`` (``algo=quatro,delta=0.01``) with Hydra's
    escapes removed (``eval.benchmarks=[a\\,b]`` -> ``eval.benchmarks=[a,b]``): what MLflow shows as the run's name."""
    import re

    return re.sub(r"\\(.)", r"\1", override_dirname or "")
