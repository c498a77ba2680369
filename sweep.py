"""Entry point: `python sweep.py -m algo=quatro,gspo delta=0.01,0.1`.

Every sweep point is validated first (orchestrator.preflight); then Hydra runs each point through
orchestrator.run, which trains, evaluates and logs to MLflow.
"""
import sys

import hydra
from omegaconf import DictConfig

from orchestrator import run
from orchestrator.preflight import check_command_line


@hydra.main(version_base="1.3", config_path="sweeps", config_name="config")
def main(cfg: DictConfig):
    return run(cfg)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
