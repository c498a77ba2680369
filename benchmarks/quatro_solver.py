"""QUATRO's dual solver and its advantage+loss cost relative to GRPO's.

    python -m benchmarks.quatro_solver [--repeats 5]

Prints the median wall time of ``quatro_dual`` on 10,000 groups of 8 and on 1,000 groups of 256
(random 0/1 rewards, delta 0.1), and the time of QUATRO's advantage + policy loss (forward and
backward) as a ratio of GRPO's on the same rollout batch.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from training.algorithms import get_advantage_fn, get_policy_loss_fn
from training.algorithms.quatro import quatro_dual
from training.batch import RolloutBatch


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rollout_batch(num_groups: int, G: int, L: int, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    B = num_groups * G
    old = -torch.rand(B, L, generator=g) * 2
    lengths = torch.randint(L // 4, L + 1, (B,), generator=g)
    mask = (torch.arange(L).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return RolloutBatch(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                        response_ids=torch.zeros(B, L, dtype=torch.long), response_mask=mask, old_logprobs=old,
                        rewards=(torch.rand(B, generator=g) < 0.4).float(),
                        group_index=torch.arange(num_groups).repeat_interleave(G), response_lengths=lengths)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    results = {}
    for groups, G in ((10_000, 8), (1_000, 256)):
        rewards = (torch.rand(groups, G) < 0.4).double()
        t = _median_time(lambda: quatro_dual(rewards, 0.1), args.repeats)
        results[f"dual_{groups}x{G}_s"] = t
        print(f"quatro_dual on {groups:>6} groups of {G:>3}: {t * 1000:8.1f} ms (median of {args.repeats})")

    batch = _rollout_batch(num_groups=64, G=8, L=512)
    logits_like = (batch.old_logprobs + 0.01 * torch.randn_like(batch.old_logprobs))

    def step(adv_name, adv_params, loss_name, loss_params):
        def run():
            adv, _ = get_advantage_fn(adv_name)(batch, **adv_params)
            lp = logits_like.clone().requires_grad_(True)
            loss, _ = get_policy_loss_fn(loss_name)(lp, batch, adv, **loss_params)
            loss.backward()
        return run

    t_q = _median_time(step("quatro", {"delta": 0.1}, "quatro", {"loss_agg_mode": "seq-mean-token-mean"}), args.repeats)
    t_g = _median_time(step("grpo", {}, "grpo", {"loss_agg_mode": "seq-mean-token-mean"}), args.repeats)
    results.update(quatro_step_s=t_q, grpo_step_s=t_g, ratio=t_q / t_g)
    print(f"advantage + loss (fwd+bwd) on 64 groups x 8 x 512 tokens: QUATRO {t_q * 1000:.1f} ms, "
          f"GRPO {t_g * 1000:.1f} ms, ratio QUATRO/GRPO = {t_q / t_g:.2f}")
    return results


if __name__ == "__main__":
    main()
