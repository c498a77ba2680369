"""GPU smoke check for VLLMSampler: runs on any single-GPU machine without network access.

    python scripts/gpu_smoke_vllm.py [--out DIR]

Builds a tiny Llama from a config and a byte-level BPE tokenizer trained in-process (nothing is
downloaded), samples with vLLM (n=4 per prompt, seeded; entropies from the teacher-forced pass), checks
the samples and their reproducibility, then runs the suite's evaluation (generated arithmetic) through the
same sampler. Exits non-zero on failure. (On a CPU machine the vLLM path is tested by tests/e2e/test_vllm.py.)
Needs: pip install -e '.[gpu]' (vLLM) on a CUDA machine.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tiny_model import build_tiny_model  # scripts/tiny_model.py, beside this file


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import torch

    if not torch.cuda.is_available():
        print("gpu_smoke_vllm: no CUDA device", file=sys.stderr)
        return 2
    from omegaconf import OmegaConf

    from core.sampling import SamplingSettings, VLLMSampler
    from core.tasks.arithmetic import arithmetic_splits
    from evaluation.pipeline import EvalJob, evaluate

    out = Path(args.out or tempfile.mkdtemp(prefix="vllm-smoke-"))
    model_dir = out / "tiny-model"
    build_tiny_model(model_dir, hidden=128, layers=2)
    sampler = VLLMSampler(model_dir, engine={"enforce_eager": True, "gpu_memory_utilization": 0.3, "max_model_len": 512})
    settings = SamplingSettings(temperature=1.0, top_p=1.0, max_new_tokens=16, chat_template=False)
    res = sampler.sample(["Compute 1 + 2.", "Compute 3 + 4."], 4, [0, 1], settings)
    assert len(res) == 2 and all(len(r) == 4 for r in res), res
    assert all(s["finish_reason"] in ("stop", "length") and s["n_tokens"] >= 1 for r in res for s in r)
    assert len({s["response"] for s in res[0]}) > 1, "the 4 samples of one prompt are identical"
    assert all(s["mean_token_entropy"] is not None and s["mean_token_entropy"] >= 0 for r in res for s in r)
    again = sampler.sample(["Compute 1 + 2.", "Compute 3 + 4."], 4, [0, 1], settings)
    assert [s["response"] for s in again[0]] == [s["response"] for s in res[0]], "same seed, different samples"
    print("VLLMSampler samples:", [s["response"][:30] for s in res[0]])
    _, heldout = arithmetic_splits(n_eval=8)
    heldout = [dict(r, task="arithmetic") for r in heldout]
    eval_cfg = OmegaConf.create({"benchmarks": ["arithmetic"], "max_prompts": 8, "n": 4, "ks": [1, 2, 4], "temperature": 1.0,
                                 "top_p": 1.0, "max_new_tokens": 16, "seed": 0, "batch_prompts": 4})
    metrics, files = evaluate(sampler, EvalJob(eval_cfg, heldout, chat_template=False), out / "eval")
    sampler.close()
    print({k: round(v, 4) for k, v in metrics.items() if k.startswith("eval/mean/")})
    print("gpu_smoke_vllm: OK", {k: str(v) for k, v in files.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
