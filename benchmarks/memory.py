"""Peak memory of one policy update, measured beside the memory plan's estimate, in one run.

    python -m benchmarks.memory [--model smollm2-135m] [--responses 64 256 1024] [--budget 2048]
                                [--prompt-tokens 40] [--response-tokens 48] [--json FILE]

Each configuration runs in its own process (peak resident memory is per process, ``ru_maxrss``): the policy in
float32 on the CPU with AdamW, a synthetic minibatch of N responses in groups of 8 sharing a prompt (prompts of
``--prompt-tokens``, responses of half to all of ``--response-tokens``, random tokens), one optimiser step over the
whole minibatch (``train.minibatch_size`` = N, one inner epoch, no reference model: KL off). Configurations: N in
``--responses`` with a fixed budget (``train.micro_batch_tokens`` = ``--budget``), and N = 64 without micro-batches
(the whole minibatch in one pass, as before micro-batches), with gradient checkpointing at the budget too. Beside each
measurement: the plan's estimate (:func:`training.memory_plan.plan_memory`, the same model shape, budget and
settings, the CPU's runtime and no rollout engine) and their ratio.

The figures are the process's peak resident set (Linux, GiB); the plan's parts are documented in
``training/memory_plan.py``. Measured figures, with date and machine: docs/performance.md.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time


def _synthetic(n: int, prompt_tokens: int, response_tokens: int, vocab: int, seed: int = 0):
    import torch

    from training.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    group = 8
    prompts = max(1, n // group)
    n = prompts * group
    prompt_ids = torch.randint(10, vocab - 1, (prompts, prompt_tokens), generator=g).repeat_interleave(group, 0)
    response_ids = torch.randint(10, vocab - 1, (n, response_tokens), generator=g)
    lengths = torch.randint(max(1, response_tokens // 2), response_tokens + 1, (n,), generator=g)
    response_mask = (torch.arange(response_tokens).unsqueeze(0) < lengths.unsqueeze(1)).long()
    rewards = torch.randint(0, 2, (n,), generator=g).float()
    nan = torch.full((n, response_tokens), float("nan"))
    return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids), response_ids=response_ids,
                        response_mask=response_mask, old_logprobs=nan.clone(), rewards=rewards,
                        group_index=torch.arange(prompts).repeat_interleave(group), response_lengths=lengths,
                        correct=rewards > 0, entropy=nan.clone())


def _measure(conn, model_name: str, n: int, budget, prompt_tokens: int, response_tokens: int, checkpointing: bool,
             layout: str) -> None:
    import resource

    import torch

    from core.models import load_policy
    from core.scoring import Scorer
    from orchestrator.checks.preflight import sweep_points
    from training.algorithms import BoundLoss, get_advantage_fn
    from training.settings import OldLogprobs
    from training.update import UpdateControl, UpdateSettings, update_policy

    [(_, cfg)] = sweep_points([f"model={model_name}", "eval=smoke"], multirun=False)
    model, _tok = load_policy(cfg.model)
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    batch = _synthetic(n, prompt_tokens, response_tokens, int(model.config.vocab_size))
    adv, _ = get_advantage_fn("grpo")(batch)
    settings = UpdateSettings(minibatch_size=batch.batch_size, old_logprobs=OldLogprobs.DEFERRED,
                              norm_constant=response_tokens)
    t0 = time.perf_counter()
    metrics = update_policy(model, opt, batch, adv, BoundLoss.named("grpo"), settings,
                            Scorer(budget, layout).for_model(model), UpdateControl(torch.Generator().manual_seed(0)))
    seconds = time.perf_counter() - t0
    conn.send({"peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "seconds": seconds,
               "micro_batches": metrics[0]["micro_batches"], "tokens": metrics[0]["update_tokens"],
               "responses": batch.batch_size})


def _plan(model_name: str, n: int, budget, prompt_tokens: int, response_tokens: int, checkpointing: bool,
          measured_tokens: int) -> dict:
    from orchestrator.checks.preflight import sweep_points
    from training.memory_plan import RunShape, model_shape, plan_memory

    [(_, cfg)] = sweep_points([f"model={model_name}", "eval=smoke"], multirun=False)
    run = RunShape(minibatch_rows=n, max_prompt_tokens=prompt_tokens, max_new_tokens=response_tokens, kl=False,
                   bf16=False, checkpointing=checkpointing, rollout="none", gpu_share=0.0, prompts_per_step=0,
                   group_size=0)
    # without a budget the pass holds the whole minibatch: the positions it computed
    plan = plan_memory(model_shape(cfg.model), run, budget if budget is not None else measured_tokens, "cpu", None)
    return plan.as_dict()


def run_config(model: str, n: int, budget, prompt_tokens: int, response_tokens: int, checkpointing: bool = False,
               layout: str = "tree") -> dict:
    """One configuration in its own process: measured peak, the plan's estimate, their ratio."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_measure, args=(child, model, n, budget, prompt_tokens, response_tokens, checkpointing,
                                           layout))
    p.start()
    got = parent.recv() if parent.poll(7200) else None
    p.join()
    if got is None or p.exitcode != 0:
        return {"responses": n, "budget": budget, "checkpointing": checkpointing, "error": f"exit {p.exitcode}"}
    plan = _plan(model, got["responses"], budget, prompt_tokens, response_tokens, checkpointing, got["tokens"])
    return {"responses": got["responses"], "budget": budget, "checkpointing": checkpointing, "layout": layout,
            "micro_batches": got["micro_batches"], "positions": got["tokens"], "seconds": round(got["seconds"], 1),
            "measured_gb": round(got["peak_gb"], 3), "plan_gb": plan["total_gb"],
            "plan_vs_measured": round(plan["total_gb"] / got["peak_gb"], 3), "plan": plan}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--responses", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--prompt-tokens", type=int, default=40)
    ap.add_argument("--response-tokens", type=int, default=48)
    ap.add_argument("--no-checkpointing-row", action="store_true", help="leave out the gradient-checkpointing row")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    configs = [(n, args.budget, False) for n in args.responses] + [(min(args.responses), None, False)]
    if not args.no_checkpointing_row:
        configs.append((min(args.responses), args.budget, True))
    rows = []
    for n, budget, ck in configs:
        r = run_config(args.model, n, budget, args.prompt_tokens, args.response_tokens, ck)
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "plan"}), flush=True)
    print(f"\n{args.model}, prompts {args.prompt_tokens} tokens, responses up to {args.response_tokens}, float32, CPU")
    print("| responses | micro_batch_tokens | checkpointing | passes | positions | seconds | measured peak GiB | plan GiB | plan / measured |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['responses']} | {r['budget']} | {r['checkpointing']} | failed: {r['error']} | | | | | |")
            continue
        print(f"| {r['responses']} | {r['budget'] if r['budget'] is not None else 'null'} | {r['checkpointing']} | "
              f"{r['micro_batches']} | {r['positions']} | {r['seconds']} | {r['measured_gb']:.2f} | {r['plan_gb']:.2f} | "
              f"{r['plan_vs_measured']:.2f} |")
    fixed = [r for r in rows if r.get("budget") == args.budget and not r.get("checkpointing") and "error" not in r]
    if len(fixed) >= 2:
        lo = min(fixed, key=lambda r: r["responses"])
        hi = max(fixed, key=lambda r: r["responses"])
        print(f"\nfixed budget: peak at {hi['responses']} responses / at {lo['responses']}: "
              f"{hi['measured_gb'] / lo['measured_gb']:.3f}")
    ok = [r for r in rows if "error" not in r]
    within = sum(1 for r in ok if abs(r["plan_vs_measured"] - 1) <= 0.25)
    print(f"plan within 25% of the measured peak: {within} of {len(ok)} configurations")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
