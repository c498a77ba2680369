"""A trained run's evaluation: the checkpoints it evaluates (:func:`checkpoints_to_evaluate`, with
``eval.select_on=validation`` the one :func:`select_on_validation` chooses, or with the validation inside the loop
:meth:`orchestrator.point.validation.LoopValidator.choose`), each logged at its training step
(:func:`evaluate_run`), the flip rates against the base model (added later to a run without them:
:func:`backfill_flips`), and the run's integrity record (:func:`record_integrity`)."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from core import tags
from orchestrator.point import integrity
from orchestrator.store import tracking

log = logging.getLogger("rlvr")


def record_integrity(run_dir: Path, ckpt: Path) -> Path:
    """Write ``run_dir/integrity.json`` (:mod:`orchestrator.point.integrity`) for the files this run logged and the
    checkpoints and samples later stages read; returns its path."""
    artifacts = {"config.yaml": run_dir / "config.yaml"}
    run_files = integrity.hash_tree(Path(ckpt), "checkpoint") if Path(ckpt) == run_dir / "checkpoint" else {}
    from core.lifecycle import saved_checkpoints

    for step, path in saved_checkpoints(run_dir):
        run_files |= integrity.hash_tree(path, f"checkpoints/step_{step}")
    for marker in sorted((run_dir / "eval").rglob(".logged")) if (run_dir / "eval").is_dir() else []:
        out_dir = marker.parent
        rel = out_dir.relative_to(run_dir / "eval").as_posix()
        prefix = "" if rel == "." else f"eval/{rel}/"
        for f in sorted(out_dir.iterdir()):
            if f.is_file() and not f.name.startswith(".") and f.suffix in (".parquet", ".csv"):
                artifacts[prefix + f.name] = f
        run_files[f"eval/{'' if rel == '.' else rel + '/'}samples.parquet"] = integrity.sha256(out_dir / "samples.parquet")
    return integrity.write_record(run_dir, artifacts, run_files)


def free_memory() -> None:
    """Return the training engine's memory (GPU memory above all) before an evaluation engine starts."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _token_budget(cfg) -> int | None:
    """``train.micro_batch_tokens`` when it is a number (the evaluation's entropy passes hold at most that many
    positions too), else None."""
    budget = OmegaConf.select(cfg, "train.micro_batch_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def flip_rule(k) -> str:
    from evaluation.metrics.difficulty import flip_rule as rule

    return rule(None if k is None else int(k))


def checkpoints_to_evaluate(cfg, run_dir: Path, final: Path, final_step: int | None = None
                            ) -> list[tuple[int, Path, Path, bool]]:
    """``[(step, checkpoint, evaluation folder, is_final), ...]``: with ``eval.checkpoints=all`` every kept
    checkpoint (``train.save_every``) in ``run_dir/eval/step_<N>``, then the final one in ``run_dir/eval``;
    ``step`` is the number of training steps behind the checkpoint (the final: ``final_step``, by default
    ``train.steps``; with ``eval.select_on=validation`` the chosen checkpoint's)."""
    from core.lifecycle import saved_checkpoints

    out = []
    if str(cfg.eval.get("checkpoints", "final")) == "all":
        out = [(s, p, run_dir / "eval" / f"step_{s}", False) for s, p in saved_checkpoints(run_dir) if s < int(cfg.train.steps)]
    step = int(cfg.train.steps) if final_step is None else int(final_step)
    return out + [(step, Path(final), run_dir / "eval", True)]


def select_on_validation(cfg, run_dir: Path, final: Path, store: tracking.Store) -> tuple[int, Path]:
    """The checkpoint the benchmarks evaluate under ``eval.select_on=validation``: every kept checkpoint
    (``train.save_every``) and the final one are sampled ``eval.validation.n`` times on each prompt of the
    validation split (``data.validation_prompts`` training prompts held out of training, :func:`core.tasks.load_prompts`);
    the one with the highest unbiased pass@k (``k = eval.validation.k``) is chosen, the earliest on a tie. Each
    score is logged to the active run as ``val/pass_at_<k>`` at its step (once; its samples kept in
    ``run_dir/validation/step_<N>``), and the choice as the tags ``rlvr.selected_step`` and ``rlvr.selected_on``.
    With ``train.keep_top_k = K`` only the K best kept checkpoints stay on disk afterwards (the final one, which
    the run's record points to, always stays). The benchmarks never take part in the choice (understand-r1-zero#21).
    Store calls go through ``store`` (:class:`orchestrator.store.tracking.Store`).

    Returns:
        (step, checkpoint folder) of the chosen checkpoint.
    """
    from core.lifecycle import saved_checkpoints
    from evaluation.pipeline import EvalJob, evaluate_checkpoint
    from orchestrator.point.validation import validation_job

    steps, n, k = int(cfg.train.steps), int(cfg.eval.validation.n), int(cfg.eval.validation.k)
    task, rows, vcfg = validation_job(cfg, [k])
    chat = bool(cfg.model.get("chat_template", True))
    cands = [(s, p) for s, p in saved_checkpoints(run_dir) if s < steps] + [(steps, Path(final))]
    scores = {}
    for step, path in cands:
        out_dir = run_dir / "validation" / f"step_{step}"
        job = EvalJob(vcfg, chat_template=chat, tools_cfg=cfg.get("tools"), rows=rows)
        metrics, _, _ = evaluate_checkpoint(path, job, out_dir, temperatures=False)
        scores[step] = float(metrics[f"eval/{task}/pass_at_{k}"])
        if not (out_dir / ".logged").exists():
            store.log_metrics({f"val/pass_at_{k}": scores[step]}, step)
            (out_dir / ".logged").write_text(str(step))
        log.info("validation: step %d pass@%d %.4f (%d prompts x %d samples)", step, k, scores[step], len(rows[task]), n)
    ranked = sorted(cands, key=lambda c: (-scores[c[0]], c[0]))
    best_step, best = ranked[0]
    store.set_tags({tags.SELECTED_STEP: str(best_step),
                    tags.SELECTED_ON: f"validation pass@{k}: {len(rows[task])} held-out {task} prompts x {n} samples"})
    keep = cfg.train.get("keep_top_k")
    if keep:
        for step, path in ranked[int(keep):]:
            if step != steps:
                shutil.rmtree(path, ignore_errors=True)
    log.info("validation: step %d chosen of %s", best_step, [s for s, _ in cands])
    return best_step, Path(best)


def _log_files(store: tracking.Store, files: dict, prefix: str | None) -> None:
    for rel, f in files.items():
        sub = str(Path(rel).parent)
        store.log_artifact(f, "/".join(x for x in (prefix, None if sub == "." else sub) if x))


def evaluate_run(cfg, run_dir: Path, final: Path, heldout, base, store: tracking.Store) -> dict:
    """Evaluate a trained run's checkpoints (:func:`checkpoints_to_evaluate`) and log each to the active MLflow
    run at its training step, so MLflow draws every evaluation metric against steps; then, with ``base`` (an
    :class:`orchestrator.point.base_model.BaseEvaluation`, or None for no flip rates), wait for the base model's samples and log every evaluation's
    flip rates (``eval/<bench>/flip/<bucket>/<measure>``, ``flip_rates.csv``). Files of a non-final checkpoint
    go under ``eval/step_<N>/`` in the run's artifacts. An evaluation already logged (a marker file in its
    folder, e.g. before a requeue) is not logged twice. Store calls go through ``store``
    (:class:`orchestrator.store.tracking.Store`).

    Returns:
        The final checkpoint's metrics (flip rates included).
    """
    import pandas as pd

    from evaluation import protocol as eval_protocol
    from evaluation.pipeline import EvalJob, evaluate_checkpoint
    from evaluation.tables import flip_metrics
    from orchestrator.point.validation import LoopValidator, write_series

    final_metrics, evaluated = {}, []
    final_step, protocol = None, None
    along = int(cfg.train.get("validate_every") or 0)
    if along:  # the validation inside the training loop logged its points; the series once more, whole
        write_series(run_dir, store)
    if str(cfg.eval.get("select_on", "final")) == "validation":  # on the loop's points, else on the kept checkpoints
        final_step, final = (LoopValidator(cfg, run_dir, store, store.log_metrics).choose(final) if along
                             else select_on_validation(cfg, run_dir, final, store))
    for step, path, out_dir, is_final in checkpoints_to_evaluate(cfg, run_dir, final, final_step):
        job = EvalJob(cfg.eval, heldout, bool(cfg.model.get("chat_template", True)), tools_cfg=cfg.get("tools"))
        metrics, files, info = evaluate_checkpoint(path, job, out_dir, temperatures=is_final,
                                                   score_budget=_token_budget(cfg))
        if is_final:
            final_metrics, protocol = dict(metrics), info["protocol"]
            store.set_tags(eval_protocol.tags(protocol) | {tags.ENTROPY_METHOD: str(info["entropy_method"])})
        if not (out_dir / ".logged").exists():
            store.log_metrics(metrics | {"time/eval_s": info["eval_time_s"]}
                              | {f"time/eval_{k}": v for k, v in info.get("phases", {}).items()}, step)
            _log_files(store, files, None if is_final else f"eval/step_{step}")
            (out_dir / ".logged").write_text(str(step))
        evaluated.append((step, out_dir, is_final))
    base_samples = base.ensure(wait=True) if base is not None else None
    if base_samples is None:
        return final_metrics
    differ = eval_protocol.differences(base.protocol, protocol) if protocol is not None else []
    if differ:  # never a pair across protocols (the base model is evaluated under the sweep's, as this run is)
        log.warning("flip rates not computed: the base model was evaluated under another protocol (%s)", "; ".join(differ))
        return final_metrics
    flip_k = cfg.eval.get("flip_k")
    store.set_tags({tags.BASE_RUN_ID: base.run_id, tags.FLIP_RULE: flip_rule(flip_k)})
    for step, out_dir, is_final in evaluated:
        table, flips = flip_metrics(base_samples, pd.read_parquet(out_dir / "samples.parquet"),
                                    None if flip_k is None else int(flip_k))
        if is_final:
            final_metrics.update(flips)
        if (out_dir / ".flips_logged").exists():
            continue
        table.to_csv(out_dir / "flip_rates.csv")
        store.log_metrics(flips, step)
        _log_files(store, {"flip_rates.csv": out_dir / "flip_rates.csv"}, None if is_final else f"eval/step_{step}")
        (out_dir / ".flips_logged").write_text(str(step))
    return final_metrics


def backfill_flips(cfg, exp_id: str, sweep_id: str, job_num, run_dir: Path, prior, store: tracking.Store) -> None:
    """A finished run without flip rates (its sweep's base evaluation failed or was interrupted): evaluate the
    base model now (or wait for the job that does) and log the flip rates of each of the run's evaluations to it,
    at their steps, read back from its ``samples.parquet`` artifacts (store calls through ``store``). Never raises:
    the run stays as it was."""
    import tempfile

    import pandas as pd

    from core.tasks import load_prompts
    from evaluation.tables import flip_metrics
    from orchestrator.point.base_model import BaseEvaluation
    from orchestrator.point.sweep_protocol import pinned_config

    try:
        cfg, _ = pinned_config(cfg, exp_id, sweep_id, store)  # the base model under the sweep's protocol
        base = BaseEvaluation(cfg, exp_id, sweep_id, job_num, Path(sweep_id) if sweep_id else run_dir,
                              load_prompts(cfg.data, "eval"), store)
        from evaluation import protocol as eval_protocol

        differ = eval_protocol.differences(eval_protocol.of_tags(prior.data.tags) or base.protocol, base.protocol)
        if differ:  # never a pair across protocols
            log.warning("run %s: no flip rates: it was evaluated under another protocol than the base model (%s)",
                        prior.info.run_id, "; ".join(differ))
            return
        base_samples = base.ensure(wait=True)
        if base_samples is None:
            return
        rid = prior.info.run_id
        evaluations = [("", int(cfg.train.steps))] + [
            (a.path + "/", int(a.path.rsplit("_", 1)[1])) for a in store.list_artifacts(rid, "eval")
            if a.is_dir and a.path.rsplit("/", 1)[-1].startswith("step_")]
        flip_k = cfg.eval.get("flip_k")
        tmp = Path(tempfile.mkdtemp(prefix="rlvr-flips-"))
        for prefix, step in evaluations:
            local = tmp / f"step_{step}"
            samples = pd.read_parquet(store.download_artifacts(rid, prefix + "samples.parquet", str(local)))
            table, flips = flip_metrics(base_samples, samples, None if flip_k is None else int(flip_k))
            store.log_metrics(flips, step, rid)
            table.to_csv(local / "flip_rates.csv")
            store.log_artifact(local / "flip_rates.csv", prefix.rstrip("/") or None, rid)
        store.set_tags({tags.BASE_RUN_ID: base.run_id, tags.FLIP_RULE: flip_rule(flip_k)}, rid)
        log.info("run %s: flip rates against base run %s added", rid, base.run_id)
    except Exception as e:
        log.warning("run %s: could not add flip rates against the base model: %s: %s", prior.info.run_id,
                    type(e).__name__, e)
