"""The local engine's validation phase (``train.validate_every = N``, docs/curves.md): the policy at steps 0, N, 2N, ...
and the last evaluated inside the loop, after the step's state is saved and its metrics handed on, through the run's own
rollout sampler (vLLM's engine holding the policy's weights, or transformers ``generate`` on the policy itself), so
nothing is kept on disk for it and no second copy of the model is loaded. The validator
(:class:`training.engines.LoopValidation`, the orchestrator's) owns what is sampled, scored and logged.

With ``train.rollout.overlap`` the validation never runs beside a generation: the generation started during a step's
update is joined before the update's weight sync, so by the time a step is validated no thread samples; the next
step's generation starts with the next update. The validation draws from its own seeds (the validator's) and leaves
the global random generators as it found them, so a run with validation trains bit for bit as one without."""
from __future__ import annotations

from functools import partial
from pathlib import Path

import torch

from core.lifecycle import save_atomically
from training.engines import validation_steps
from training.engines.local.local_state import save_hf
from training.run_state import RandomStates


def validate_policy(run, done: int) -> None:
    """Validate ``run``'s policy after ``done`` steps when that step is due (:func:`training.engines.validation_steps`)
    and the run has a validator: sample through :class:`core.sampling.RolloutSampler` over ``run.rollout``, the
    training compute spent so far (``run.compute_spent``, FLOPs) handed along; the policy saved where the validator
    asks (``eval.select_on=validation``, never the last step's: that is the final checkpoint). Not when a resumed
    run finishes a step stopped inside its update (its weights are mid-step; the step's validation was logged before
    that step began).

    Raises:
        Exception: what the validator raised (its sampling or scoring failed: the run fails, resumable from the
            state saved before this validation)."""
    v, s = run.validator, run.settings
    if v is None or done not in validation_steps(v.every, s.steps) or run.inflight is not None:
        return
    from core.sampling import RolloutSampler

    states = RandomStates.capture()
    devices = [run.device] if run.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            keep = v(done, RolloutSampler(run.rollout, run.tokenizer, _precision(run)), run.compute_spent)
    finally:
        states.restore()
    if keep is not None and done < s.steps:
        save_atomically(Path(keep), partial(save_hf, run))


def _precision(run) -> str:
    """The dtype the run's rollout samples in: vLLM's engine's (``train.rollout.dtype`` as resolved), else the
    policy's own."""
    if run.rollout.name == "vllm":
        return run.settings.rollout_dtype
    return str(next(run.model.parameters()).dtype).removeprefix("torch.")
