"""GPU check of paper-sized batches: a randomly initialised model of Qwen2.5-Math-1.5B's shape (hidden 1536, 28
layers, 12 query and 2 key/value heads, 8960 intermediate, 151,936-token vocabulary: 1.54B parameters) takes one
optimiser step on ``quatro_main``'s batch shape (256 prompts x 8 responses, the whole 2,048 in one minibatch), with
``train.micro_batch_tokens=auto`` (the memory plan's largest on this GPU), bf16 autocast, the k3 KL term's reference
model and AdamW; prints the measured peak GPU memory beside the plan's estimate and the micro-batches it took.

    python scripts/gpu_check_scale.py [--device cuda|cpu] [--prompts 256] [--group 8] [--prompt-tokens 128]
                                      [--response-tokens 512] [--hidden 1536] [--layers 28] [--vocab 151936]

Built for the device machine (one GPU, no network, PyTorch + transformers): nothing is downloaded (the model is
built from its shape; the batch is synthetic: random tokens, responses of half to all of ``--response-tokens``), no
generation (the update is what a paper preset's memory is about; generation's own budget is vLLM's). With
``--device cpu --hidden 64 --layers 2 --vocab 1000 --prompts 4 --response-tokens 16`` the same path runs on the CPU
(the test suite does, so the script cannot rot where no GPU is lent).

Checks (exit 1 with the reason): the step ran (no out-of-memory error), every pass held at most the budget, the
weights changed, the loss and gradient norm are finite, and the measured peak is within 25% of the plan.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--response-tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=8960)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    args = ap.parse_args(argv)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from core.scoring import Scorer, choose_layout
    from training.algorithms import BoundLoss, get_advantage_fn
    from training.batch import RolloutBatch
    from training.memory_plan import ModelShape, RunShape, auto_budget, device_memory_gb, plan_memory
    from training.settings import OldLogprobs
    from training.update import UpdateControl, UpdateSettings, update_policy

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_scale: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    heads = args.heads if args.hidden >= 64 * args.heads else max(1, args.hidden // 64)
    kv = min(args.kv_heads, heads)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate
                         if args.hidden >= 1536 else 2 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=4096,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device(device):
        model = Qwen2ForCausalLM(config).float().train()
    ref = Qwen2ForCausalLM(config).to(device).eval().requires_grad_(False)
    ref.load_state_dict(model.state_dict())
    bf16 = args.precision == "bf16"
    if bf16:
        ref.to(torch.bfloat16)
    shape = ModelShape.from_config(config, "qwen2.5-math-1.5b-shaped")
    n = args.prompts * args.group
    run = RunShape(minibatch_rows=n, max_prompt_tokens=args.prompt_tokens, max_new_tokens=args.response_tokens,
                   kl=True, bf16=bf16, checkpointing=False, rollout="none", gpu_share=0.0,
                   prompts_per_step=args.prompts, group_size=args.group)
    total_gb = device_memory_gb(args.device)
    budget = auto_budget(shape, run, args.device, total_gb)
    plan = plan_memory(shape, run, budget, args.device, total_gb)
    layout, why = choose_layout(model, "auto", bf16)

    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(10, args.vocab - 1, (args.prompts, args.prompt_tokens), generator=g)
    prompt_ids = prompt_ids.repeat_interleave(args.group, 0)
    response_ids = torch.randint(10, args.vocab - 1, (n, args.response_tokens), generator=g)
    lengths = torch.randint(max(1, args.response_tokens // 2), args.response_tokens + 1, (n,), generator=g)
    response_mask = (torch.arange(args.response_tokens).unsqueeze(0) < lengths.unsqueeze(1)).long()
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    nan = torch.full((n, args.response_tokens), float("nan"))
    batch = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids), response_ids=response_ids,
                         response_mask=response_mask, old_logprobs=nan.clone(), rewards=rewards,
                         group_index=torch.arange(args.prompts).repeat_interleave(args.group),
                         response_lengths=lengths, correct=rewards > 0, entropy=nan.clone()).to(device)
    scorer = Scorer(budget, layout).for_model(model)
    with torch.no_grad():  # the reference pass, as the engine's rollout does it
        batch.ref_logprobs, _ = scorer.score(ref, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                             batch.response_mask, bf16=bf16)
    del ref
    adv, _ = get_advantage_fn("quatro")(batch, delta=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    before = [p.detach()[:1].clone() for p in model.parameters()]
    settings = UpdateSettings(minibatch_size=n, beta=0.001, bf16=bf16, old_logprobs=OldLogprobs.DEFERRED,
                              norm_constant=args.response_tokens)
    failures = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t1 = time.time()
    try:
        [m] = update_policy(model, opt, batch, adv.to(device), BoundLoss.named("quatro"), settings, scorer,
                            UpdateControl(torch.Generator().manual_seed(0)))
    except torch.OutOfMemoryError as e:
        print(f"gpu_check_scale: FAILED: out of memory at budget {budget} ({e})", file=sys.stderr)
        return 1
    step_s = time.time() - t1
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    plans = scorer.plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask)
    if budget is not None and max(x.tokens for x in plans) > budget:
        failures.append(f"a pass held {max(x.tokens for x in plans)} positions, over the budget {budget}")
    if all(torch.equal(a, p.detach()[:1]) for a, p in zip(before, model.parameters())):
        failures.append("the weights did not change")
    if not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])):
        failures.append(f"non-finite loss {m['loss']} or gradient norm {m['grad_norm']}")
    planned = plan.allocated_gb if device.type == "cuda" else plan.total_gb  # the CUDA context is not allocated memory
    ratio = planned / peak if peak > 0 else float("nan")
    if device.type == "cuda" and not 0.75 <= ratio <= 1.25:
        failures.append(f"plan {planned:.1f} GiB against measured {peak:.1f} GiB ({ratio:.2f}x)")
    report = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "device_gb": round(total_gb or 0, 1), "params_b": round(shape.n_params / 1e9, 3),
              "responses": n, "tokens": int(batch.response_mask.sum() + batch.prompt_mask.sum()),
              "layout": layout, "layout_reason": why, "micro_batch_tokens": budget, "micro_batches": m["micro_batches"],
              "padding_share": round(m["update_padding"] / max(m["update_tokens"], 1), 4),
              "update_s": round(step_s, 1), "setup_s": round(t1 - t0, 1),
              "measured_peak_gb": round(peak, 2), "plan_gb": round(planned, 2), "plan_vs_measured": round(ratio, 3),
              "peak_is": "GPU memory allocated" if device.type == "cuda" else "process RSS",
              "plan": plan.as_dict(), "loss": m["loss"], "grad_norm": m["grad_norm"]}
    print("gpu_check_scale:", json.dumps(report))
    if failures:
        print("gpu_check_scale: FAILED:", "; ".join(failures), file=sys.stderr)
        return 1
    print("gpu_check_scale: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
