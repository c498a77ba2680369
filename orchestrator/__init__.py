"""Run lifecycle: validate, identity/dedup, MLflow, train, evaluate, log."""
import os

# MLflow's usage telemetry off unless the user turns it on: on a machine without internet its client gives up in
# a thread and removes _MLFLOW_TELEMETRY_SESSION_ID from os.environ while another thread's request reads the
# environment, which failed a sweep job's log_batch here with KeyError('_MLFLOW_TELEMETRY_SESSION_ID'); set before
# any module of this package imports mlflow (the client starts at import)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
from orchestrator.errors import ConfigError  # noqa: E402

__all__ = ["ConfigError", "config_hash", "effective_config", "run", "validate_config"]
# imported when first named (PEP 562): a module of this package that needs none of them (the report's
# orchestrator.point.integrity, the stores) does not import torch and the trainer with the package
_LAZY = {"validate_config": "orchestrator.checks.validate", "config_hash": "orchestrator.point.identity",
         "effective_config": "orchestrator.point.identity", "run": "orchestrator.point.run"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
