"""Entry point: `python sweep.py -m algo=quatro,gspo delta=0.01,0.1`.

Every sweep point is validated first (orchestrator.preflight); then Hydra runs each point through
orchestrator.run, which trains, evaluates and logs to MLflow. A point that fails is recorded as FAILED
in MLflow and the other points go on; the sweep prints a summary and exits 1 if any point failed.
"""
import logging
import sys

import hydra
from omegaconf import DictConfig

from orchestrator import run
from orchestrator.preflight import check_command_line

log = logging.getLogger("rlvr")


@hydra.main(version_base="1.3", config_path="sweeps", config_name="config")
def main(cfg: DictConfig):
    from core.lifecycle import Preempted

    try:
        return run(cfg)
    except Preempted:
        raise  # submitit requeues the job
    except Exception as e:
        from orchestrator import ConfigError

        if isinstance(e, ConfigError):
            raise
        log.error("point failed: %s: %s", type(e).__name__, e)
        if "-m" not in sys.argv and "--multirun" not in sys.argv:
            raise
        return {"status": "failed", "error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
    from orchestrator.callbacks import FAILED_BASE, FAILED_POINTS

    sys.exit(1 if FAILED_POINTS or FAILED_BASE else 0)
