"""One RL step's cost, side by side in one run: this suite's local engine and TRL's ``GRPOTrainer`` on the same work.

    python -m benchmarks.train_step [--steps 4] [--model smollm2-135m|tiny-random] [--max-new-tokens 48]
                                    [--rollout vllm hf] [--local-overrides train.gradient_checkpointing=true ...]

The work (the issue's protocol): SmolLM2-135M-Instruct, 4 prompts x 8 samples x up to 48 new tokens, one inner
epoch, the whole batch in one optimiser step, beta = 0, float32 on the CPU, lr 1e-6, temperature 1.0. Both engines
get the *same* prompts in the same order (the suite's arithmetic training prompts in the order its engine draws
them; TRL's dataset is that list, unshuffled), with the chat template, and the same reward (the task's verifier).
Each engine runs in its own process (so each one's peak resident memory is its own); the parent lets them take
steps in turn, alternating who goes first each round, so both see the same machine. The first step of each is a
warm-up and left out of the medians.

Per step: wall time, and its split into generation, scoring (rewards, and the suite's old-log-prob/entropy pass;
TRL computes none with one inner epoch), the training forward pass, and backward + optimiser. TRL's split comes from
timing its own methods (``_generate``, ``_generate_and_score_completions``, ``compute_loss``) in its process; the
suite's from its step metrics. TRL runs with its defaults otherwise (gradient checkpointing on, token-level
``dapo`` loss); ``--local-overrides`` sets the suite's options (``train.gradient_checkpointing=true``,
``train.precision=bf16``). Needs the ``bench`` extra (``pip install -e '.[bench]'``; ``scripts/install.sh`` installs it).

``--rollout`` runs the local engine once per rollout sampler (``train.rollout.sampler``: ``vllm``, the process's vLLM
engine taking the policy's weights in place after each step; ``hf``, transformers ``generate`` on the policy), each in
its own process beside TRL's. For vLLM it also reports the weight sync's seconds per step and, after the last step,
raw ``vllm.LLM.generate`` on the same engine doing the work of the rollout's last call (the same token ids, one
seeded request per prompt with log-probs, no detokenisation: the same samples; each call from an empty prefix cache,
as a step's is), that call redone, and raw as a user writes it (one unseeded ``SamplingParams``, detokenised): the
rollout's generated tokens/s in its steps against raw vLLM's on the same work (issue 59's measure).
TRL's ``use_vllm`` colocate mode is not in the table: on vLLM's CPU build it fails at its first weight sync (the
docs/performance.md says why).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time


def _rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _overrides(args) -> list[str]:
    return [f"model={args.model}", "algo=grpo", "algo.kl_beta=0.0", "train.ppo_epochs=1", "train.minibatch_size=null",
            "train.lr=1e-6", f"train.steps={args.steps}", "train.prompts_per_step=4", "train.group_size=8",
            f"train.max_new_tokens={args.max_new_tokens}", "train.temperature=1.0", "train.top_p=1.0",
            "train.device=cpu", "train.precision=fp32", "eval=smoke", *args.local_overrides]  # TRL's float32 (not auto)


def _compose(args, extra=()):
    from orchestrator.checks.preflight import sweep_points

    [(_, cfg)] = sweep_points(_overrides(args) + list(extra), multirun=False)
    return cfg


def prompt_sequence(cfg) -> list[dict]:
    """The training rows in the order the local engine draws them (its seeded shuffle, popped from the end)."""
    import random

    from core.tasks import load_prompts

    rows = load_prompts(cfg.data, "train")
    rng, order, out = random.Random(int(cfg.seed)), [], []
    for _ in range(int(cfg.train.steps) * int(cfg.train.prompts_per_step)):
        if not order:
            order.extend(range(len(rows)))
            rng.shuffle(order)
        out.append(rows[order.pop()])
    return out


class _Stop(Exception):
    pass


def _gate(conn):
    conn.send(("ready", None))
    if conn.recv() != "go":
        raise _Stop()


def _local_worker(conn, args, rollout="hf", packing="auto", lora: int = 0, staleness: int | None = None,
                  overlap: bool = False) -> None:
    import tempfile

    from training.engines import local
    from training.engines.local import local_loop

    cfg = _compose(args, [f"train.rollout.sampler={rollout}", f"train.packing={packing}", f"train.lora.rank={lora}",
                          f"train.lora.alpha={LORA_ALPHA}"])
    if staleness is not None:  # the staleness phase: k steps more, so that every timed step generates a batch
        cfg.train.rollout.staleness = int(staleness)
        cfg.train.steps = int(args.steps) + int(args.staleness)
        cfg.train.rollout.overlap = bool(overlap)
    real = local_loop.step_rollout
    waited = [0.0]

    def gated(*a, **k):  # every step starts when the parent says so (the wait is not the step's time)
        t0 = time.perf_counter()
        _gate(conn)
        waited[0] = time.perf_counter() - t0
        return real(*a, **k)

    local_loop.step_rollout = gated
    last, replays = {}, []  # the rollout's last engine call (vLLM), for raw vLLM to redo after the steps; per step
    if rollout == "vllm":  # ... and in the main phase, raw vLLM on that step's requests right after them, timed apart
        from core.sampling.rollout import VLLMRollout

        real_generate = VLLMRollout.generate

        def recorded(self, *a):
            last.update(rollout=self, args=a)
            if staleness is not None:
                return real_generate(self, *a)
            # raw before the call on every other step, after it on the others: neither side always runs on the
            # caches the update left (each from an empty prefix cache)
            first = len(replays) % 2 == 0
            t0 = time.perf_counter()
            speed = _raw_same_work(self, a) if first else None
            replay_s = time.perf_counter() - t0
            self.engine.llm.reset_prefix_cache()
            out = real_generate(self, *a)
            if not first:
                t0 = time.perf_counter()
                speed = _raw_same_work(self, a)
                replay_s = time.perf_counter() - t0
            replays.append((speed, replay_s))
            return out

        VLLMRollout.generate = recorded

    def report(m, step):
        raw_speed, replay_s = replays[-1] if replays else (None, 0.0)  # (its time left out of the step's)
        conn.send(("step", {"total": m["train/step_time_s"] - waited[0] - replay_s,
                            "generate": m.get("train/generate_time_s", 0.0) - replay_s,
                            **({"raw_same_work_tokens_per_s": raw_speed} if raw_speed else {}),
                            "scoring": m.get("train/reward_time_s", 0.0) + m.get("train/logprob_time_s", 0.0),
                            "forward": m.get("train/update_forward_time_s", 0.0),
                            "backward_optimiser": m.get("train/update_backward_time_s", 0.0),
                            "weight_sync": m.get("train/weight_sync_time_s", 0.0),
                            "padding_share": m.get("train/padding_share", 0.0),
                            "overlap_wait": m.get("train/overlap_wait_s", 0.0),
                            "generated_tokens": m["train/response_length_mean"] * m["train/batch_responses"],
                            "reward_mean": m["train/reward_mean"], "peak_rss_gb": _rss_gb()}))
    run_dir = tempfile.mkdtemp(prefix="rlvr-bench-")
    from training.engines import EngineChoices

    choices = EngineChoices()  # what the engine chose, its memory record among them (the orchestrator's record)
    try:
        local.train(cfg, run_dir, report, choices=choices)
    except _Stop:
        pass
    peak_rss = _rss_gb()
    trainable = choices.memory["parameters"]["trainable"]
    raw = {}
    if rollout == "vllm" and staleness is None:  # raw LLM.generate when the parent says so: every other worker has
        # finished its steps (not in the staleness phase, whose workers the parent stops at a step's gate)
        conn.send(("ready", None))
        conn.recv()
        VLLMRollout.generate = real_generate
        raw = _raw_vllm(last)
    conn.send(("done", {"peak_rss_gb": peak_rss, "trainable_params": trainable, **raw}))


def _raw_same_work(ro, args) -> float:
    """Raw ``vllm.LLM.generate`` on a rollout call's requests (:meth:`VLLMRollout.requests`), on the same weights
    (right after the call, before the update) and from an empty prefix cache, as the call ran: generated tokens/s of
    the same samples."""
    ids, params = ro.requests(*args)
    ro.engine.llm.reset_prefix_cache()
    t0 = time.perf_counter()
    outs = ro.engine.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
    return sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t0)


def _raw_vllm(last: dict, repeats: int = 3) -> dict:
    """Raw ``vllm.LLM.generate`` doing the work of the run's last rollout call, on the same engine (holding the final
    policy): the same prompt token ids, one request per prompt with the rollout's seed, the sampled tokens'
    log-probs, no detokenisation (:meth:`core.sampling.rollout.VLLMRollout.requests`: the same samples); beside it
    that call itself (``VLLMRollout.generate``: tokenisation, the requests, tensors and texts) and raw as a user writes
    it (one ``SamplingParams`` for all prompts, no seed, detokenised). Alternating, each call from an empty prefix
    cache (a step's prompts are new and a sync empties it); medians of ``repeats``: generated tokens/s."""
    from vllm import SamplingParams

    ro, args = last["rollout"], last["args"]
    _texts, n, temperature, top_p, max_new, _seed = args
    llm = ro.engine.llm
    ids, params = ro.requests(*args)
    prompts = [{"prompt_token_ids": x} for x in ids]
    plain = SamplingParams(n=int(n), temperature=float(temperature), top_p=float(top_p), max_tokens=int(max_new))

    def tokens(params_):
        return sum(len(c.token_ids) for o in llm.generate(prompts, params_, use_tqdm=False) for c in o.outputs)

    calls = {"raw_vllm": lambda: tokens(params), "rollout_call": lambda: int(ro.generate(*args).response_lengths.sum()),
             "raw_plain": lambda: tokens([plain] * len(prompts))}
    times, counts = {k: [] for k in calls}, {}
    for _ in range(repeats):
        for k, fn in calls.items():
            llm.reset_prefix_cache()
            t0 = time.perf_counter()
            counts[k] = fn()
            times[k].append(time.perf_counter() - t0)
    return {f"{k}_tokens_per_s": counts[k] / statistics.median(times[k]) for k in calls}


def _trl_worker(conn, args, lora: int = 0) -> None:
    import tempfile

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from core.models import model_path
    from training.rewards import row_rewards

    cfg = _compose(args)
    rows = prompt_sequence(cfg)
    path = model_path(cfg.model)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "row": json.dumps(r, default=str)}
                              for r in rows])

    def reward(completions, row, **kw):  # the suite's own reward: the same verifier for both engines
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return row_rewards(texts, [json.loads(x) for x in row])[0].tolist()

    conf = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="rlvr-bench-trl-"), use_cpu=True, bf16=False,
                      per_device_train_batch_size=32, num_generations=8,
                      max_completion_length=args.max_new_tokens, beta=0.0, num_iterations=1, steps_per_generation=1,
                      gradient_accumulation_steps=1, learning_rate=1e-6 * (10 if lora else 1), max_steps=int(args.steps), temperature=1.0,
                      top_p=1.0, shuffle_dataset=False, logging_steps=1, save_strategy="no", report_to=[],
                      seed=int(cfg.seed), dataloader_num_workers=0)
    timers = {"generate": 0.0, "gen_and_score": 0.0, "forward": 0.0}

    def timed(obj, name, key):
        real = getattr(obj, name)

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                timers[key] += time.perf_counter() - t0
        setattr(obj, name, wrapper)

    class Gate(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            for k in timers:
                timers[k] = 0.0
            _gate(conn)
            self.t0 = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            total = time.perf_counter() - self.t0
            conn.send(("step", {"total": total, "generate": timers["generate"],
                                "scoring": timers["gen_and_score"] - timers["generate"], "forward": timers["forward"],
                                "backward_optimiser": total - timers["gen_and_score"] - timers["forward"],
                                "reward_mean": None, "peak_rss_gb": _rss_gb()}))

    peft_config = None
    if lora:  # TRL's LoRA: peft's adapters on every linear layer, as the suite's train.lora
        from peft import LoraConfig

        peft_config = LoraConfig(r=lora, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear",
                                 task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=conf, train_dataset=data, processing_class=tok,
                          callbacks=[Gate()], peft_config=peft_config)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    timed(trainer, "_generate", "generate")
    timed(trainer, "_generate_and_score_completions", "gen_and_score")
    timed(trainer, "compute_loss", "forward")
    try:
        trainer.train()
    except _Stop:
        pass
    conn.send(("done", {"peak_rss_gb": _rss_gb(), "trainable_params": trainable}))




def _phase(args, workers: dict) -> tuple[dict, dict]:
    """Start ``workers`` ({name: (function, extra args)}) in their own processes and let them take ``args.steps``
    steps in turn, alternating who goes first. Returns ({name: [step dicts]}, {name: what it sent when done})."""
    ctx = mp.get_context("spawn")
    conns, procs = {}, {}
    for name, (fn, extra) in workers.items():
        parent, child = ctx.Pipe()
        p = ctx.Process(target=fn, args=(child, args, *extra))  # not daemonic: the verifier starts its own workers
        p.start()
        conns[name], procs[name] = parent, p
    results = {name: [] for name in workers}
    peak = {}
    names = list(workers)
    try:
        for step in range(args.steps):
            for name in (names if step % 2 == 0 else names[::-1]):
                kind, _ = conns[name].recv()
                if kind != "ready":
                    raise RuntimeError(f"{name}: expected to be ready for step {step}, got {kind}")
                conns[name].send("go")
                kind, payload = conns[name].recv()
                results[name].append(payload)
                print(f"step {step}: {name}: {payload['total']:.2f} s", flush=True)
        for name in sorted(names, key=lambda n: "vllm" in n):  # vLLM's raw measurement last, on an idle machine
            kind, payload = conns[name].recv()
            if kind == "ready":  # TRL asks for one more step before it notices max_steps (and the vLLM worker for its
                # raw measurement): release it
                conns[name].send("stop")
                kind, payload = conns[name].recv()
            peak[name] = payload
    finally:
        for p in procs.values():
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return results, peak


TRL = "TRL GRPOTrainer"
LORA_ALPHA = 16  # the suite's default train.lora.alpha


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m", help="a model preset of sweeps/model/")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--local-overrides", nargs="*", default=[])
    ap.add_argument("--rollout", nargs="+", default=None, choices=["vllm", "hf"],
                    help="the local engine's rollout samplers (train.rollout.sampler), one process each")
    ap.add_argument("--packing", nargs="+", default=["tree", "padded"], choices=["auto", "tree", "packed", "padded"],
                    help="the local engine's layouts (train.packing): one phase each, beside its own TRL process")
    ap.add_argument("--lora", type=int, default=0, help="also a phase with LoRA adapters of this rank on every linear "
                    "layer (learning rate 10x): the local engine's train.lora beside TRL's GRPOTrainer with a peft_config")
    ap.add_argument("--staleness", type=int, default=0, help="also a phase with train.rollout.staleness=K beside K=0 "
                    "(the local engine only, the first rollout sampler and layout; sequential emulation)")
    ap.add_argument("--overlap", action="store_true", help="with --staleness: also a phase with train.rollout.overlap="
                    "true beside the emulation at the same K (step K's generation in a thread during the update)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.rollout is None:  # vLLM where installed (the suite's choice on the CPU), else transformers
        from core.sampling import SAMPLERS

        args.rollout = ["vllm"] if SAMPLERS["vllm"].missing() is None else ["hf"]
    try:
        import trl  # noqa: F401
    except ImportError:
        print("error: TRL is not installed; pip install -e '.[bench]'", file=sys.stderr)
        return 2
    # one phase per layout (the local engine with each rollout sampler, and TRL): a 2-core, 24 GB machine holds a
    # vLLM worker and TRL at once, not two vLLM workers
    summary, ratios, steps = {}, {}, {}
    for packing in args.packing:
        workers = {**{f"local, {r} rollouts, packing {packing}": (_local_worker, (r, packing)) for r in args.rollout},
                   TRL: (_trl_worker, ())}
        results, peak = _phase(args, workers)
        phase = _summarise(args, results, peak)
        trl = phase.pop(TRL)
        summary[f"{TRL} (beside packing {packing})"] = trl
        for name, s in phase.items():
            summary[name] = s
            r = ratios[name] = {"step_vs_trl": s["total"] / trl["total"],
                                "memory_vs_trl": s["peak_rss_gb"] / trl["peak_rss_gb"],
                                "sync_share_of_step": s["weight_sync"] / s["total"]}
            if "raw_vllm_tokens_per_s" in s:
                r["rollout_vs_raw_vllm"] = s.get("rollout_vs_raw_same_work",
                                                 s["rollout_tokens_per_s"] / s["raw_vllm_tokens_per_s"])
                r["rollout_call_vs_raw_vllm"] = s["rollout_call_tokens_per_s"] / s["raw_vllm_tokens_per_s"]
                r["raw_vllm_vs_plain"] = s["raw_vllm_tokens_per_s"] / s["raw_plain_tokens_per_s"]
        steps.update({f"{k} (packing {packing})" if k == TRL else k: v for k, v in results.items()})
    if args.lora:  # LoRA: the local engine's adapters beside TRL's, on the first layout and rollout sampler
        full = f"local, {args.rollout[0]} rollouts, packing {args.packing[0]}"
        name, trl_name = f"local LoRA r{args.lora}, {args.rollout[0]} rollouts", f"{TRL} + peft LoRA r{args.lora}"
        results, peak = _phase(args, {name: (_local_worker, (args.rollout[0], args.packing[0], args.lora)),
                                      trl_name: (_trl_worker, (args.lora,))})
        phase = _summarise(args, results, peak)
        summary.update(phase)
        s, trl = phase[name], phase[trl_name]
        ratios[name] = {"step_vs_trl": s["total"] / trl["total"], "memory_vs_trl": s["peak_rss_gb"] / trl["peak_rss_gb"],
                        "sync_share_of_step": s["weight_sync"] / s["total"],
                        "step_vs_full": s["total"] / summary[full]["total"],
                        "memory_vs_full": s["peak_rss_gb"] / summary[full]["peak_rss_gb"],
                        "sync_vs_full": s["weight_sync"] / max(summary[full]["weight_sync"], 1e-9)}
        steps.update(results)
    if args.staleness:  # rollouts K steps stale beside on-policy ones, the same work (docs/staleness.md)
        base = f"local, {args.rollout[0]} rollouts, k=0"
        name = f"local, {args.rollout[0]} rollouts, k={args.staleness}"
        results, peak = _phase(args, {base: (_local_worker, (args.rollout[0], args.packing[0], 0, 0)),
                                      name: (_local_worker, (args.rollout[0], args.packing[0], 0, args.staleness))})
        phase = _summarise(args, results, peak)
        summary.update(phase)
        s, b = phase[name], phase[base]
        ratios[name] = {"step_vs_k0": s["total"] / b["total"], "memory_vs_k0": s["peak_rss_gb"] / b["peak_rss_gb"],
                        "generate_vs_k0": s["generate"] / max(b["generate"], 1e-9),
                        "scoring_vs_k0": s["scoring"] / max(b["scoring"], 1e-9), "overlap_share": 0.0}
        steps.update(results)
    if args.staleness and args.overlap:  # the same K, generated during the update beside generated before it
        base = f"local, {args.rollout[0]} rollouts, k={args.staleness}"
        name = f"local, {args.rollout[0]} rollouts, k={args.staleness} overlapped"
        results, peak = _phase(args, {f"{base} (2nd)": (_local_worker, (args.rollout[0], args.packing[0], 0,
                                                                         args.staleness)),
                                      name: (_local_worker, (args.rollout[0], args.packing[0], 0, args.staleness,
                                                             True))})
        phase = _summarise(args, results, peak)
        summary.update(phase)
        s, b = phase[name], phase[f"{base} (2nd)"]
        # the share of the generation hidden behind the update: 1 - the update's wait for it / its own time
        ratios[name] = {"step_vs_emulated": s["total"] / b["total"], "memory_vs_emulated": s["peak_rss_gb"] / b["peak_rss_gb"],
                        "generate_vs_emulated": s["generate"] / max(b["generate"], 1e-9),
                        "overlap_share": max(0.0, 1.0 - s["overlap_wait"] / max(s["generate"], 1e-9))}
        steps.update(results)
    print(f"\nmedian over steps 2-{args.steps} (seconds per RL step; {args.model}, 4 prompts x 8 x {args.max_new_tokens} "
          f"tokens, float32, CPU{', ' + ' '.join(args.local_overrides) if args.local_overrides else ''})")
    print(f"{'engine':<42}{'step':>8}{'generate':>10}{'scoring':>9}{'forward':>9}{'bwd+opt':>9}{'sync':>7}"
          f"{'padding':>9}{'peak RSS GB':>13}{'trainable':>13}")
    for name, s in summary.items():
        print(f"{name:<42}{s['total']:>8.2f}{s['generate']:>10.2f}{s['scoring']:>9.2f}{s['forward']:>9.2f}"
              f"{s['backward_optimiser']:>9.2f}{s['weight_sync']:>7.2f}{s.get('padding_share', 0.0):>9.3f}"
              f"{s['peak_rss_gb']:>13.2f}{s.get('trainable_params') or 0:>13,}")
    for name, r in ratios.items():
        s = summary[name]
        if "step_vs_emulated" in r:
            print(f"{name} / emulated: step time {r['step_vs_emulated']:.3f}x, peak memory {r['memory_vs_emulated']:.3f}x,"
                  f" generation {r['generate_vs_emulated']:.2f}x its time in turn (it shares the cores with the update); "
                  f"{100 * r['overlap_share']:.0f}% of it hidden behind the update")
            continue
        if "step_vs_k0" in r:
            print(f"{name} / k=0: step time {r['step_vs_k0']:.3f}x, peak memory {r['memory_vs_k0']:.3f}x, generation "
                  f"{r['generate_vs_k0']:.2f}x, scoring {r['scoring_vs_k0']:.2f}x (the trainer's pass on the generating "
                  "weights: b's mismatch on the same weights); generation and "
                  "update overlap 0% (sequential emulation)")
            continue
        line = (f"{name} / TRL: step time {r['step_vs_trl']:.3f}x, peak memory {r['memory_vs_trl']:.3f}x; "
                f"padding {100 * s.get('padding_share', 0.0):.1f}% of the update's positions; "
                f"rollout {s.get('rollout_tokens_per_s', 0):.0f} tokens/s")
        if "step_vs_full" in r:
            line += (f"; against full fine-tuning: step time {r['step_vs_full']:.3f}x, peak memory "
                     f"{r['memory_vs_full']:.3f}x, weight sync {r['sync_vs_full']:.2f}x")
        if "rollout_vs_raw_vllm" in r:
            line += (f"; {r['rollout_vs_raw_vllm']:.2f}x raw vLLM on each step's requests beside them (median of "
                     f"{s.get('rollout_vs_raw_steps')}) "
                     f"(after the steps on the last one's: raw {s['raw_vllm_tokens_per_s']:.0f} tokens/s, the rollout's "
                     f"call redone {r['rollout_call_vs_raw_vllm']:.2f}x; "
                     f"raw as a user writes it, unseeded and detokenised, {s['raw_plain_tokens_per_s']:.0f} tokens/s on "
                     "its own samples); "
                     f"weight sync {100 * r['sync_share_of_step']:.1f}% of the step")
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "ratios": ratios, "steps": steps}, f, indent=1)
    return 0


