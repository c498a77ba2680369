"""The evaluation command: evaluate any checkpoint without training and log it to MLflow.

    python -m orchestrator.evaluate --checkpoint PATH_OR_HUB_ID [--eval quick|smoke|paper] [overrides ...]
        [--base-samples base/samples.parquet] [--out DIR] [--experiment NAME] [--tracking-uri URI]

Overrides are Hydra-style keys of the eval group, e.g. ``n=16 'benchmarks=[math500,aime24]'
data_dir=../shared/data/benchmarks max_prompts=20``. ``--sampler auto|hf|vllm`` (default: ``eval.sampler``,
itself ``auto``: vLLM when installed and a CUDA GPU is visible, else transformers). Bad input exits 2
with one line naming the value, before any model is loaded.

The command composes the config, validates it and logs to MLflow, so it lives in the orchestrator layer; the
sampling and the metric tables are :func:`evaluation.evaluate.evaluate_checkpoint`'s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="Hugging Face model directory or hub id")
    ap.add_argument("--eval", default="quick", help="eval preset in sweeps/eval/ (default: quick)")
    ap.add_argument("--base-samples", help="the base model's samples.parquet, for flip rates")
    ap.add_argument("--out", default=None, help="output directory (default: eval_out/<checkpoint name>)")
    ap.add_argument("--experiment", default="rlvr-eval")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--sampler", default=None, help="auto | hf | vllm (default: the eval preset's eval.sampler)")
    ap.add_argument("--run-name", default=None)
    ap.add_argument("overrides", nargs="*", help="eval overrides key=value")
    args = ap.parse_args(argv)

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from core.sampling import resolve_sampler
    from .preflight import CONFIG_DIR

    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=[f"eval={args.eval}"] + [f"eval.{o}" for o in args.overrides]
                          + ([f"eval.sampler={args.sampler}"] if args.sampler else []))
    except (HydraException, OmegaConfBaseException) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    eval_cfg = cfg.eval
    from .errors import ConfigError
    from .schema import check_schema
    from .validate import validate_eval

    try:  # the same checks as the sweep's pre-flight: every key's declaration, then the evaluation's own check
        check_schema(cfg)
        for w in validate_eval(cfg):
            print(f"warning: {w}", file=sys.stderr)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sampler = resolve_sampler(str(eval_cfg.get("sampler", "auto")))
    from core.tasks import get_task, load_plugins, load_prompts

    try:
        load_plugins(cfg.get("plugins"))
        held = sorted({b for b in eval_cfg.benchmarks if get_task(b).heldout_from_data})
    except (ImportError, KeyError) as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if len(held) > 1:
        print(f"error: eval.benchmarks: {held} are held-out splits of different training sets; evaluate them separately",
              file=sys.stderr)
        return 2
    if held:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            data_cfg = compose("config", overrides=[f"data={held[0]}"]).data
        heldout = load_prompts(data_cfg, "eval")
    else:
        heldout = None
    base = None
    if args.base_samples:
        import pandas as pd

        base = pd.read_parquet(args.base_samples)
    out = Path(args.out or Path("eval_out") / Path(str(args.checkpoint)).name)

    import mlflow

    from evaluation.evaluate import evaluate_checkpoint

    from . import provenance, tracking

    exp_id = tracking.setup_experiment(args.tracking_uri, args.experiment, "mlartifacts")
    with mlflow.start_run(experiment_id=exp_id, run_name=args.run_name or Path(str(args.checkpoint)).name,
                          tags={"rlvr.kind": "evaluation", "rlvr.checkpoint": str(args.checkpoint), "rlvr.sampler": sampler,
                                **provenance.tags(eval_cfg)}) as run:
        from evaluation.evaluate import benchmark_rows

        from . import window

        mlflow.log_params({f"eval.{k}": str(v)[:6000] for k, v in tracking.flatten(OmegaConf.to_container(eval_cfg, resolve=True)).items()})
        window.log_datasets(run.info.run_id, None, None, benchmark_rows(eval_cfg, heldout), eval_cfg)
        with window.system_metrics(cfg, run.info.run_id):
            metrics, files, info = evaluate_checkpoint(args.checkpoint, eval_cfg, out, heldout, base_samples=base,
                                                       sampler=sampler)
        mlflow.set_tag("rlvr.entropy_method", str(info["entropy_method"]))
        mlflow.log_metrics(metrics)
        for rel, path in files.items():
            sub = str(Path(rel).parent)
            mlflow.log_artifact(str(path), None if sub == "." else sub)
    for k in sorted(metrics):
        if k.startswith("eval/mean/"):
            print(f"{k:40s} {metrics[k]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
