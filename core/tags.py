"""The names of the tags this suite sets on MLflow runs, in one place: the orchestrator and the evaluation's protocol
(:mod:`evaluation.protocol`) write them, the report (:mod:`reports.load`, :mod:`reports.data`) and the command-line
tools read them. Plain names, no MLflow: every layer may import this module. A search filter names tag ``X`` as
``tags.`X```; the table of ``mlflow.search_runs`` as the column ``tags.X`` (:func:`column`).

Identity and kind (:mod:`orchestrator.point.identity`, :mod:`orchestrator.point.decision`): ``CONFIG_HASH`` (the point's identity),
``TRAIN_HASH`` (runs sharing it share one trained checkpoint), ``KIND`` (``trained``, ``duplicate`` or ``base``),
``DUPLICATE_OF``, ``TRAINED_IN`` (a run that evaluates a checkpoint another run trained: that run),
``RECOVERED_FROM`` (a run that re-evaluates a corrupt run's good checkpoint), ``INVALID`` (why a run is not trusted).
Where a run came from: ``SWEEP_ID`` (its Hydra sweep folder), ``JOB_NUM``, ``POINT``, ``RUN_DIR``, ``HOST``, ``PID``,
``SLURM_JOB_ID``, ``REQUEUE_COUNT``, ``GIT_COMMIT``, ``ALGO``. Leases (:mod:`orchestrator.store.lease`): ``OWNER``,
``HEARTBEAT``. What the engine chose: ``ROLLOUT_SAMPLER``, ``PRECISION``, ``PACKING`` and friends; an ``auto``
choice's estimate against what happened: ``ESTIMATE_PREFIX`` + the setting. How a run was evaluated:
``EVAL_PROTOCOL`` (JSON), ``EVAL_PROTOCOL_ID``, ``SAMPLER``, ``EVAL_DTYPE``; what changed in its environment while it
ran: ``ENV_CHANGED`` (the environment itself: ``ENV_PREFIX`` + key).
"""
from __future__ import annotations

CONFIG_HASH = "rlvr.config_hash"
TRAIN_HASH = "rlvr.train_hash"
KIND = "rlvr.kind"  # trained | duplicate | base
DUPLICATE_OF = "rlvr.duplicate_of"
TRAINED_IN = "rlvr.trained_in"
RECOVERED_FROM = "rlvr.recovered_from"
INVALID = "rlvr.invalid"

SWEEP_ID = "rlvr.sweep_id"
JOB_NUM = "rlvr.job_num"
POINT = "rlvr.point"
RUN_DIR = "rlvr.run_dir"
HOST = "rlvr.host"
PID = "rlvr.pid"
SLURM_JOB_ID = "rlvr.slurm_job_id"
REQUEUE_COUNT = "rlvr.requeue_count"
GIT_COMMIT = "rlvr.git_commit"
COMMAND = "rlvr.command"  # a sweep run's command line
ALGO = "rlvr.algo"
WARNINGS = "rlvr.warnings"
ACTIVE_S = "rlvr.active_s"  # seconds the run was active, over all its jobs
CHECKPOINT = "rlvr.checkpoint"

OWNER = "rlvr.owner"
HEARTBEAT = "rlvr.heartbeat"

ROLLOUT_SAMPLER = "rlvr.rollout_sampler"
ROLLOUT_SAMPLER_REASON = "rlvr.rollout_sampler_reason"
PRECISION = "rlvr.precision"
PRECISION_REASON = "rlvr.precision_reason"
ROLLOUT_DTYPE = "rlvr.rollout_dtype"
PACKING = "rlvr.packing"
PACKING_REASON = "rlvr.packing_reason"
MICRO_BATCH_TOKENS = "rlvr.micro_batch_tokens"
LORA_RANK = "rlvr.lora_rank"
ESTIMATE_PREFIX = "rlvr.estimate."

EVAL_PROTOCOL = "rlvr.eval_protocol"  # the protocol a run was evaluated under (JSON)
EVAL_PROTOCOL_ID = "rlvr.eval_protocol_id"  # its hash
SAMPLER = "rlvr.sampler"  # the evaluation's sampler
EVAL_DTYPE = "rlvr.eval_dtype"
ENV_PREFIX = "rlvr.env."  # the run's environment (orchestrator.point.provenance)
ENV_CHANGED = "rlvr.env_changed"
ENTROPY_METHOD = "rlvr.entropy_method"
BASE_RUN_ID = "rlvr.base_run_id"
FLIP_RULE = "rlvr.flip_rule"
SELECTED_STEP = "rlvr.selected_step"
SELECTED_ON = "rlvr.selected_on"
REPRODUCES = "rlvr.reproduces"


def column(tag: str) -> str:
    """The column of ``tag`` in ``mlflow.search_runs``'s table: ``tags.<tag>``."""
    return f"tags.{tag}"
