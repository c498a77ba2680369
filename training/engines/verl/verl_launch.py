"""The verl engine's launch: the data and the model verl loads (:func:`write_parquet`, :func:`materialize_model`), the
environment of verl's processes (:func:`verl_environment`, :func:`worker_runtime_env`), verl's trainer in a child
process with its metrics streamed into the run (:func:`run`), and the hand-over of its checkpoints (:func:`hand_over`).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from training.engines.verl.verl_adapters import SETUP_HOOK, SPEC_ENV, algo_spec
from training.engines.verl.verl_checks import check
from training.engines.verl.verl_keys import VerlSettings
from training.engines.verl.verl_translate import verl_overrides
from training.engines.verl.verl_validation import VerlCompute, VerlValidations, merge_overrides, validation_overrides
from training.engines.verl_support.verl_checkpoint import export_hf_checkpoint, export_trajectory, rewind_to_logged
from training.engines.verl_support.verl_metrics import MetricsStreamer, aliases_for


def verl_environment(v: VerlSettings) -> dict[str, str]:
    """Environment variables verl's processes need for this run (the child's environment, and Ray's ``runtime_env``
    for a joined cluster): the suite's verl external module always (its TRL guard holds on GPUs too), and on the CPU
    its platform and vLLM's CPU settings (:func:`training.engines.verl_support.verl_platform.cpu_environment`)."""
    from training.engines.verl_support import verl_platform

    env = verl_platform.cpu_environment() if str(v.engine.device) == "cpu" else {}
    mods = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != verl_platform.MODULE]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join([verl_platform.MODULE, *mods])
    roots = plugin_roots(v.run.plugins)
    if roots:  # verl's processes import the run's plugin modules (tasks, algorithms) from where this process did
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    return env


def plugin_roots(modules) -> list[str]:
    """The ``sys.path`` folders the ``plugins`` modules were imported from (``a.b.c`` in ``/x/a/b/c.py``: ``/x``), so a
    child process started elsewhere (verl's trainer, its Ray workers) imports the same files. Modules not imported
    yet are imported here; ones without a file (namespace packages) are skipped.

    Raises:
        ImportError: a module cannot be imported.
    """
    import importlib

    roots = []
    for name in modules:
        mod = importlib.import_module(str(name))
        if not getattr(mod, "__file__", None):
            continue
        path = Path(mod.__file__).resolve()
        up = str(name).count(".") + (1 if path.name == "__init__.py" else 0)
        roots.append(str(path.parents[up]))
    return list(dict.fromkeys(roots))


def worker_runtime_env(spec: dict, metrics_path: Path | None = None) -> dict:
    """The Ray ``runtime_env`` that makes every verl worker process register this suite's algorithm:
    :data:`SPEC_ENV` plus ``worker_process_setup_hook`` = :func:`register_from_env`, and the variables of
    :func:`verl_environment` (a joined Ray cluster does not inherit the driver's environment)."""
    env = {SPEC_ENV: json.dumps(spec)}
    if metrics_path is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env |= {k: os.environ[k] for k in ("RLVR_SEARCH_URL", "RLVR_SEARCH_TOPK") if k in os.environ}  # the search tool
    from training.engines.verl_support.verl_platform import (
        CPU_ENV,  # verl's external module and the CPU platform's settings
    )

    env |= {k: os.environ[k] for k in (*CPU_ENV, "PYTHONPATH") if k in os.environ}
    return {"worker_process_setup_hook": SETUP_HOOK, "env_vars": env}