def _summarise(args, results: dict, peak: dict) -> dict:
    """Medians over the timed steps (the first is a warm-up) per worker, with its peak memory and rollout speeds."""
    timed = {name: rows[1:] or rows for name, rows in results.items()}
    summary = {}
    for name, rows in timed.items():
        summary[name] = {k: statistics.median(r.get(k, 0.0) for r in rows)
                         for k in ("total", "generate", "scoring", "forward", "backward_optimiser", "weight_sync",
                                   "padding_share", "overlap_wait")}
        done = peak.get(name)
        done = done if isinstance(done, dict) else {"peak_rss_gb": done}
        summary[name]["peak_rss_gb"] = done.get("peak_rss_gb") or max(r["peak_rss_gb"] for r in results[name])
        summary[name]["steps_timed"] = len(rows)
        summary[name]["trainable_params"] = done.get("trainable_params")
        if rows and "generated_tokens" in rows[0]:
            summary[name]["rollout_tokens_per_s"] = statistics.median(r["generated_tokens"] / max(r["generate"], 1e-9)
                                                                      for r in rows)
        if rows and all("raw_same_work_tokens_per_s" in r for r in rows):  # step by step: the same samples
            per_step = [r["generated_tokens"] / max(r["generate"], 1e-9) / r["raw_same_work_tokens_per_s"] for r in rows]
            summary[name]["rollout_vs_raw_same_work"] = statistics.median(per_step)
            summary[name]["rollout_vs_raw_steps"] = [round(x, 3) for x in per_step]
        for k in ("raw_vllm_tokens_per_s", "rollout_call_tokens_per_s", "raw_plain_tokens_per_s"):
            if k in done:
                summary[name][k] = done[k]
    return summary


if __name__ == "__main__":
    sys.exit(main())
