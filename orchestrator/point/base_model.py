"""The base model's evaluation: once per identity, shared by every point of every sweep that needs it.

The papers' tables start with an "Initialization" row (the starting model, same protocol), and flip
rates compare each trained policy with it. Its identity is the hash of what determines its samples:
the model config, the evaluation config (minus ``base``, ``flip_k``, ``checkpoints``), the resolved
sampler and, when a held-out split of the training data is evaluated, the data config. One MLflow run
per identity, tagged ``rlvr.kind=base``, named "Initialization", metrics logged at step 0.

Exactly once, also when points run in parallel (local processes, SLURM array jobs), with MLflow as the
only shared state (nodes need not share a filesystem):
- a FINISHED base run with the hash exists: its samples are used;
- this job's own unfinished claim exists (a requeued SLURM job): it is resumed;
- another job holds a live claim (its ``rlvr.heartbeat`` tag is fresh, and on this host its process is
  alive): before training the point goes on without waiting; after training it waits for the result;
- otherwise the point claims it: it creates the run, and if an earlier live claim appeared meanwhile
  (ordered by start time, then run id, the order every job sees alike) it deletes its own and defers;
  a claim whose holder went silent (kill -9, a node lost) is marked KILLED and taken over, and its
  partial ``samples.parquet`` is resumed when its folder is reachable.
A base evaluation that raises is marked FAILED (with ``traceback.txt``); the points of that sweep go on
without flip rates, the sweep exits 1, and re-running the sweep evaluates it again.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
import traceback
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from core import tags as tag_names
from orchestrator.point import integrity, provenance
from orchestrator.store import lease, mlflow_views, tracking

log = logging.getLogger("rlvr")

KIND = "base"
RUN_NAME = "Initialization"
HEARTBEAT_S = 20.0
STALE_S = float(os.environ.get("RLVR_BASE_STALE_S", "300"))  # a claim silent this long is taken over
POLL_S = 3.0
NOT_IDENTITY = ("base", "flip_k", "checkpoints")


def base_identity(cfg, protocol: dict) -> dict:
    """What determines the base model's samples (see the module docstring): the model, the evaluation config and its
    protocol (:mod:`evaluation.protocol`: the sampler and dtype it resolved to), the data of a held-out split."""
    from core.tasks import get_task
    from evaluation.protocol import protocol_id

    ev = OmegaConf.to_container(cfg.eval, resolve=True)
    for k in NOT_IDENTITY:
        ev.pop(k, None)
    ident = {"model": OmegaConf.to_container(cfg.model, resolve=True), "eval": ev, "protocol": protocol_id(protocol)}
    if any(get_task(b).heldout_from_data for b in ev.get("benchmarks", [])):
        ident["data"] = OmegaConf.to_container(cfg.data, resolve=True)
    if any(getattr(get_task(b), "tools", ()) for b in ev.get("benchmarks", [])) and cfg.get("tools") is not None:
        tools = OmegaConf.to_container(cfg.tools, resolve=True)
        tools.get("search", {}).pop("url", None)  # where the server runs, not what it answers
        ident["tools"] = tools
    return ident


def base_hash(ident: dict) -> str:
    """16-hex-digit SHA-256 of a base identity (keys sorted)."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def claim_is_live(run, now: float | None = None) -> bool:
    """A RUNNING base run whose holder is alive (:func:`orchestrator.store.lease.is_live` with :data:`STALE_S`)."""
    return lease.is_live(run, STALE_S, now)


