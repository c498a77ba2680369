"""Run lifecycle: validate, identity/dedup, MLflow, train, evaluate, log."""
import os

# MLflow's usage telemetry off unless the user turns it on: on a machine without internet its client gives up in
# a thread and removes _MLFLOW_TELEMETRY_SESSION_ID from os.environ while another thread's request reads the
# environment, which failed a sweep job's log_batch here with KeyError('_MLFLOW_TELEMETRY_SESSION_ID'); set before
# any module of this package imports mlflow (the client starts at import)
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
from orchestrator.checks.validate import validate_config
from orchestrator.errors import ConfigError
from orchestrator.point.identity import config_hash, effective_config
from orchestrator.point.run import run

__all__ = ["ConfigError", "config_hash", "effective_config", "run", "validate_config"]
