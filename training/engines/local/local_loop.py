"""The local engine's loop: a run from its settings to its final checkpoint (:func:`run`), the steps read as their
phases (:func:`train_loop`): the step's rollout (:mod:`local_queue`), its update and metrics (:mod:`local_step`), the
kept policy and the saved state (:mod:`local_state`)."""
from __future__ import annotations

import logging
import time
from functools import partial
from pathlib import Path

from tqdm.auto import trange

from core.lifecycle import (
    STOP_REQUESTED,
    Preempted,
    final_checkpoint_dir,
    save_atomically,
    step_checkpoint_dir,
)
from core.progress import LineProgress
from training.engines import EngineChoices, PrecisionChoice
from training.engines.local.local_checks import plan
from training.engines.local.local_queue import Ahead, step_rollout
from training.engines.local.local_setup import LocalRun, open_rollout, setup
from training.engines.local.local_state import NumericFault, resume, save, save_hf
from training.engines.local.local_step import metrics_of, update_step
from training.engines.local.local_validation import validate_policy
from training.settings import RunSettings
from training.step_metrics import peak_memory_gb
from training.token_probs import ARTIFACT as TOKEN_PROBS
from training.update import NONFINITE_TERMS

log = logging.getLogger("rlvr")


def run(s: RunSettings, run_dir: Path, log_metrics, logged_through: int, choices: EngineChoices,
        validator=None) -> Path:
    """Train with the settings ``s`` in ``run_dir`` (:func:`training.engines.local.train` builds them): the precision
    and the memory plan recorded in ``choices``, the plan checked on this machine before any weight loads, the tools
    opened for the run (closed when it ends), then :func:`setup` and :func:`train_loop` (validating inside the loop
    with ``validator``, a :class:`training.engines.LoopValidation`, when given). Returns the final checkpoint.

    Raises:
        MemoryError: the memory plan does not fit the device (one line naming ``train.micro_batch_tokens``).
    """
    from core.tasks import load_prompts
    from core.tools import close_tools, open_tools_for

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    choices.precision = PrecisionChoice(s.precision, s.precision_reason, s.device_type, s.rollout_dtype)
    if s.memory_check is not False:  # on the training machine, before any weight loads
        _, refused = plan(s)
        if refused:
            raise MemoryError(refused)
    tools = open_tools_for(load_prompts(s.data, "train"), s.tools)
    try:
        local = setup(s, Path(run_dir), tools, choices)
        local.validator = validator
        return train_loop(local, log_metrics, logged_through)
    finally:
        close_tools(tools)


