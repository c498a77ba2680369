"""GPU check of the local engine on one GPU: a ~0.5B-parameter Llama built from a config (nothing downloaded),
``train.precision=bf16`` and ``train.gradient_checkpointing=true``, two GRPO steps; prints the step times, the
peak GPU memory and the first minibatch's ratio deviation (must be exactly 0: old and new log-probs come from
the same bf16 path).

    python scripts/gpu_check_train.py [--out DIR] [--steps 2] [--device cuda|cpu] [--hidden 1408] [--layers 24]

Built for the device machine (one GPU, no network, PyTorch + transformers, no MLflow, no Hydra): the config is
composed from ``sweeps/`` with OmegaConf alone (see ``scripts/gpu_check_eval.py``), and the suite's few other
pure-Python packages travel as wheels (``bash scripts/device_wheels.sh`` here, then on the device
``pip install --no-deps --no-index --target /tmp/deps .device-wheels/* && PYTHONPATH=/tmp/deps:. python
scripts/gpu_check_train.py``). Default size: hidden 1408, 24 layers, 512-token vocabulary: 10 x 1408^2 x 24 =
476M parameters. ``--device cpu --hidden 128 --layers 2 --prompts 4 --tokens 16`` runs the same path on the CPU (the test suite does, so
this script cannot rot where no GPU is lent).

Checks (exit 1 with the reason): every step logged once; the policy changed; the first minibatch's ratio is
exactly 1 on every step; peak memory and step times are finite.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_check_eval import compose  # noqa: E402  (scripts/, beside this file)
from tiny_model import build_tiny_model  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--hidden", type=int, default=1408)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (8 responses each)")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per response")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_train: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-gpu-train-")).resolve()
    model_dir = out / "model"
    build_tiny_model(model_dir, hidden=args.hidden, layers=args.layers)
    cfg = compose(["algo=grpo", "eval=smoke", f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}",
                   "train.group_size=8", "train.minibatch_size=16", f"train.max_new_tokens={args.tokens}", "train.lr=1e-5",
                   "train.precision=bf16", "train.gradient_checkpointing=true", f"train.device={args.device}",
                   "model.name=gpu-check-train", "model.source=pretrained", f"model.path={model_dir}",
                   "model.chat_template=false"])
    from core.models import load_checkpoint
    from training.engines.local import train, validate

    failures = []
    validate(cfg)
    logged = []
    t0 = time.time()
    ckpt = train(cfg, out / "run", lambda m, s: logged.append((s, m)))
    wall = time.time() - t0
    if [s for s, _ in logged] != list(range(args.steps)):
        failures.append(f"training logged steps {[s for s, _ in logged]}")
    devs = [m.get("train/first_minibatch_ratio_dev") for _, m in logged]
    if any(d is None or d != 0.0 for d in devs):
        failures.append(f"first-minibatch ratio deviations {devs} (must be exactly 0)")
    initial, _ = load_checkpoint(model_dir)
    trained, _ = load_checkpoint(ckpt)
    if all(torch.equal(a, b) for a, b in zip(initial.parameters(), trained.parameters())):
        failures.append("the policy did not change in training")
    n_params = sum(p.numel() for p in initial.parameters())
    peak = max(m["train/peak_memory_gb"] for _, m in logged)
    times = [round(m["train/step_time_s"], 2) for _, m in logged]
    if not all(math.isfinite(x) for x in [peak, *times]):
        failures.append("non-finite peak memory or step time")
    report = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu", "params_m": round(n_params / 1e6, 1),
              "step_time_s": times, "wall_s": round(wall, 1), "peak_memory_gb": round(peak, 3),
              "peak_is": "GPU memory allocated" if args.device == "cuda" else "process RSS",
              "first_minibatch_ratio_dev": devs,
              "split_last_step_s": {k: round(logged[-1][1].get(f"train/{k}", float("nan")), 2)
                                    for k in ("generate_time_s", "logprob_time_s", "update_time_s")}}
    print("gpu_check_train:", json.dumps(report))
    if failures:
        print("gpu_check_train: FAILED:", "; ".join(failures), file=sys.stderr)
        return 1
    print("gpu_check_train: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
