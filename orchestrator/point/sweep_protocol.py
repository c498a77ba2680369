"""One evaluation protocol per sweep: the first evaluation of a sweep records how it resolved the protocol's ``auto``
choices (sampler and dtype, :mod:`evaluation.protocol`) on the sweep's parent run in the store; every later
evaluation of the sweep with the same settings uses that record, or stops with one line naming the difference when
its machine cannot run it. So a SLURM sweep decides on the compute node that evaluates first, not on the login node,
and a sweep whose points ran on unlike nodes is still evaluated alike.

The record is the parent run's tag ``rlvr.eval_protocol.<settings key>`` (:func:`evaluation.protocol.settings_key`: a
sweep over evaluation settings, ``eval.temperature=0.6,1.0``, has one record per setting, each its own protocol), a
JSON ``{"sampler": ..., "dtype": ...}``. Two jobs that evaluate first at the same moment each write theirs, wait
:data:`orchestrator.store.lease.SETTLE_S` and read back the one the store kept, so both use the same. Outside a multirun
(no parent run) the evaluation resolves on its own machine.
"""
from __future__ import annotations

import json
import logging
import time

from orchestrator.errors import ConfigError
from orchestrator.store import lease, mlflow_views, tracking

log = logging.getLogger("rlvr")

TAG_PREFIX = "rlvr.eval_protocol."


class ProtocolMismatch(ConfigError):
    """This machine cannot evaluate under the protocol its sweep recorded (the message names the setting)."""


def resolve_for_sweep(cfg, exp_id: str, sweep_id: str | None, store: tracking.Store):
    """(``cfg.eval`` pinned to the sweep's protocol, the protocol): the sweep's recorded choices for these evaluation
    settings when it has them, else this machine's, recorded for the jobs after this one (store calls through
    ``store``, :class:`orchestrator.store.tracking.Store`).

    Raises:
        ProtocolMismatch: the recorded sampler cannot run on this machine, or this machine's resolution differs and the
            configuration fixes it explicitly (one line: what the sweep uses, what this machine has).
        ValueError: the configured sampler cannot run here (no record yet).
    """
    from evaluation import protocol as eval_protocol

    chat = bool(cfg.model.get("chat_template", True))
    local = eval_protocol.resolve(cfg.eval, chat)
    parent = mlflow_views.sweep_parent(exp_id, sweep_id, store) if sweep_id else None
    if parent is None:
        return eval_protocol.pin(cfg.eval, local), local
    key = TAG_PREFIX + eval_protocol.settings_key(cfg.eval, chat)
    mine = {k: local[k] for k in eval_protocol.RESOLVED}
    recorded = _read(store, parent, key)
    if recorded is None:
        store.set_tag(key, json.dumps(mine, sort_keys=True), parent)
        time.sleep(lease.SETTLE_S)  # another job's first evaluation may have written at the same moment
        recorded = _read(store, parent, key) or mine
    if recorded == mine:
        return eval_protocol.pin(cfg.eval, local), local
    differ = "; ".join(eval_protocol.differences(recorded, mine))
    try:
        pinned = eval_protocol.pin(cfg.eval, recorded)
        protocol = eval_protocol.resolve(pinned, chat)
    except ValueError as e:
        raise ProtocolMismatch(f"evaluation protocol: this sweep's evaluations use {_say(recorded)} (recorded by its "
                               f"first evaluation), which this machine cannot run ({e}); this machine would use "
                               f"{_say(mine)} ({differ})") from None
    if {k: protocol[k] for k in eval_protocol.RESOLVED} != recorded:
        raise ProtocolMismatch(f"evaluation protocol: this sweep's evaluations use {_say(recorded)} (recorded by its "
                               f"first evaluation); here the settings give {_say(protocol)} ({differ})")
    log.info("evaluation protocol: %s, as this sweep's first evaluation chose (this machine alone would choose %s)",
             _say(recorded), _say(mine))
    return pinned, protocol


def pinned_config(cfg, exp_id: str, sweep_id: str | None, store: tracking.Store):
    """(a copy of ``cfg`` whose ``eval`` group is pinned to the sweep's protocol, the protocol): see
    :func:`resolve_for_sweep`, which raises what this raises."""
    import copy

    from omegaconf import open_dict

    eval_cfg, protocol = resolve_for_sweep(cfg, exp_id, sweep_id, store)
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.eval = eval_cfg
    return out, protocol


def _say(choice: dict) -> str:
    return f"sampler={choice.get('sampler')} dtype={choice.get('dtype')}"


def _read(store: tracking.Store, run_id: str, key: str) -> dict | None:
    text = store.run(run_id).data.tags.get(key)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
