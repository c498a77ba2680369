"""The local engine's state phase: save a run's full state (policy, optimiser, scheduler, prompt order, random states,
metrics not yet logged, token counts, the training compute spent, the staleness queue, a step stopped inside its update) and resume from it.

A saved state holds tensors, numbers and strings only (:func:`training.run_state.save_state`), so reading it runs no
code; a resumed run continues exactly as the uninterrupted one would have.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.lora import adapter_state, has_adapters, save_adapter
from training.batch import RolloutBatch, StepRollout
from training.run_state import STATE_FILE, RandomStates, has_state, load_state, save_state


class NumericFault(RuntimeError):
    """``train.max_nonfinite_steps`` steps in a row had a non-finite term (their updates skipped), or the weights
    became non-finite: the run stops, its last saved state finite (the message names the step and the term)."""


def finite_weights(model) -> bool:
    """Whether every trainable parameter of ``model`` is finite (a state with non-finite weights is never saved)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.requires_grad)


@dataclass
class InFlight:
    """A step stopped inside its update: its rollout (``ro``) and the ``done`` optimiser steps taken, with their
    ``metrics``. Saved with the state (tensors, numbers and strings only), so the resumed run finishes the step on the
    same samples from the same point, as if it had never stopped."""

    step: int
    ro: StepRollout
    done: int
    metrics: list

    def state_dict(self) -> dict:
        return {"step": self.step, "done": self.done, "metrics": self.metrics, **rollout_state(self.ro)}

    @classmethod
    def from_state_dict(cls, d: dict) -> "InFlight":
        return cls(int(d["step"]), rollout_from_state(d), int(d["done"]), list(d["metrics"]))


def save_hf(run, path: Path) -> None:
    """The policy in Hugging Face format at ``path`` (with LoRA, peft's adapter format naming the base it loads on)."""
    if has_adapters(run.model):
        from core.models import model_path

        save_adapter(run.model, run.tokenizer, path, model_path(run.settings.model))
        return
    run.model.save_pretrained(path)
    run.tokenizer.save_pretrained(path)


def rollout_state(ro: StepRollout) -> dict:
    """A step's rollout as tensors, numbers and strings (a saved state: :class:`InFlight`, the staleness queue)."""
    return {"batch": ro.batch.state_dict(), "sampled": [b.state_dict() for b in ro.sampled],
            "advantages": ro.advantages, "adv_metrics": dict(ro.adv_metrics), "rounds": ro.rounds,
            "phases": dict(ro.phases), "seconds": ro.seconds, "version": ro.version, "generated": dict(ro.generated)}


def rollout_from_state(d: dict) -> StepRollout:
    """The rollout :func:`rollout_state` gave (a state saved before the queue existed has no version: 0)."""
    return StepRollout(RolloutBatch.from_state_dict(d["batch"]), [RolloutBatch.from_state_dict(b) for b in d["sampled"]],
                       d["advantages"], dict(d["adv_metrics"]), int(d["rounds"]), dict(d["phases"]),
                       float(d["seconds"]), int(d.get("version", 0)), dict(d.get("generated") or {}))


def resume(run, log_metrics, logged_through: int) -> int:
    """Continue ``run`` (:class:`~training.engines.local.local_setup.LocalRun`) from its folder's saved state, if any:
    weights, optimiser, scheduler, prompt order, random states, token counts, the queue and a step stopped in its
    update; the saved metrics of steps after ``logged_through`` are logged. Returns the first step to run.

    Raises:
        RuntimeError: the saved state does not match the run's LoRA adapters.
    """
    if not has_state(run.run_dir):
        return 0
    st = load_state(run.run_dir, run.device)
    if has_adapters(run.model):  # the state holds the adapters only; the frozen base is loaded from its source
        missing, unexpected = run.model.load_state_dict(st["model"], strict=False)
        lost = [k for k in missing if "lora_" in k]
        if unexpected or lost:
            raise RuntimeError(f"{run.run_dir}: the saved state does not match this run's adapters (train.lora): "
                               f"unexpected {unexpected[:3]}, missing {lost[:3]}")
    else:
        run.model.load_state_dict(st["model"])
    run.optimizer.load_state_dict(st["optimizer"])
    run.scheduler.load_state_dict(st["scheduler"])
    run.prompts.load_state_dict(st)
    RandomStates.from_state_dict(st).restore()
    if "token_probs" in st:
        run.token_probs.load_state_dict(st["token_probs"])
    if st.get("inflight"):
        run.inflight = InFlight.from_state_dict(st["inflight"])
    run.queue = {int(s_): rollout_from_state(d) for s_, d in (st.get("queue") or {}).items()}
    run.compute_spent = float(st.get("compute_spent", 0.0))
    for s_, m_ in st["pending"]:
        if s_ > logged_through:
            log_metrics(m_, s_)
    return int(st["step"]) + 1


def save(run, step: int, inflight: InFlight | None = None) -> Path:
    """The full state of ``run`` after ``step`` (atomically: a kill mid-save leaves the previous one); with LoRA the
    adapters, not the frozen base. ``inflight``: step ``step + 1``'s rollout and the part of its update already done (a
    stop inside the update), which the resumed run finishes.

    Raises:
        NumericFault: a trainable weight is not finite (the previous state is kept)."""
    if not finite_weights(run.model):
        raise NumericFault(f"step {step}: the policy's weights are not finite; the state is not saved (the last saved "
                           f"state in {run.run_dir / STATE_FILE} is kept)")
    return save_state(run.run_dir, {
        "model": adapter_state(run.model) if has_adapters(run.model) else run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        **run.prompts.state_dict(), **RandomStates.capture().state_dict(), "step": step, "pending": run.pending,
        "token_probs": run.token_probs.state_dict(), "inflight": inflight.state_dict() if inflight else None,
        "queue": {int(s_): rollout_state(ro) for s_, ro in run.queue.items()}, "compute_spent": run.compute_spent})