def train_loop(run: LocalRun, log_metrics, logged_through: int) -> Path:
    """The run's life after :func:`setup`: resume, then each step's rollout (:func:`local_queue.step_rollout`),
    update (:func:`local_step.update_step`), metrics (:func:`local_step.metrics_of`), kept policy and saved state; the
    final checkpoint. With ``train.validate_every`` the validation phase (:func:`local_validation.validate_policy`)
    evaluates the starting policy before the first step and the policy after each due step, once the step's state is
    saved and its metrics handed on; a run stopped in between (a stop request is honoured when the state is saved)
    validates that policy first when it resumes (the validator skips a step it logged before).

    Raises:
        Preempted: a stop request (the state saved first: :func:`local_state.save`).
        NumericFault: ``train.max_nonfinite_steps`` steps in a row skipped their updates.
    """
    from training.mismatch import SyncGuard

    s = run.settings
    start_step = resume(run, log_metrics, logged_through)
    n_steps = s.steps
    t_open = time.perf_counter()
    run.rollout = open_rollout(run, n_steps - start_step)
    run.ahead = Ahead(run) if s.rollout.overlap and s.rollout.staleness else None
    sampled_s = time.perf_counter() - t_open  # the sampler's start (vLLM's engine), then each step's generation
    validate_policy(run, start_step)  # the starting policy (step 0), or a resumed step's validation not yet logged

    def flush() -> None:
        for s_, m_ in run.pending:
            log_metrics(m_, s_)
        run.pending.clear()

    guard = SyncGuard(float32=s.rollout_dtype == "float32" and not s.bf16)
    faulty = 0  # steps in a row with a skipped update
    lines = LineProgress(f"train {s.algo.name}", n_steps, start_step)
    for step in trange(start_step, n_steps, initial=start_step, total=n_steps, desc=f"train {s.algo.name}",
                       unit="step", disable=None):
        t_step = time.perf_counter()
        inflight, run.inflight = run.inflight, None
        if inflight is not None and inflight.step != step:
            inflight = None
        ro = inflight.ro if inflight is not None else step_rollout(run, step, flush)
        update_metrics, times = update_step(run, ro, step, inflight, flush, t_step)
        metrics = metrics_of(run, ro, step, update_metrics, times, guard)
        sampled_s += float(metrics.get("generate_time_s") or 0.0)
        lines.update(step + 1, reward=metrics["reward_mean"], accuracy=metrics["accuracy"],
                     step_s=round(times.step, 1))
        # every metric, a non-finite one too (logged as NaN or infinity, never dropped)
        run.pending.append((step, {f"train/{k}": float(v) for k, v in metrics.items() if v is not None}))
        run.compute_spent += float(metrics["flops"])
        terms = [t for t in NONFINITE_TERMS if metrics.get(f"nonfinite_{t}")]
        faulty = faulty + 1 if terms else 0
        if terms:
            log.warning("step %d: %d of its optimiser steps skipped: non-finite %s (weights and optimiser state "
                        "untouched; train/nonfinite_skips)", step, int(metrics["nonfinite_skips"]), ", ".join(terms))

        keep(run, step, flush)  # the kept policy, the saved state (with these metrics), the tracker
        if faulty >= s.max_nonfinite_steps:
            raise NumericFault(f"step {step}: non-finite {', '.join(terms)} in {faulty} steps in a row "
                               f"(train.max_nonfinite_steps={s.max_nonfinite_steps}): every update of those steps was "
                               "skipped; the run stops with its weights and last saved state finite")
        validate_policy(run, step + 1)  # the policy after step + 1 steps, when due (a stop in keep: on resume)
    lines.close()
    finish(run, sampled_s)
    return save_atomically(final_checkpoint_dir(run.run_dir), partial(save_hf, run))


def keep(run: LocalRun, step: int, flush) -> None:
    """What step ``step`` leaves behind, in this order: the kept policy (``train.save_every``; the last step's is the
    final checkpoint), then the full state with the
    step's metrics (``train.checkpoint_every``, the last step, or a stop request), then the metrics to the tracker
    (``flush``; with checkpointing only together with a saved state, so a resume logs every step exactly once).

    Raises:
        Preempted: a stop was requested (after the state is saved).
    """
    s = run.settings
    n_steps, every, done = s.steps, s.checkpoint_every, step + 1
    if s.save_every and done % s.save_every == 0 and done < n_steps:  # a trajectory point (the last is final)
        save_atomically(step_checkpoint_dir(run.run_dir, done), partial(save_hf, run))
    stop = STOP_REQUESTED.is_set()
    saved = stop or (every and (done % every == 0 or step == n_steps - 1))
    if saved:
        path = save(run, step)  # exactly-once on resume: the metrics travel with the state
    if saved or not every:  # with checkpointing, metrics reach the tracker only together with a saved state
        flush()
    if stop:
        raise Preempted(f"stopped after step {done}/{n_steps} (MLflow step {step}) on request; state saved to {path}")


def finish(run: LocalRun, sampled_s: float) -> None:
    """After the last step: the rollout sampler closed, the sampling time and peak memory recorded in the run's
    choices, the sampled tokens' probabilities written."""
    run.rollout.close()  # the shared vLLM engine stays up, holding the final policy, for the run's evaluation
    run.choices.rollout.measured_s = round(float(sampled_s), 2)  # beside auto's estimate (tagged; a 3x miss warns)
    # a GPU's allocated memory, or the process's peak resident memory on the CPU (which includes what an earlier
    # point of the same process held), beside the plan
    run.choices.memory["run_peak_gb"] = round(float(peak_memory_gb(run.device)), 3)
    run.token_probs.write(run.run_dir / TOKEN_PROBS, run.tokenizer)
