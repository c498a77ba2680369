"""GPU check of training and evaluation on one GPU: the local engine trains two steps on the GPU, then the
``hf`` sampler evaluates the checkpoint on the GPU (bf16); prints wall times and peak GPU memory.

    python scripts/gpu_check_eval.py [--out DIR] [--steps 2] [--device cuda|cpu]

Built for the device machine (one GPU, no network, PyTorch + transformers + pandas + scipy + scikit-learn, no
MLflow, no Hydra, no vLLM): the policy is a Llama built from a config with a byte-level BPE tokenizer trained
in-process (nothing is downloaded), the config is composed from ``sweeps/`` with OmegaConf alone, and no MLflow
run is made. The few pure-Python packages the suite needs beyond that machine's set (omegaconf, antlr4 4.9.3,
math-verify, latex2sympy2_extended, rapidfuzz for Python 3.12) travel as wheels:

    bash scripts/device_wheels.sh           # here, once: downloads them to .device-wheels/
    # on the device (carry .device-wheels):
    pip install --no-deps --no-index --target /tmp/deps .device-wheels/* && PYTHONPATH=/tmp/deps:. python scripts/gpu_check_eval.py

Checks (exit 1 with the reason on failure): the policy trained on the GPU and changed; the evaluation ran on the
GPU in bfloat16 and gave n samples per prompt with finite entropies; the bf16 entropies agree with a float32
re-scoring of the same tokens to 2%. ``--device cpu`` runs the same path on the CPU (float32), which the test
suite does so this script cannot rot where no GPU is lent.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tiny_model import build_tiny_model  # noqa: E402  (scripts/tiny_model.py, beside this file)


def compose(overrides: list[str]):
    """The run config of ``sweeps/`` (defaults list and group files) plus dotlist overrides, without Hydra."""
    from omegaconf import OmegaConf

    root = OmegaConf.load(REPO / "sweeps" / "config.yaml")
    groups = {}
    for item in root.pop("defaults"):
        if isinstance(item, str):
            continue
        (group, option), = dict(item).items()
        if option is not None and not group.startswith("override "):  # Hydra's own groups (hydra/job_logging)
            groups[group] = option
    root.pop("hydra", None)
    chosen = dict(groups)
    for o in overrides:
        key, value = o.split("=", 1)
        if key in groups:
            chosen[key] = value
    for group, option in chosen.items():
        root[group] = OmegaConf.load(REPO / "sweeps" / group / f"{option}.yaml")
    root = OmegaConf.merge(root, OmegaConf.from_dotlist([o for o in overrides if o.split("=", 1)[0] not in groups]))
    return root


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_eval: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-gpu-eval-")).resolve()
    model_dir = out / "tiny-model"
    build_tiny_model(model_dir)
    cfg = compose(["algo=grpo_h", "algo.entropy_coef=0.01", "eval=smoke", f"train.steps={args.steps}", "train.prompts_per_step=8", "train.group_size=8",
                   "train.minibatch_size=32", "train.max_new_tokens=32", "train.lr=1e-4", f"train.device={args.device}",
                   f"eval.device={args.device}", "eval.sampler=hf", "eval.n=8", "eval.ks=[1,2,4,8]", "eval.max_prompts=8",
                   "eval.max_new_tokens=32", "eval.prompt_template={problem}", "model.name=tiny-check",
                   "model.source=pretrained", f"model.path={model_dir}", "model.chat_template=false"])
    from core.models import load_checkpoint
    from core.scoring import mean_token_entropies
    from core.tasks import load_prompts
    from evaluation.pipeline import EvalJob, evaluate_checkpoint
    from training.engines.local import train

    failures = []
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    logged = []
    t0 = time.time()
    ckpt = train(cfg, out / "run", lambda m, s: logged.append((s, m)))
    train_s = time.time() - t0
    train_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    if [s for s, _ in logged] != list(range(args.steps)):
        failures.append(f"training logged steps {[s for s, _ in logged]}")
    initial, _ = load_checkpoint(model_dir)
    trained, tok = load_checkpoint(ckpt)
    if all(torch.equal(a, b) for a, b in zip(initial.parameters(), trained.parameters())):
        failures.append("the policy did not change in training")
    del initial, trained
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    metrics, files, info = evaluate_checkpoint(ckpt, EvalJob(cfg.eval, load_prompts(cfg.data, "eval"),
                                                             chat_template=False), out / "eval")
    eval_s = time.time() - t0
    eval_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    import pandas as pd

    df = pd.read_parquet(files["samples.parquet"])
    if not (df.groupby("prompt_id").size() == 8).all() or len(df) != 64:
        failures.append(f"expected 8 prompts x 8 samples, got {len(df)} rows")
    if not df["mean_token_entropy"].notna().all():
        failures.append("missing entropies")
    # the bf16 (GPU) entropies against a float32 re-scoring of the same tokens
    model32, tok = load_checkpoint(ckpt, args.device, torch.float32)
    ids = [tok(p, add_special_tokens=False).input_ids for p in df["prompt"]]
    resp = [tok(r, add_special_tokens=False).input_ids for r in df["response"]]
    keep = [i for i, (r, n) in enumerate(zip(resp, df["n_tokens"])) if len(r) == n]  # decode/encode round trips
    ent32 = mean_token_entropies(model32, [ids[i] for i in keep], [resp[i] for i in keep], 1.0, tok.pad_token_id)
    rel = max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(df["mean_token_entropy"].iloc[keep], ent32)), default=0.0)
    if keep and rel > 0.02:
        failures.append(f"bf16 entropies differ from float32 by {rel:.3%}")
    report = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "train_wall_s": round(train_s, 2),
              "train_peak_gpu_gb": round(train_peak, 3) if cuda else None, "eval_wall_s": round(eval_s, 2), "eval_peak_gpu_gb": round(eval_peak, 3) if cuda else None,
              "sampler": info["sampler"], "pass@1": round(metrics["eval/mean/pass_at_1"], 4),
              "entropy": round(metrics["eval/mean/entropy"], 4), "entropy_bf16_vs_fp32_max_rel": round(rel, 5),
              "entropy_rows_compared": len(keep)}
    print("gpu_check_eval:", json.dumps(report))
    if failures:
        print("gpu_check_eval: FAILED:", "; ".join(failures), file=sys.stderr)
        return 1
    print("gpu_check_eval: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
