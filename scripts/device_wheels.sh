#!/usr/bin/env bash
# Wheels the GPU check scripts need on the device machine beyond its own set (PyTorch, transformers, pandas,
# pyarrow, scipy, scikit-learn, sympy; Python 3.12, no network): pure-Python wheels built here, and rapidfuzz's
# CPython 3.12 wheel. Writes .device-wheels/ (git-ignored, a few MB); carry it to the device and install with
#   pip install --no-deps --no-index --target /tmp/deps .device-wheels/*
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
rm -rf .device-wheels && mkdir -p .device-wheels
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
"$PY" -m pip wheel -q --no-deps -w .device-wheels \
  "omegaconf==$(version omegaconf)" "antlr4-python3-runtime==$(version antlr4-python3-runtime)" \
  "math-verify==$(version math-verify)" "latex2sympy2_extended==$(version latex2sympy2_extended)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .device-wheels "rapidfuzz>=3,<4"
ls -la .device-wheels
