"""Local training engine: one process, CPU or one GPU, transformers + plain torch, as a package of phases.

Its entry points take the Hydra config and build the run's settings once (:class:`training.settings.RunSettings`:
every ``train.*`` key, the precision resolved on the device, what the algorithm needs); below them every phase takes
the settings record and typed data (:class:`training.batch.RolloutBatch`, :class:`training.batch.StepRollout`) and no
function receives the config (tests/test_engine_shape.py reads the code to keep it so):

- :mod:`.local_checks`: pre-flight of the engine's own settings and the memory plan;
- :mod:`.local_setup`: the policy, reference, optimiser, prompts, algorithm, scorer (token budget and layout) and
  rollout sampler (:class:`~.local_setup.LocalRun`);
- :mod:`.local_loop`: the loop, each step's phases in turn, then the final checkpoint;
- :mod:`.local_queue`: the step's rollout, generated now or taken from the staleness queue (with overlap, generated in
  a thread during the previous update);
- :mod:`.local_generation`: one step's generation, rewards and advantages;
- :mod:`.local_step`: the update (``ppo_epochs`` epochs of minibatch updates in micro-batches,
  :func:`training.update.update_policy`) and the step's metrics;
- :mod:`.local_validation`: the validation inside the loop (``train.validate_every``);
- :mod:`.local_state`: save and resume (the policy, optimiser, random states, the queue, a step stopped inside its
  update).

Algorithms enter only through the registry (``algo.advantage.name``, ``algo.policy_loss.name``); no module here
branches on an algorithm's name. Rollouts come from the run's rollout sampler (``train.rollout.sampler``: transformers
``generate`` on the policy itself, or the process's vLLM engine, which takes the policy's weights in place after every
optimiser step); the old-policy log-probs are the trainer's own (a forward pass of the policy), and with vLLM the
difference to the sampler's log-probs is logged as the training-inference mismatch and optionally corrected
(:mod:`training.mismatch`, :mod:`training.corrections`).

Memory: every teacher-forced pass (old, reference and entropy scoring, the update's forward and backward) holds at
most ``train.micro_batch_tokens`` positions (``auto``: the largest the memory plan fits on the device,
:mod:`training.memory_plan`), in the layout ``train.packing`` chooses and a start-up self-test confirms
(:func:`core.scoring.choose_layout`: responses packed after their shared prompt, no padding).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from core.lifecycle import STOP_REQUESTED, Preempted  # noqa: F401  (what a caller of train catches)
from training.engines import EngineChoices, register_engine
from training.engines.local.local_state import NumericFault  # noqa: F401
from training.run_state import has_state, load_state, state_paths  # noqa: F401  (the engine protocol; load_state for tests)
from training.settings import RunSettings, read

__all__ = ["STOP_REQUESTED", "Preempted", "NumericFault", "train", "validate", "memory_plan", "has_state",
           "state_paths"]

register_engine("local")  # no engine.* keys of its own (sweeps/engine/local.yaml: the name only)


def train(cfg, run_dir, log_metrics: Callable[[dict, int], None] = lambda m, s: None, logged_through: int = -1,
          choices: EngineChoices | None = None, validator=None) -> Path:
    """Train a policy with ``cfg.algo`` on ``cfg.data`` and save a Hugging Face checkpoint.

    Args:
        cfg: the composed run config (``model``, ``data``, ``algo``, ``train``, ``seed``): read once, into the run's
            :class:`training.settings.RunSettings`.
        run_dir: directory for this run's files; the checkpoint goes to ``run_dir/checkpoint``.
        log_metrics: ``fn(metrics: dict[str, float], step: int)``, called once per step.
        logged_through: the last step whose metrics the tracker already holds (resume: saved metrics of
            later steps are logged again, earlier ones are not, so every step is logged exactly once).
        choices: filled as the run decides (:class:`training.engines.EngineChoices`): the precision and why, the
            memory plan and scoring layout, the rollout sampler and why, the measured sampling time and peak memory.
        validator: the validation inside the loop (``train.validate_every``, :class:`training.engines.LoopValidation`):
            the starting policy and the policy after every due step evaluated through the run's rollout sampler
            (:mod:`.local_validation`), or None.
    Returns:
        Path of the final checkpoint (``run_dir/checkpoint``). With ``train.save_every = N > 0`` the policy
        after every N-th step is also kept, in ``run_dir/checkpoints/step_<steps done>``
        (:func:`core.lifecycle.saved_checkpoints`).
    Raises:
        Preempted: :data:`STOP_REQUESTED` was set; the full state was saved first: during the update, after the
            running optimiser step, with the step's rollout and the update so far (the resumed run finishes the step
            from there, as if never stopped); after the update, at the end of the running step; or, when the request
            came during the step's generation and scoring (:func:`core.lifecycle.abortable`), at once, as the last
            completed step's state with the prompt order and random states of the stopped step's start, so that the
            resumed run redoes that step exactly.
        MemoryError: the memory plan or the start-up check found that the run does not fit the device (one line
            naming ``train.micro_batch_tokens``).
        NumericFault: ``train.max_nonfinite_steps`` steps in a row had a non-finite term.

    Resumable: with ``train.checkpoint_every = N > 0`` the full state (policy, optimiser, scheduler, step,
    RNG states, prompt order, metrics not yet logged) is saved to ``run_dir/state`` every N steps and
    when a stop is requested; a later call with the same ``run_dir`` continues from the saved step and
    reproduces the uninterrupted run. Metrics are handed to ``log_metrics`` right after each save.

    Tasks that declare tools (``Task.tools``: question answering with search) roll out multi-turn episodes
    (:func:`core.agent.generate_with_tools`, ``tools.max_turns``, ``tools.max_obs_tokens``); the tools are opened
    for the run (a retrieval server started when ``tools.search.url`` is not set) and closed when it ends.
    """
    from training.engines.local.local_loop import run

    settings = RunSettings(**read(cfg))  # the config read once, packed into the run's one settings record
    return run(settings, Path(run_dir), log_metrics, logged_through, EngineChoices() if choices is None else choices,
               validator)


def validate(cfg) -> list[str]:
    """Pre-flight of the local engine's own settings (:func:`.local_checks.check`). Returns warnings.

    Raises:
        ValueError: a setting the engine cannot honour (one line naming the key).
    """
    from training.engines.local.local_checks import check

    return check(RunSettings.of(cfg))


def memory_plan(cfg, remote: bool = False):
    """The run's memory plan as pre-flight sees it and the one-line refusal when it does not fit its device (None
    when it fits or the device's size is unknown): :func:`.local_checks.plan`.

    Args:
        remote: the run trains on another machine (a cluster launcher): a GPU unless ``train.device`` says cpu; its
            size only when ``train.device_memory_gb`` says.
    Raises:
        ValueError: the model's shape is not known here (names ``model.path``).
    """
    from training.engines.local.local_checks import plan

    if remote:
        return plan(RunSettings.of(cfg, "cpu" if str(cfg.train.device) == "cpu" else "cuda"), remote=True)
    return plan(RunSettings.of(cfg))
