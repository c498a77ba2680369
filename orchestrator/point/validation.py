"""The validation along training (``train.validate_every = N > 0``, docs/curves.md), as the orchestrator owns it: the
training engine hands it the policy after steps 0, N, 2N, ... and the last inside its loop, through its own rollout
sampler (:class:`training.engines.LoopValidation`); :class:`LoopValidator` samples the validation split, scores it,
logs the point at its step at once (live in MLflow), rewrites the run's ``validation.parquet`` artifact, and with
``eval.select_on=validation`` says which policies to keep on disk (only those it may still choose).

The validation protocol: the training's rollout sampler at the training precision (no second copy of the model), the
evaluation's decoding (``eval.temperature``, ``top_p``, ``max_new_tokens``, ``seed``) with ``eval.validation.n``
samples per prompt, ks 1 and ``eval.validation.k``; tagged on the run as ``rlvr.val_protocol``."""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from omegaconf import OmegaConf

from core import tags
from orchestrator.store import tracking

log = logging.getLogger("rlvr")

VALIDATION_SERIES = "validation.parquet"
DONE = ".val_logged"  # in run_dir/validation/step_<N>: the point's logged metrics (JSON), so it is never logged twice
PROTOCOL_TAG = "rlvr.val_protocol"


def validation_job(cfg, ks) -> tuple[str, dict, object]:
    """(the training task, {task: its validation split's rows}, the ``eval`` config that samples them: the split's
    benchmark only, ``eval.validation.n`` samples, ``ks``, the main temperature, no entropy) for
    :class:`LoopValidator` and :func:`orchestrator.point.run_evaluation.select_on_validation`."""
    from core.tasks import load_prompts

    task = str(cfg.data.name)
    vcfg = OmegaConf.merge(cfg.eval, {"benchmarks": [task], "n": int(cfg.eval.validation.n), "ks": list(ks),
                                      "decoding": None, "extra_temperatures": [], "entropy": False, "max_prompts": None})
    return task, {task: load_prompts(cfg.data, "validation")}, vcfg


def logged_points(run_dir: Path) -> dict[int, dict]:
    """{step: the metrics logged for it} of every validation point of the run in ``run_dir`` so far."""
    out = {}
    for done in (Path(run_dir) / "validation").glob(f"step_*/{DONE}"):
        try:
            metrics = json.loads(done.read_text())
        except ValueError:
            continue
        if isinstance(metrics, dict):  # (the validation after training, before this protocol, wrote its step only)
            out[int(done.parent.name.split("_", 1)[1])] = metrics
    return dict(sorted(out.items()))


def write_series(run_dir: Path, store: tracking.Store, run_id: str | None = None) -> Path | None:
    """Every logged validation point's samples, with ``step`` and ``compute_flops`` columns, in one
    ``run_dir/validation.parquet``, logged as the run's artifact (the report's curve section and
    ``python -m evaluation.recompute --curves`` read it) of the run ``run_id`` (default: the active run). Returns its
    path, or None before the first point."""
    import pandas as pd

    points = logged_points(run_dir)
    if not points:
        return None
    frames = [pd.read_parquet(Path(run_dir) / "validation" / f"step_{s}" / "samples.parquet")
              .assign(step=s, compute_flops=float(m["val/compute_flops"])) for s, m in points.items()]
    series = Path(run_dir) / VALIDATION_SERIES
    pd.concat(frames, ignore_index=True).to_parquet(series)
    store.log_artifact(series, None, run_id)
    return series


