"""GPU check of the training rollout's speed against raw vLLM (issue 59): ``benchmarks.sampling --breakdown`` on a
1.5B-shaped Llama built from a config (hidden 1536, 28 layers, a 512-token byte-level vocabulary trained in-process:
nothing downloaded), on the generation-dominated shape (64 prompts x 8 samples x 256 tokens) by default.

    python scripts/gpu_check_rollout.py [--out DIR] [--hidden 1536] [--layers 28] [--prompts 64] [--n 8]
                                        [--max-new-tokens 256] [--repeats 2]

Needs vLLM (a CUDA machine with ``pip install -e '.[gpu]'``; the lent device machine has none, so there it stops with
exit 2 and says so). ``--hidden 128 --layers 2 --prompts 4 --n 2 --max-new-tokens 8 --repeats 1`` runs the same
path on vLLM's CPU build (the test suite does, so this script cannot rot where no GPU is lent).

Checks (exit 1 with the reason): the rows that make the same requests draw the same samples (equal token counts),
and every row's speed is finite. The table says how the suite's rollout compares with raw vLLM on that machine.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from tiny_model import build_tiny_model  # noqa: E402  (scripts/, beside this file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    from core.sampling import SAMPLERS

    missing = SAMPLERS["vllm"].missing()
    if missing is not None:
        print(f"gpu_check_rollout: {missing}", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="rlvr-gpu-rollout-")).resolve()
    model_dir = out / "model"
    build_tiny_model(model_dir, hidden=args.hidden, layers=args.layers)
    from benchmarks.sampling import main as sampling

    result = out / "breakdown.json"
    rc = sampling(["--breakdown", "--model", str(model_dir), "--prompts", str(args.prompts), "--n", str(args.n),
                   "--max-new-tokens", str(args.max_new_tokens), "--top-p", "1.0", "--repeats", str(args.repeats),
                   "--json", str(result)])
    if rc:
        return rc
    got = json.loads(result.read_text())
    tokens, rates = got["tokens"], got["tokens_per_s"]
    same = {k: v for k, v in tokens.items() if k != "raw, one engine seed"}
    failures = []
    if len(set(same.values())) != 1:
        failures.append(f"the rows making the same requests drew different samples: {same}")
    if not all(math.isfinite(v) and v > 0 for v in rates.values()):
        failures.append(f"speeds {rates}")
    print("gpu_check_rollout:", json.dumps({"shape": got["shape"], "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
                                            "suite_vs_raw_same_requests": round(got["suite_vs_raw"], 3)}))
    if failures:
        print("gpu_check_rollout: FAILED:", "; ".join(failures), file=sys.stderr)
        return 1
    print("gpu_check_rollout: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
