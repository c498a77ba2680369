"""Errors the orchestrator reports as one line, before any expensive work."""


class ConfigError(ValueError):
    """A composed config that cannot run. The message names the bad key and value."""