@dataclass
class LoopValidator:
    """The validator the orchestrator hands a training engine (:class:`training.engines.LoopValidation`).

    Args:
        cfg: the point's config, its ``eval`` group pinned to the sweep's protocol (``train.validate_every``,
            ``train.steps``, ``data`` (the validation split), ``eval.validation.n`` and ``k``, ``eval.select_on``,
            ``train.keep_top_k``).
        run_dir: the run's folder (``validation/step_<N>`` per point).
        store: the tracking store (the artifact, the protocol tag).
        put: ``put(metrics, step)``: the run's metric queue, in order with the training steps' metrics.
    """

    cfg: object
    run_dir: Path
    store: tracking.Store
    put: Callable[[dict, int], None]
    every: int = field(init=False)

    def __post_init__(self):
        self.every = int(self.cfg.train.validate_every)
        self.steps, self.k = int(self.cfg.train.steps), int(self.cfg.eval.validation.k)
        self.task, self.rows, self.vcfg = validation_job(self.cfg, sorted({1, self.k}))
        self.select = str(self.cfg.eval.get("select_on", "final")) == "validation"
        self.keep_top = int(self.cfg.train.get("keep_top_k") or 1)
        from evaluation.pipeline import settings_from

        self.split, self.n = self.rows[self.task], int(self.vcfg.n)  # what an engine that samples itself reads
        self.settings = settings_from(self.vcfg, bool(self.cfg.model.get("chat_template", True)))
        self.run_id = self.store.active_run_id()  # set and logged by id: an engine may call from another thread

    def protocol(self, sampler) -> str:
        """The validation protocol in words (tagged ``rlvr.val_protocol``)."""
        v = self.vcfg
        longest = int(getattr(sampler, "max_new_tokens", v.max_new_tokens))  # verl samples at its response length
        return (f"{sampler.name} ({getattr(sampler, 'precision', '?')}), n={int(v.n)}, temperature={float(v.temperature)}, "
                f"top_p={float(v.top_p)}, max_new_tokens={longest}, seed={int(v.seed)}, "
                f"{len(self.rows[self.task])} held-out {self.task} prompts")

    def __call__(self, step: int, sampler, compute_flops: float) -> Path | None:
        """Validate the policy after ``step`` steps through ``sampler`` (once: a logged point is not sampled again),
        log it at ``step`` (``val/<task>/<metric>``, ``val/compute_flops``, ``time/val_s``) and the series so far.
        Returns the folder to keep the policy in (``eval.select_on=validation``), or None."""
        from evaluation.pipeline import EvalJob, evaluate

        step = int(step)
        out_dir = Path(self.run_dir) / "validation" / f"step_{step}"
        done = out_dir / DONE
        if not done.exists():
            self.store.set_tags({PROTOCOL_TAG: self.protocol(sampler)}, self.run_id)
            t0 = time.time()
            job = EvalJob(self.vcfg, chat_template=bool(self.cfg.model.get("chat_template", True)),
                          tools_cfg=self.cfg.get("tools"), rows=self.rows)
            metrics, _ = evaluate(sampler, job, out_dir)
            val = {"val/" + key.removeprefix("eval/"): float(v) for key, v in metrics.items()
                   if key.startswith("eval/") and v is not None}
            val |= {"val/compute_flops": float(compute_flops), "time/val_s": time.time() - t0}
            self.put(val, step)
            done.write_text(json.dumps(val))
            log.info("validation: step %d pass@1 %.4f (%d prompts x %d samples, %.3g FLOPs before it, %.1f s)", step,
                     val.get(f"val/{self.task}/pass_at_1", float("nan")), len(self.rows[self.task]), int(self.vcfg.n),
                     compute_flops, val["time/val_s"])
            write_series(self.run_dir, self.store, self.run_id)
        return self._keep(step)

    def score(self, metrics: dict) -> float:
        """The number ``eval.select_on=validation`` ranks on: the point's unbiased pass@k (k = ``eval.validation.k``)."""
        return float(metrics[f"val/{self.task}/pass_at_{self.k}"])

    def ranked(self) -> list[int]:
        """The validated steps, best first (the highest pass@k, the earliest on a tie)."""
        points = logged_points(self.run_dir)
        return sorted(points, key=lambda s: (-self.score(points[s]), s))

    def _keep(self, step: int) -> Path | None:
        """With ``eval.select_on=validation``: the folder to keep step ``step``'s policy in when it is among the
        ``train.keep_top_k`` (default 1) best validated steps before the last (the last is the final checkpoint),
        after removing the kept policies that dropped out; else None."""
        from core.lifecycle import saved_checkpoints, selectable_checkpoint_dir

        if not self.select:
            return None
        top = [s for s in self.ranked() if s < self.steps][: self.keep_top]
        for s, path in saved_checkpoints(self.run_dir, "selectable"):
            if s not in top:
                shutil.rmtree(path, ignore_errors=True)
        return selectable_checkpoint_dir(self.run_dir, step) if step in top and step < self.steps else None

    def choose(self, final: Path) -> tuple[int, Path]:
        """After training: the step and policy ``eval.select_on=validation`` evaluates on the benchmarks, among the
        kept policies and the final one, by :meth:`ranked`; tagged ``rlvr.selected_step`` and ``rlvr.selected_on``."""
        from core.lifecycle import saved_checkpoints

        kept = dict(saved_checkpoints(self.run_dir, "selectable")) | {self.steps: Path(final)}
        best = next((s for s in self.ranked() if s in kept), None)
        if best is None:  # no point validated here (a run that took another run's checkpoint): the final one
            log.warning("validation: no point was validated in %s; the final checkpoint is evaluated", self.run_dir)
            return self.steps, Path(final)
        self.store.set_tags({tags.SELECTED_STEP: str(best), tags.SELECTED_ON: (
            f"validation pass@{self.k} in the loop: {len(self.rows[self.task])} held-out {self.task} prompts x "
            f"{int(self.vcfg.n)} samples")})
        log.info("validation: step %d chosen of %s", best, sorted(logged_points(self.run_dir)))
        return best, kept[best]