def write_parquet(rows: list[dict], path: Path, data_source: str) -> Path:
    """Write prompt rows ``{"id", "prompt", "gold", "task"}`` in verl's RL dataset layout: ``data_source``,
    ``prompt`` (chat messages), ``ability`` (the task's kind), ``reward_model`` {style, ground_truth},
    ``extra_info`` (index, id and the whole row as JSON, which the reward function scores with its task).

    Raises:
        ValueError: no rows.
    """
    import pandas as pd

    from core.tasks import get_task

    if not rows:
        raise ValueError(f"no prompts to write to {path}")
    df = pd.DataFrame({
        "data_source": [data_source] * len(rows),
        "prompt": [[{"role": "user", "content": str(r["prompt"])}] for r in rows],
        "ability": [get_task(r["task"]).kind if r.get("task") else "math" for r in rows],
        "reward_model": [{"style": "rule", "ground_truth": str(r.get("gold", ""))} for r in rows],
        "extra_info": [{"index": i, "id": str(r.get("id", i)), "row": json.dumps(r, default=str)} for i, r in enumerate(rows)],
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


def materialize_model(model_cfg, out_dir: Path) -> str:
    """A path or hub id verl can load with ``from_pretrained``: the configured path for pretrained
    models, otherwise the policy built by :func:`core.models.load_policy` saved to ``out_dir``."""
    if model_cfg.get("source") == "pretrained":
        return str(model_cfg.path)
    from core.models import load_policy

    out_dir = Path(out_dir)
    if not (out_dir / "config.json").is_file():
        model, tok = load_policy(model_cfg)
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.replace(out_dir)
    return str(out_dir)


def run(v: VerlSettings, run_dir, log_metrics, logged_through: int = -1, validator=None) -> Path:
    """Train with verl from the settings ``v`` in ``run_dir`` and return the Hugging Face checkpoint directory (see
    :func:`training.engines.verl.train`, which builds them). With ``validator`` (``train.validate_every``), verl's own
    periodic validation samples the validator's split and each point goes to it
    (:mod:`~training.engines.verl.verl_validation`); every step's ``train/flops`` is logged from verl's token counts.

    Raises:
        ValueError: settings verl cannot honour (:func:`~training.engines.verl.verl_checks.check`).
        RuntimeError: no CUDA device here for ``engine.device=cuda``; verl exited with an error.
        Preempted: a stop was requested.
    """
    from core.tasks import load_prompts

    check(v)
    if str(v.engine.device) == "cuda" and not torch.cuda.is_available() and not os.environ.get("RAY_ADDRESS"):
        import socket

        raise RuntimeError(f"engine=verl: no CUDA device visible on {socket.gethostname()} (verl trains on GPUs; "
                           "use engine=local on a CPU machine, or submit with hydra/launcher=slurm)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data_dir = run_dir / "verl_data"
    rows = load_prompts(v.run.data, "train")
    source = f"rlvr/{v.data_name}"
    write_parquet(rows, data_dir / "train.parquet", source)
    val_rows = list(validator.split) if validator is not None else rows[: max(1, min(len(rows), 8))]
    write_parquet(val_rows, data_dir / "val.parquet", source)
    model_path = materialize_model(v.run.model, run_dir / "initial_model")
    overrides = verl_overrides(v, model_path, data_dir, run_dir)
    compute = VerlCompute(v, run_dir)
    vals = None
    if validator is not None:
        overrides = merge_overrides(overrides, validation_overrides(validator, run_dir, str(v.engine.rollout.name)))
        vals = VerlValidations(v, run_dir, validator, model_path, compute)
    (run_dir / "verl_overrides.txt").write_text("\n".join(overrides) + "\n")
    metrics_path = run_dir / "verl_metrics.jsonl"
    spec = algo_spec(v)

    env = dict(os.environ)
    env.update(verl_environment(v))
    env[SPEC_ENV] = json.dumps(spec)
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    if rewind_to_logged(run_dir / "verl_checkpoints", logged_through) >= v.run.steps:
        if vals is not None:  # the points verl dumped before the stop that were not handed over yet
            vals.poll()
        return hand_over(v, run_dir)  # resumed after its training had finished: nothing for verl to do
    from core.tools import close_tools, open_tools_for

    # the search function tool's server (verl_search_tool.py), by URL to Ray's workers: tools.search.url, or one
    # started for the run over tools.search.index or the corpus the rows name, as the local engine does
    tools = open_tools_for(rows, v.run.tools)
    try:
        if "search" in tools:
            env["RLVR_SEARCH_URL"] = str(tools["search"].url)
            env["RLVR_SEARCH_TOPK"] = str(int(tools["search"].topk))
        return _run_verl(v, run_dir, overrides, env, metrics_path,
                         lambda m, step: log_metrics(compute.add(m, step), step), logged_through, vals)
    finally:
        close_tools(tools)


def _run_verl(v: VerlSettings, run_dir: Path, overrides: list[str], env: dict, metrics_path: Path, log_metrics,
              logged_through: int, vals=None):
    """verl's trainer in a child process (``python -m training.engines.verl_support.verl_main``) with its metrics streamed, stopped
    on a stop request, its validation points handed to the validator as they complete (``vals``, a
    :class:`~training.engines.verl.verl_validation.VerlValidations`); then the hand-over (:func:`hand_over`). See
    :func:`run`."""
    from core.lifecycle import STOP_REQUESTED, Preempted

    cmd = [sys.executable, "-m", "training.engines.verl_support.verl_main", *overrides]
    from tqdm.auto import tqdm

    bar = tqdm(total=v.run.steps, desc=f"train {v.run.algo.name} (verl)", unit="step")
    done = {"n": 0}

    def progress(step0: int) -> None:
        if step0 + 1 > done["n"]:
            bar.update(step0 + 1 - done["n"])
            done["n"] = step0 + 1

    metrics_path.unlink(missing_ok=True)  # verl rewrites it from its resumed step; earlier steps are in MLflow
    aliases = aliases_for(v.run.algo.loss_agg_mode)
    streamer = MetricsStreamer(metrics_path, log_metrics, logged_through, progress=progress, aliases=aliases)
    log_path = run_dir / "verl.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        streamer.start()
        try:
            while proc.poll() is None:
                if STOP_REQUESTED.is_set():
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                    break
                if vals is not None:
                    vals.poll()
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            streamer.stop_event.set()
            streamer.join()
            bar.close()
    if vals is not None and proc.returncode == 0:
        vals.poll()  # the last point, once its step's metrics are in
    if STOP_REQUESTED.is_set():
        raise Preempted(f"verl stopped on request; it resumes from {run_dir / 'verl_checkpoints'}")
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"verl exited with code {proc.returncode}; last lines of {log_path}:\n{tail}")
    return hand_over(v, run_dir)


def hand_over(v: VerlSettings, run_dir: Path) -> Path:
    """Export verl's kept checkpoints (:func:`export_trajectory`) and its last one (:func:`export_hf_checkpoint`) in
    Hugging Face format for evaluation; returns the final checkpoint's folder."""
    run_dir = Path(run_dir)
    export_trajectory(run_dir / "verl_checkpoints", run_dir, v.run.save_every, v.run.steps)
    return export_hf_checkpoint(run_dir / "verl_checkpoints", run_dir / "checkpoint")
