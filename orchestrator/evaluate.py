"""The evaluation command: evaluate any checkpoint without training and log it to MLflow.

    python -m orchestrator.evaluate --checkpoint PATH_OR_HUB_ID [--eval quick|smoke|paper] [overrides ...]
        [--base-samples base/samples.parquet] [--out DIR] [--experiment NAME] [--tracking-uri URI]

Overrides are Hydra-style keys of the eval group, e.g. ``n=16 'benchmarks=[math500,aime24]'
data_dir=/path/to/benchmarks max_prompts=20``. ``--sampler auto|hf|vllm`` (default: ``eval.sampler``,
itself ``auto``: vLLM when installed and a CUDA GPU is visible, else transformers). Bad input exits 2
with one line naming the value, before any model is loaded.

The command composes the config, validates it and logs to MLflow, so it lives in the orchestrator layer; the
sampling and the metric tables are :func:`evaluation.pipeline.evaluate_checkpoint`'s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from core import tags
from evaluation.tables import protocol_differences


class _Refused(Exception):
    """Bad input found before any work: its one line (None: already printed) goes to stderr, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="Hugging Face model directory or hub id")
    ap.add_argument("--eval", default="quick", help="eval preset in sweeps/eval/ (default: quick)")
    ap.add_argument("--base-samples", help="the base model's samples.parquet, for flip rates")
    ap.add_argument("--out", default=None, help="output directory (default: eval_out/<checkpoint folder>-<MLflow run "
                    "id>, new for every evaluation); one that exists and is not empty is refused without --overwrite")
    ap.add_argument("--overwrite", action="store_true", help="write into an existing --out")
    ap.add_argument("--any-protocol", action="store_true", help="compute flip rates against --base-samples evaluated "
                    "with other settings (samples per prompt, response length) instead of refusing")
    ap.add_argument("--experiment", default="rlvr-eval")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--sampler", default=None, help="auto | hf | vllm (default: the eval preset's eval.sampler)")
    ap.add_argument("--run-name", default=None)
    ap.add_argument("overrides", nargs="*", help="eval overrides key=value")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg, base, heldout = _preflight(args)
    except _Refused as e:
        if e.args and e.args[0]:
            print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    from core.console import setup

    setup(stream=sys.stderr)  # the sampling's progress lines (stdout: the metrics); the libraries' output off the screen
    metrics, out = _evaluate(args, cfg, base, heldout)
    for k in sorted(metrics):
        if k.startswith("eval/mean/"):
            print(f"{k:40s} {metrics[k]:.4f}")
    if base is not None:
        import pandas as pd

        ours = pd.read_parquet(out / "samples.parquet")
        _, shared, total = protocol_differences(ours, base)
        print(f"flip rates on the {shared} of {total} prompts shared with --base-samples {args.base_samples}")
    print(f"results: {out.resolve()}")
    return 0


def _preflight(args):
    """The evaluation's config composed and checked as the sweep's pre-flight checks it (every key's declaration, the
    evaluation's own check, an explicit bf16 on a device that emulates it), the checkpoint and ``--out`` checked,
    ``--base-samples`` read, the held-out split loaded. Returns (config, base samples or None, held-out rows or None).

    Raises:
        _Refused: bad input, one line.
    """
    cfg = _compose(args)
    eval_cfg = cfg.eval
    _check_config(cfg)
    _check_places(args, cfg)
    base = None
    if args.base_samples:
        base = _read_base(args.base_samples, eval_cfg, args.any_protocol)
        if base is None:
            raise _Refused(None)
    return cfg, base, _heldout(cfg)


def _compose(args):
    """The run config of ``--eval``'s preset with the command line's overrides (each under ``eval.``) and
    ``--sampler``, composed as Hydra composes a sweep's point.

    Raises:
        _Refused: no such preset, several values for one setting, or an override Hydra refuses (an unknown key named
            with its nearest known one).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.checks.preflight import CONFIG_DIR, nearest

    presets = sorted(p.stem for p in (CONFIG_DIR / "eval").glob("*.yaml"))
    if args.eval not in presets:
        raise _Refused(f"--eval {args.eval}: no such preset{nearest(args.eval, presets)}; the presets in sweeps/eval/: "
                       + ", ".join(presets))
    overrides = [f"eval.{o[len('eval.'):] if o.startswith('eval.') else o}" for o in args.overrides]
    try:
        from orchestrator.checks.preflight import check_single_run

        check_single_run(overrides)
    except Exception as e:  # noqa: BLE001 -- ConfigError: several values
        raise _Refused(str(e).split(": add -m")[0] + ": an evaluation takes one value per setting") from None
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[f"eval={args.eval}"] + overrides
                          + ([f"eval.sampler={args.sampler}"] if args.sampler else []))
    except (HydraException, OmegaConfBaseException) as e:
        from orchestrator.checks.preflight import _unknown_key

        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            unknown = _unknown_key(str(e), [f"eval={args.eval}"] + overrides,
                                   lambda o: compose("config", overrides=o))
        raise _Refused(unknown.replace("+eval.", "+") if unknown else str(e).splitlines()[0]) from None
    return cfg


def _check_config(cfg) -> None:
    """The same checks as the sweep's pre-flight: every key's declaration, then the evaluation's own check (its
    warnings on stderr), then an explicit precision the device cannot honour.

    Raises:
        _Refused: the first problem, one line naming the key.
    """
    from orchestrator.checks.preflight import check_precision
    from orchestrator.checks.schema import check_schema
    from orchestrator.checks.validate import validate_eval
    from orchestrator.errors import ConfigError

    try:  # the same checks as the sweep's pre-flight: every key's declaration, then the evaluation's own check
        check_schema(cfg)
        for w in validate_eval(cfg):
            print(f"warning: {w}", file=sys.stderr)
        check_precision(cfg)
    except ConfigError as e:
        raise _Refused(str(e)) from None


def _check_places(args, cfg) -> None:
    """The checkpoint (there, with weights), the store (``--tracking-uri``, in an existing folder) and the output
    folder (``--out``: writable, and empty unless ``--overwrite``), checked before anything is loaded or created.

    Raises:
        _Refused: the first problem, one line naming the option.
    """
    from core.models import check_source

    try:  # the checkpoint is there (a folder with config.json, or a hub id: cached when offline) before any loading
        check_source({"source": "pretrained", "path": str(args.checkpoint)})
    except ValueError as e:
        raise _Refused(f"--checkpoint: {str(e).replace('model.path=', '', 1)}") from None
    from orchestrator.store import store_checks

    try:  # the store and the output folder, as the sweep's pre-flight checks them (nothing is created yet)
        store_checks.check_store(args.tracking_uri, str(cfg.tracking.artifact_root), min_free_mb=0)
        db = store_checks.sqlite_path(args.tracking_uri)
        if db is not None and not db.parent.is_dir():
            raise store_checks.StoreError(f"--tracking-uri={args.tracking_uri}: the folder {db.parent} does not exist; "
                                          f"a store is created only in an existing folder (mkdir -p {db.parent})")
        store_checks.check_writable(Path(args.out or "eval_out"), f"--out={args.out or 'eval_out'}", 0)
    except store_checks.StoreError as e:
        raise _Refused(str(e).replace("tracking.uri=", "--tracking-uri=")) from None
    ckpt = Path(str(args.checkpoint))
    if ckpt.is_dir() and (ckpt / "config.json").is_file() and not any(
            any(ckpt.glob(pat)) for pat in ("*.safetensors", "*.bin", "*.gguf", "adapter_model.*")) \
            and not (ckpt / "adapter_config.json").is_file():
        raise _Refused(f"--checkpoint={ckpt}: has config.json but no weights (*.safetensors, *.bin)")
    if args.out and Path(args.out).exists() and any(Path(args.out).iterdir()) and not args.overwrite:
        raise _Refused(f"--out={args.out}: exists and is not empty (its results would be written over); choose another "
                       "folder, leave --out out (a new folder each time), or add --overwrite")


def _heldout(cfg):
    """The rows of the held-out split a benchmark of ``eval.benchmarks`` takes from a training set (None when none
    does), after the configured plug-ins are loaded.

    Raises:
        _Refused: a plug-in or benchmark that cannot be found, or held-out splits of two training sets.
    """
    from hydra import compose, initialize_config_dir

    from core.tasks import get_task, load_plugins, load_prompts
    from orchestrator.checks.preflight import CONFIG_DIR

    try:
        load_plugins(cfg.get("plugins"))
        held = sorted({b for b in cfg.eval.benchmarks if get_task(b).heldout_from_data})
    except (ImportError, KeyError) as e:
        raise _Refused(e.args[0]) from None
    if len(held) > 1:
        raise _Refused(f"eval.benchmarks: {held} are held-out splits of different training sets; evaluate them "
                       "separately")
    heldout = None
    if held:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            data_cfg = compose("config", overrides=[f"data={held[0]}"]).data
        heldout = load_prompts(data_cfg, "eval")
    return heldout


def _evaluate(args, cfg, base, heldout):
    """The checkpoint's evaluation in an MLflow run of its own (``--experiment``, kind ``evaluation``, provenance
    tags, the eval group as parameters, the datasets, system metrics, the samples and tables as artifacts). Returns
    (metrics, output folder)."""
    from omegaconf import OmegaConf

    from evaluation import protocol as eval_protocol
    from evaluation.pipeline import EvalJob, benchmark_rows, evaluate_checkpoint
    from orchestrator.point import provenance
    from orchestrator.store import mlflow_views, tracking

    eval_cfg = cfg.eval
    proto = eval_protocol.resolve(eval_cfg)  # prompts through the chat template, as evaluate_checkpoint renders them here
    sampler = proto["sampler"]
    store = tracking.Store.of(cfg)  # every store call through it, waiting out an outage as a sweep's do
    exp_id = store.open(args.tracking_uri, args.experiment, "mlartifacts")
    with store.running(exp_id, args.run_name or Path(str(args.checkpoint)).name,
                       {tags.KIND: "evaluation", tags.CHECKPOINT: str(args.checkpoint),
                        **provenance.provenance_tags(provenance.eval_identity(eval_cfg)), **eval_protocol.tags(proto),
                        provenance.TAG_PREFIX + "eval_identity": eval_protocol.protocol_id(proto)}) as run:
        out = Path(args.out or Path("eval_out") / f"{Path(str(args.checkpoint)).name}-{run.info.run_id[:12]}")
        store.set_tag(tags.RUN_DIR, str(out.resolve()))
        store.log_params({f"eval.{k}": str(v)[:6000] for k, v in tracking.flatten(OmegaConf.to_container(eval_cfg, resolve=True)).items()})
        mlflow_views.log_datasets(run.info.run_id, None, None, benchmark_rows(eval_cfg, heldout), eval_cfg, store)
        with mlflow_views.system_metrics(cfg, run.info.run_id):
            metrics, files, info = evaluate_checkpoint(args.checkpoint, EvalJob(eval_cfg, heldout, base_samples=base),
                                                       out, sampler=sampler)
        store.set_tag(tags.ENTROPY_METHOD, str(info["entropy_method"]))
        store.log_metrics(metrics)
        for rel, path in files.items():
            sub = str(Path(rel).parent)
            store.log_artifact(path, None if sub == "." else sub)
    return metrics, out


def _read_base(path: str, eval_cfg, any_protocol: bool):
    """``--base-samples`` read and held against this evaluation's protocol before anything is loaded: the samples
    per prompt (``eval.n``) and the response-length cap (``eval.max_new_tokens``) it shows
    (:func:`evaluation.tables.protocol_differences`'s reading). Returns the table, or None after one line on stderr
    (unreadable, or another protocol without ``any_protocol``)."""
    import pandas as pd

    try:
        base = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 -- a missing, truncated or foreign file: one line naming it
        print(f"error: --base-samples {path}: cannot be read as a samples table ({type(e).__name__}: "
              f"{str(e).splitlines()[0] if str(e) else ''})", file=sys.stderr)
        return None
    from evaluation import protocol as eval_protocol

    theirs = eval_protocol.read_beside(path)  # the base's protocol.json, when its evaluation folder has one
    if theirs is not None:
        try:
            mine = eval_protocol.resolve(eval_cfg)
        except ValueError:
            mine = None
        differ = [d for d in eval_protocol.differences(theirs, mine) if d.split(":")[0] in eval_protocol.RESOLVED] if mine else []
        if differ and not any_protocol:
            print(f"error: --base-samples {path}: evaluated with another protocol than this one: {'; '.join(differ)} "
                  "(its protocol.json; flip rates would compare the samplers, not the models; add --any-protocol)",
                  file=sys.stderr)
            return None
    n, cap = int(eval_cfg.n), int(eval_cfg.max_new_tokens)
    mine = pd.DataFrame({"benchmark": base["benchmark"], "prompt_id": base["prompt_id"], "prompt": base.get("prompt"),
                         "n_tokens": cap, "finish_reason": "length"}).drop_duplicates(["benchmark", "prompt_id"])
    mine = mine.loc[mine.index.repeat(n)]  # what this protocol's samples of the same prompts will look like
    differ, _, _ = protocol_differences(mine, base)
    differ = [d.replace("cut at", "cut (eval.max_new_tokens) at", 1) for d in differ]
    if differ and not any_protocol:
        print(f"error: --base-samples {path}: evaluated with another protocol than this one: {'; '.join(differ)} "
              "(flip rates would compare the protocols, not the models; evaluate the base model with the same "
              "settings, or add --any-protocol)", file=sys.stderr)
        return None
    for d in differ:
        print(f"warning: --base-samples: {d}", file=sys.stderr)
    return base


if __name__ == "__main__":
    sys.exit(main())
