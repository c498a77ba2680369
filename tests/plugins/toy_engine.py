"""A plug-in training engine in one file (the example of docs/extending.md), with its preset
``conf/engine/toy_local.yaml``: a sweep uses it with ``plugins=[tests.plugins.toy_engine]
hydra.searchpath=[file://tests/plugins/conf] engine=toy_local``.

It trains with the local engine and declares one key of its own, ``engine.marker``: every step's metrics carry
``engine/marker_steps`` (the steps it has seen), so a test can tell that this engine, not the local one, ran.
"""
from core.config_keys import S
from training.engines import local, register_engine

register_engine("toy_local")
CONFIG = {"engine.marker": S(min_len=1, doc="a word written to the run's tags, to tell this engine ran")}


def validate(cfg):
    """The local engine's checks (this engine trains with it)."""
    return local.validate(cfg)


def train(cfg, run_dir, log_metrics=lambda m, s: None, logged_through: int = -1):
    """The local engine's training, with ``engine/marker_steps`` added to every step's metrics."""
    seen = []

    def log(metrics, step):
        seen.append(step)
        log_metrics({**metrics, "engine/marker_steps": float(len(seen))}, step)

    return local.train(cfg, run_dir, log, logged_through)
