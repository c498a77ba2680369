"""How stable the bf16 probe's figure is (issue 56: it read 0.01x-0.50x on one machine): ``core.precision.
probe_slowdown`` in ``--runs`` fresh processes, each figure and the spread (largest / smallest; the acceptance: under
2x on a quiet machine).

    python -m benchmarks.precision_probe [--runs 5]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

CODE = ("import time; t = time.perf_counter(); from core.precision import probe_slowdown as p; r = p('cpu'); "
        "print(r, time.perf_counter() - t)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.precision_probe", description=__doc__)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    figures = []
    for i in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout.split()
        ratio, seconds = float(out[-2]), float(out[-1])
        figures.append(ratio)
        print(f"run {i + 1}: bf16/float32 time {ratio:.3f} (probe {seconds:.2f} s)", flush=True)
    print(f"spread (largest / smallest): {max(figures) / min(figures):.2f}x over {len(figures)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