class BaseEvaluation:
    """The base run of one sweep point's identity.

    Args:
        cfg: the point's composed config.
        exp_id: its MLflow experiment.
        sweep_id: the point's Hydra sweep folder (with ``job_num`` its own claim is recognised).
        job_num: the point's Hydra job number.
        root: a folder for the base run's files (a claim taken over keeps the folder of the run it takes
            over when reachable).
        heldout_rows: the held-out training split (for ``arithmetic``/``kk`` benchmarks).
        store: the store every call goes through (:class:`orchestrator.store.tracking.Store`).
    """

    def __init__(self, cfg, exp_id: str, sweep_id: str, job_num, root: Path, heldout_rows, store: tracking.Store):
        from evaluation import protocol as eval_protocol

        self.cfg, self.exp_id, self.sweep_id, self.job_num = cfg, exp_id, str(sweep_id), str(job_num)
        self.protocol = eval_protocol.resolve(cfg.eval, bool(cfg.model.get("chat_template", True)))
        self.sampler = self.protocol["sampler"]
        self.identity = base_identity(cfg, self.protocol)
        self.hash = base_hash(self.identity)
        self.root, self.heldout_rows, self.store = Path(root), heldout_rows, store
        self.run_id: str | None = None
        self._last_wait_log = 0.0

    # ------------------------------------------------------------------ lookups
    def _runs(self):
        return self.store.runs_with_hash(self.exp_id, self.hash, kind=KIND)

    def _own(self, run) -> bool:
        return run.data.tags.get(tag_names.SWEEP_ID) == self.sweep_id and run.data.tags.get(tag_names.JOB_NUM) == self.job_num

    def samples(self, run) -> pd.DataFrame:
        """The base run's samples table: from its folder when reachable, else downloaded from MLflow."""
        local = Path(run.data.tags.get(tag_names.RUN_DIR, "")) / "samples.parquet"
        if run.data.tags.get(tag_names.RUN_DIR) and local.is_file():
            return pd.read_parquet(local)
        import tempfile

        dst = tempfile.mkdtemp(prefix="rlvr-base-")
        return pd.read_parquet(self.store.download_artifacts(run.info.run_id, "samples.parquet", dst))

    # ------------------------------------------------------------------ the protocol
    def ensure(self, wait: bool) -> pd.DataFrame | None:
        """The base model's samples, evaluating them here when no other job is (see the module docstring).

        Args:
            wait: when another job holds a live claim, wait for its result (True) or return None (False).
        Returns:
            The samples table, or None (deferred to another job with ``wait=False``, or the base evaluation
            failed in this sweep).
        """
        while True:
            runs = self._runs()
            done = [r for r in runs if r.info.status == "FINISHED"]
            if done:
                problems, _ = integrity.verify_run(self.store, done[0])
                if not problems:
                    self.run_id = done[0].info.run_id
                    return self.samples(done[0])
                for p in problems:
                    log.warning("base model: finished run %s is not trusted: %s; evaluating again", done[0].info.run_id, p)
                self.store.terminate(done[0].info.run_id, "KILLED", "; ".join(problems))
                continue
            running = [r for r in runs if r.info.status == "RUNNING"]
            own = [r for r in running if self._own(r)]
            if own:
                log.info("base model: resuming this job's evaluation, MLflow run %s", own[0].info.run_id)
                return self._evaluate(own[0].info.run_id, Path(own[0].data.tags.get(tag_names.RUN_DIR) or self._folder()),
                                      resume=True)
            now = time.time()
            live = [r for r in running if claim_is_live(r, now)]
            if live:
                if not wait:
                    log.info("base model: being evaluated by job %s (run %s); training meanwhile",
                             live[0].data.tags.get(tag_names.JOB_NUM), live[0].info.run_id)
                    return None
                if now - self._last_wait_log > 60:
                    self._last_wait_log = now
                    log.info("base model: waiting for run %s (job %s, host %s) to finish", live[0].info.run_id,
                             live[0].data.tags.get(tag_names.JOB_NUM), live[0].data.tags.get(tag_names.HOST))
                time.sleep(POLL_S)
                continue
            failed = [r for r in runs if r.info.status == "FAILED" and r.data.tags.get(tag_names.SWEEP_ID) == self.sweep_id]
            if failed:
                log.warning("base model: its evaluation failed in this sweep (run %s); no flip rates for this point",
                            failed[-1].info.run_id)
                return None
            folder = self._folder()
            for r in running:  # silent claims: taken over, their partial samples resumed when reachable
                self.store.terminate(r.info.run_id, "KILLED")
                old = Path(r.data.tags.get(tag_names.RUN_DIR, ""))
                if r.data.tags.get(tag_names.RUN_DIR) and (old / "samples.parquet").is_file():
                    folder = old
                log.warning("base model: run %s went silent; taking over its evaluation", r.info.run_id)
            run_id = self._claim(folder)
            if run_id is not None:
                return self._evaluate(run_id, folder)

    def _log_datasets(self, run_id: str) -> None:
        """The evaluation benchmarks as the run's datasets; unreadable data is left to the evaluation to report."""
        from evaluation.pipeline import benchmark_rows

        try:
            rows = benchmark_rows(self.cfg.eval, self.heldout_rows)
        except Exception:
            return
        mlflow_views.log_datasets(run_id, self.cfg.data, None, rows, self.cfg.eval, self.store)

    def _folder(self) -> Path:
        return self.root / f"base-{self.hash[:8]}"

    def _claim(self, folder: Path) -> str | None:
        tags = {tag_names.CONFIG_HASH: self.hash, tag_names.KIND: KIND, tag_names.SWEEP_ID: self.sweep_id,
                tag_names.JOB_NUM: self.job_num, tag_names.HOST: socket.gethostname(), tag_names.PID: str(os.getpid()),
                tag_names.HEARTBEAT: f"{time.time():.3f}", tag_names.RUN_DIR: str(folder), tag_names.SAMPLER: self.sampler,
                tag_names.SLURM_JOB_ID: os.environ.get("SLURM_JOB_ID", ""),
                "mlflow.note.content": "The starting model, evaluated with the sweep's protocol (the papers' "
                                       "'Initialization' row); every trained run's flip rates compare against it."}
        from evaluation.protocol import protocol_id
        from evaluation.protocol import tags as protocol_tags

        chat = bool(self.cfg.model.get("chat_template", True))
        tags |= mlflow_views.parent_tags(self.exp_id, self.sweep_id, self.store) \
            | provenance.provenance_tags(provenance.eval_identity(self.cfg.eval, chat)) | protocol_tags(self.protocol) \
            | {provenance.TAG_PREFIX + "eval_identity": protocol_id(self.protocol)}
        run = self.store.create_run(self.exp_id, RUN_NAME, tags)
        # a rival job's claim made at the same moment may still wait on the store (SQLite's lock: its insert retried
        # 0.2 s later, after this job's search); after the settle both claims are visible to both jobs, and the
        # later one yields (seen in CI: two jobs' claims 15 ms apart both evaluated the base model)
        time.sleep(lease.SETTLE_S)
        mine = (run.info.start_time, run.info.run_id)
        rivals = [r for r in self._runs() if r.info.run_id != run.info.run_id and claim_is_live(r)
                  and (r.info.start_time, r.info.run_id) < mine]
        if rivals:
            self.store.delete_run(run.info.run_id)
            log.info("base model: job %s claimed it first (run %s)", rivals[0].data.tags.get(tag_names.JOB_NUM),
                     rivals[0].info.run_id)
            return None
        params = {f"model.{k}": str(v)[:6000] for k, v in tracking.flatten(self.identity["model"]).items()}
        params |= {f"eval.{k}": str(v)[:6000] for k, v in tracking.flatten(self.identity["eval"]).items()}
        params |= {f"data.{k}": str(v)[:6000] for k, v in tracking.flatten(self.identity.get("data", {})).items()}
        params["algo.name"] = "base"
        self.store.log_params(params, run.info.run_id)
        return run.info.run_id

    def _evaluate(self, run_id: str, folder: Path, resume: bool = False) -> pd.DataFrame | None:
        """Evaluate the base model in its run ``run_id`` (``resume``: this job's own claim, started before a requeue)
        with its files in ``folder``; the samples, or None when the evaluation failed (the run then FAILED)."""
        from core.models import model_path
        from evaluation.pipeline import EvalJob, evaluate_checkpoint

        self.run_id = run_id
        store = self.store
        beat = lease.Heartbeat(store, run_id, HEARTBEAT_S)
        beat.start()
        monitor = mlflow_views.system_metrics(self.cfg, run_id, resume).__enter__()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._log_datasets(run_id)
            store.set_tag(tag_names.RUN_DIR, str(folder), run_id)
            log.info("base model: evaluating (MLflow run %s, %s sampler) in %s", run_id, self.sampler, folder)
            job = EvalJob(self.cfg.eval, self.heldout_rows, bool(self.cfg.model.get("chat_template", True)),
                          tools_cfg=self.cfg.get("tools"))
            metrics, files, info = evaluate_checkpoint(model_path(self.cfg.model), job, folder, sampler=self.sampler)
            store.log_metrics(metrics | {"time/eval_s": info["eval_time_s"]}
                              | {f"time/eval_{k}": v for k, v in info.get("phases", {}).items()}, 0, run_id)
            for rel, path in files.items():
                sub = str(Path(rel).parent)
                store.log_artifact(path, None if sub == "." else sub, run_id)
            record = integrity.write_record(folder, {rel: Path(p) for rel, p in files.items()},
                                            {"samples.parquet": integrity.sha256(folder / "samples.parquet")})
            store.log_artifact(record, None, run_id)
            store.set_tags({tag_names.ENTROPY_METHOD: str(info["entropy_method"]), mlflow_views.NOTE_TAG: mlflow_views.describe(
                self.cfg, "", metrics, kind="base", sweep_id=self.sweep_id) + "\n\nEvery trained run's flip rates "
                "compare against this run (the papers' 'Initialization' row)."}, run_id)
            monitor.__exit__(None, None, None)
            beat.stop.set()
            store.terminate(run_id, "FINISHED")
            return pd.read_parquet(folder / "samples.parquet")
        except BaseException as e:
            beat.stop.set()
            (folder / "traceback.txt").write_text(traceback.format_exc())
            try:
                store.log_artifact(folder / "traceback.txt", None, run_id)
            finally:
                store.terminate(run_id, "FAILED" if isinstance(e, Exception) else "KILLED")
            if not isinstance(e, Exception):
                raise
            log.error("base model: evaluation failed (%s: %s); this point goes on without flip rates",
                      type(e).__name__, e)
            return None
        finally:
            beat.stop.set()
            monitor.__exit__(None, None, None)
