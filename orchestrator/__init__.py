"""Run lifecycle: validate, identity/dedup, MLflow, train, evaluate, log."""
from .errors import ConfigError
from .identity import config_hash, effective_config
from .run import run
from .validate import validate_config

__all__ = ["ConfigError", "config_hash", "effective_config", "run", "validate_config"]
