"""Child process of the verl engine: ``python -m training.engines.verl_support.verl_main <verl overrides...>``.

Composes verl's ``ppo_trainer`` config with the overrides (verl's own schema), registers this suite's
``rlvr`` advantage estimator and policy loss in this process and -- through Ray's
``worker_process_setup_hook`` -- in every Ray worker process, validates the config with verl's
``validate_config`` and runs verl's ``run_ppo``. The algorithm spec comes from the environment
variable ``RLVR_VERL_ALGO`` (set by :func:`training.engines.verl.train`). With ``RAY_ADDRESS`` set,
Ray joins that cluster (multi-node, see ``scripts/slurm/verl_ray_cluster.sh``) instead of starting one.
"""
from __future__ import annotations

import json
import os
import sys

from omegaconf import OmegaConf, open_dict


def main(argv: list[str]) -> None:
    from training.engines.verl import SPEC_ENV, compose_verl_config, register_with_verl, worker_runtime_env

    raw = os.environ.get(SPEC_ENV)
    if not raw:
        raise SystemExit(f"{SPEC_ENV} is not set: run this through engine=verl (training.engines.verl.train)")
    spec = json.loads(raw)
    register_with_verl(spec)
    config = compose_verl_config(argv)
    runtime_env = worker_runtime_env(spec, os.environ.get("VERL_FILE_LOGGER_PATH"))
    with open_dict(config):
        ray_init = config.ray_kwargs.ray_init
        merged = OmegaConf.merge(OmegaConf.create({"runtime_env": runtime_env}),
                                 OmegaConf.create({"runtime_env": OmegaConf.to_container(ray_init.get("runtime_env") or {})}))
        ray_init.runtime_env = merged.runtime_env

    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=TaskRunnerV1)


if __name__ == "__main__":
    main(sys.argv[1:])
