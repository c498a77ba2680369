"""GPU check of stale rollouts (``train.rollout.staleness``, docs/staleness.md) on one GPU: the same GRPO run three
times on a ~0.5B-parameter Llama built from a config (nothing downloaded), bf16 with gradient checkpointing, the
transformers sampler (the device machine has no vLLM): k = 0, k = 1 in sequential emulation, and k = 1 with
``train.rollout.overlap=true`` (step t+1 generated in a thread on its own CUDA stream, by a copy of the weights,
during step t's update). Prints each run's median step time (steps 1 on), peak GPU memory, the overlapped run's
wait for its generation, and how far the overlapped run's series are from the emulated run's.

    python scripts/gpu_check_async.py [--out DIR] [--steps 4] [--device cuda|cpu] [--hidden 1408] [--layers 24]

Built for the device machine like ``scripts/gpu_check_train.py`` (``bash scripts/device_wheels.sh`` here, then on the
device ``pip install --no-deps --no-index --target /tmp/deps .device-wheels/* && PYTHONPATH=/tmp/deps:. python
scripts/gpu_check_async.py``). ``--device cpu --hidden 128 --layers 2 --prompts 2 --tokens 8`` runs the same path on
the CPU (the test suite does, so this script cannot rot where no GPU is lent).

Checks (exit 1 with the reason): every run logs every step once; k = 1 trains on samples one step old after the
warm-up (``train/staleness_mean``); the overlapped run draws the emulated run's samples (equal rewards and response
lengths each step; the transformers sampler's samples depend on the seeds and weights only, though on a GPU two
streams may round differently, so the loss series are reported, not required equal); times and memory are finite.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from gpu_check_eval import compose  # noqa: E402  (scripts/, beside this file)
from tiny_model import build_tiny_model  # noqa: E402

RUNS = {"k=0": (0, False), "k=1 emulated": (1, False), "k=1 overlapped": (1, True)}
SAME = ("train/reward_mean", "train/response_length_mean", "train/staleness_mean")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--hidden", type=int, default=1408)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (8 responses each)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per response")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_async: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-gpu-async-")).resolve()
    model_dir = out / "model"
    build_tiny_model(model_dir, hidden=args.hidden, layers=args.layers)
    from training.engines.local import train, validate

    failures, series, report = [], {}, {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}
    for name, (k, overlap) in RUNS.items():
        cfg = compose(["algo=grpo", "eval=smoke", f"train.steps={args.steps}", f"train.prompts_per_step={args.prompts}",
                       "train.group_size=8", "train.minibatch_size=16", f"train.max_new_tokens={args.tokens}",
                       "train.lr=1e-5", "train.precision=" + ("bf16" if args.device == "cuda" else "fp32"),
                       "train.gradient_checkpointing=true", f"train.device={args.device}", "train.rollout.sampler=hf",
                       f"train.rollout.staleness={k}", f"train.rollout.overlap={str(overlap).lower()}",
                       "train.rollout.correction=" + ("token_tis" if k else "none"),
                       "model.name=gpu-check-async", "model.source=pretrained", f"model.path={model_dir}",
                       "model.chat_template=false"])
        validate(cfg)
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        logged = []
        t0 = time.time()
        train(cfg, out / name.replace(" ", "_").replace("=", ""), lambda m, s: logged.append((s, m)))
        wall = time.time() - t0
        if [s for s, _ in logged] != list(range(args.steps)):
            failures.append(f"{name}: logged steps {[s for s, _ in logged]}")
        series[name] = {key: [m.get(key) for _, m in logged] for key in {k_ for _, m in logged for k_ in m}}
        steps = [m["train/step_time_s"] for _, m in logged][1:] or [logged[0][1]["train/step_time_s"]]
        report[name] = {"step_s": round(statistics.median(steps), 3), "wall_s": round(wall, 1),
                        "peak_memory_gb": round(max(m["train/peak_memory_gb"] for _, m in logged), 3),
                        "generate_s": round(statistics.median(m.get("train/generate_time_s", 0.0) for _, m in logged), 3)}
        if overlap:
            report[name]["overlap_wait_s"] = round(statistics.median(m["train/overlap_wait_s"] for _, m in logged), 3)
        if not all(math.isfinite(v) for v in (report[name]["step_s"], report[name]["peak_memory_gb"])):
            failures.append(f"{name}: non-finite step time or memory")
    if series["k=1 emulated"].get("train/staleness_mean", [None])[1:] != [1.0] * (args.steps - 1):
        failures.append(f"k=1: staleness {series['k=1 emulated'].get('train/staleness_mean')}")
    emu, ovl = series["k=1 emulated"], series["k=1 overlapped"]
    for key in SAME:
        if emu.get(key) != ovl.get(key):
            failures.append(f"overlapped {key} {ovl.get(key)} != emulated {emu.get(key)}")
    diffs = {key: max(abs(a - b) for a, b in zip(emu[key], ovl[key])) for key in ("train/loss", "train/grad_norm",
                                                                                  "train/staleness_logprob_gap")
             if key in emu and key in ovl and None not in emu[key] + ovl[key]}
    report["overlapped_vs_emulated_max_abs_diff"] = {k: float(f"{v:.3g}") for k, v in diffs.items()}
    report["overlapped_step_vs_emulated"] = round(report["k=1 overlapped"]["step_s"] / report["k=1 emulated"]["step_s"], 3)
    report["emulated_step_vs_k0"] = round(report["k=1 emulated"]["step_s"] / report["k=0"]["step_s"], 3)
    print("gpu_check_async:", json.dumps(report))
    if failures:
        print("gpu_check_async: FAILED:", "; ".join(failures), file=sys.stderr)
        return 1
    print("gpu_check_async: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
