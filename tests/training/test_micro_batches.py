"""Micro-batches with exact gradient accumulation, and the packed layouts.

Second method for every check: the same minibatch through the policy in one padded pass (``train.micro_batch_tokens``
= null, today's path), whose gradient is the definition. The model is the tiny random Llama in float64, so the
comparison is at 1e-6 relative (float32 rounding would hide a wrong normaliser of 1e-4; Llama's RMSNorm computes in
float32 even so, and the TIS weights are float32: hence 1e-6 on the metrics).
"""
import pytest
import torch

import tests.plugins.toy_loss  # noqa: F401  (a plug-in loss that couples rows: the two-pass route)
from core.packing import plan
from core.scoring import Scorer, Sequences, choose_layout, compute_logprobs, self_test
from training.algorithms import BoundLoss, get_advantage_fn, need_param, registered_policy_losses
from training.algorithms.aggregation import LOSS_AGG_MODES
from training.batch import RolloutBatch
from training.update import Updater, UpdateSettings, minibatch_step


class Capture:
    """An optimiser that keeps the gradient it was asked to step with (and changes nothing)."""

    def __init__(self, model):
        self.params = [p for p in model.parameters()]
        self.grads = None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in self.params]


@pytest.fixture(scope="module")
def model64():
    """A small Llama in float64 with grouped-query attention (2 query heads, 1 key/value head), an untied output
    head and a 1,000-token vocabulary (the suite's tiny model has SmolLM2's 49k, which makes float64 slow)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).double().train()


def _batch(model, prompts=4, group=4, seed=0):
    """``prompts`` prompts of different lengths (left-padded), ``group`` responses each of different lengths (one
    stops at its first token), old log-probs near the policy's, reference and sampler log-probs for KL and TIS."""
    g = torch.Generator().manual_seed(seed)
    B = prompts * group
    p_lens = [3 + (5 * i) % 7 for i in range(prompts)]
    P, L = max(p_lens), 11
    prompt_ids = torch.zeros((B, P), dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    response_ids = torch.randint(10, 900, (B, L), generator=g)
    response_mask = torch.zeros((B, L), dtype=torch.long)
    for k in range(prompts):
        ids = torch.randint(10, 900, (p_lens[k],), generator=g)
        for j in range(group):
            i = k * group + j
            prompt_ids[i, P - p_lens[k]:] = ids
            prompt_mask[i, P - p_lens[k]:] = 1
            response_mask[i, :1 + (3 * i + j * 5) % L] = 1
    with torch.no_grad():
        lp, _ = compute_logprobs(model, Sequences(prompt_ids, prompt_mask, response_ids, response_mask))
    noise = lambda s: (torch.randn(B, L, generator=g, dtype=torch.float64) * s)  # noqa: E731
    rewards = torch.randint(0, 2, (B,), generator=g).double()
    rewards[:group] = (torch.arange(group) % 2 == 0).double()  # at least one group with a spread
    batch = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                         response_mask=response_mask, old_logprobs=(lp + noise(0.2)).float().double(),
                         rewards=rewards, group_index=torch.arange(prompts).repeat_interleave(group),
                         response_lengths=response_mask.sum(-1), ref_logprobs=lp + noise(0.3),
                         correct=rewards > 0, entropy=torch.zeros(B, L, dtype=torch.float64),
                         rollout_logprobs=lp + noise(0.1))
    return batch


def _budgets(batch, layout, row_tokens, counts):
    """A budget giving each number of micro-batches in ``counts`` (the smallest such)."""
    found = {}
    longest = int((batch.prompt_mask.sum(-1) + batch.response_mask.sum(-1)).max())
    total = sum(m.tokens for m in plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, None, layout,
                                      row_tokens))
    for b in range(longest, total + 1):
        n = len(plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, b, layout, row_tokens))
        found.setdefault(n, b)
        if all(c in found for c in counts):
            break
    assert all(c in found for c in counts), (layout, sorted(found))
    return [found[c] for c in counts]


def _grads(model, batch, loss_name, params, scorer, settings, advantages):
    opt = Capture(model)
    up = Updater(model, opt, BoundLoss.named(loss_name, params), settings, scorer)
    m = minibatch_step(up, batch, torch.arange(batch.batch_size), advantages, first=False)
    return torch.cat([g.flatten() for g in opt.grads]), m


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


CASES = [(name, {}) for name in registered_policy_losses()] + \
        [("grpo", {"loss_agg_mode": mode}) for mode in LOSS_AGG_MODES]


@pytest.mark.parametrize("loss_name,extra", CASES, ids=[f"{n}-{e.get('loss_agg_mode', 'default')}" for n, e in CASES])
def test_accumulated_gradient_equals_the_one_pass_gradient(model64, loss_name, extra):
    """Every registered policy loss (a new one is covered without editing this test), with the k3 KL term, an entropy
    bonus and token-level TIS weights on, uneven response lengths: budgets giving 1, 2, 3 and 7 micro-batches, in the
    padded, packed and tree layouts, give the one-pass gradient to 1e-6 relative, and the same minibatch metrics."""
    model = model64
    batch = _batch(model)
    params = dict(extra)
    kl_param = need_param("policy_loss", loss_name, "ref_logprobs")
    if kl_param:
        params[kl_param] = 0.02
    adv = get_advantage_fn("grpo")(batch)[0].double()
    settings = UpdateSettings(beta=0.05, entropy_coef=0.01, correction="token_tis", correction_cap=1.5,
                              max_grad_norm=1e12, norm_constant=11.0,
                              couples_rows=bool(__import__("training.algorithms", fromlist=["couples_rows"])
                                                .couples_rows(loss_name)))
    ref, ref_m = _grads(model, batch, loss_name, params, Scorer(None, "padded"), settings, adv)
    assert ref.norm() > 0
    for layout in ("padded", "packed", "tree"):
        row_tokens = 24
        for k, budget in zip((1, 2, 3, 7), _budgets(batch, layout, row_tokens, (1, 2, 3, 7))):
            scorer = Scorer(budget, layout, row_tokens=row_tokens, head_tokens=32)
            got, m = _grads(model, batch, loss_name, params, scorer, settings, adv)
            assert m["micro_batches"] == k
            assert _rel(got, ref) < 1e-6, (layout, k, _rel(got, ref))
            for key in ("policy_loss", "loss", "kl_ref", "entropy_bonus", "grad_norm", "tis_weight_mean"):
                if key in ref_m:
                    assert m[key] == pytest.approx(ref_m[key], rel=1e-6, abs=1e-9), (layout, k, key)
            for key in ref_m:  # the loss function's own metrics: the whole minibatch's
                if key.startswith(("clip", "ratio", "seq_ratio", "ppo_kl", "weight", "reversed")):
                    assert m[key] == pytest.approx(ref_m[key], rel=1e-6, abs=1e-9), (layout, k, key)


def test_micro_batches_hold_at_most_the_budget_longest_first(model64):
    """The budget is a hard cap on the positions a pass computes (padding included), every row is in exactly one
    micro-batch, and the first micro-batch is the largest; a sequence longer than the budget is refused naming it."""
    batch = _batch(model64, prompts=5, group=6, seed=3)
    B = batch.batch_size
    for layout in ("padded", "packed", "tree"):
        for budget in (22, 40, 64, 200):
            mbs = plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, budget, layout, 32)
            rows = torch.cat([m.rows for m in mbs]).sort().values
            assert torch.equal(rows, torch.arange(B))
            assert all(m.tokens <= budget for m in mbs), [m.tokens for m in mbs]
            assert mbs[0].tokens == max(m.tokens for m in mbs)
            real = int(batch.response_mask.sum())
            assert sum(m.real for m in mbs) >= real
    with pytest.raises(ValueError, match=r"train.micro_batch_tokens=10: a sequence of \d+ tokens"):
        plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, 10, "tree")


def test_tree_rows_compute_fewer_positions_than_padded_ones(model64):
    """A group's prompt once and its responses without padding: fewer positions than one padded row per response
    (the shared-prompt pass pads every response to the longest), none wasted but the row tails."""
    batch = _batch(model64, prompts=4, group=8, seed=5)
    p = batch.prompt_mask.sum(-1)
    r = batch.response_mask.sum(-1)
    tree = plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, None, "tree", 512)
    padded = plan(batch.prompt_ids, batch.prompt_mask, batch.response_mask, None, "padded")
    per_group = sum(int(p[k * 8]) + int(r[k * 8:(k + 1) * 8].sum()) for k in range(4))
    segments = [seg for m in tree for row in m.packed_rows for seg in row]
    repeats = len(segments) - 4  # a group cut between rows repeats its prompt (core.packing.poured_rows)
    assert sum(m.real for m in tree) == per_group + sum(int(p[s.prompt_row]) for s in segments) - int(p[::8].sum()) \
        and repeats >= 0
    assert all(s.length == int(p[s.prompt_row]) + int(r[list(s.responses)].sum()) for s in segments)
    assert sum(m.tokens for m in tree) < sum(m.tokens for m in padded)


def test_poured_rows_cut_a_group_to_even_the_rows_by_hand():
    """Two prompts of 10 tokens, one with three responses of 40, one with one (180 positions). With attention as dear
    as the rest of a token's work at 100 positions a row, a plan costs R W (1 + W / 100). Whole groups
    (core.packing.balanced_rows) give one row of 180 (cost 504) or rows of 130 and 50 (598). Cutting the first group
    (core.packing.poured_rows, its prompt repeated): two rows of 90 and 100 (400), or four of 50, each response
    behind its prompt (200 positions, none of them padding: 300), which the plan takes."""
    from core.packing import poured_rows

    p, r, keys = [10, 10, 10, 10], [40, 40, 40, 40], [1, 1, 1, 2]
    rows, fill = poured_rows(range(4), p, r, keys, cap=1000, attention_width=100)
    assert fill == [50, 50, 50, 50]
    assert sorted((s.responses, s.length) for row in rows for s in row) == [((i,), 50) for i in range(4)]
    rows2, fill2 = poured_rows(range(4), p, r, keys, cap=100, attention_width=float("inf"))  # positions only:
    assert fill2 == [90, 100]  # the fewest rows of at most 100 that hold it: two, the first group cut after two
    assert [[(s.responses, s.length) for s in row] for row in rows2] == [[((0, 1), 90)], [((2,), 50), ((3,), 50)]]
    prompt_ids = torch.tensor([[5, 5], [5, 5], [5, 5], [6, 6]]).repeat_interleave(5, 1)
    mbs = plan(prompt_ids, torch.ones(4, 10, dtype=torch.long), torch.ones(4, 40, dtype=torch.long), None, "tree",
               1000, 100)
    assert [(m.tokens, m.real, len(m.packed_rows)) for m in mbs] == [(200, 200, 4)]


def test_packed_log_probs_equal_one_sequence_at_a_time(model64):
    """Second method: each sequence scored alone. Log-probs and entropies of the packed and tree layouts (and the
    padded one, micro-batched) agree with it to 1e-9 in float64."""
    batch = _batch(model64, prompts=3, group=3, seed=7)
    t = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    with torch.no_grad():
        alone = [compute_logprobs(model64, Sequences(*(x[i:i + 1] for x in t)), with_entropy=True, share_prompts=False)
                 for i in range(batch.batch_size)]
        for layout, budget in (("packed", 40), ("tree", 40), ("tree", None), ("padded", 30)):
            lp, ent = Scorer(budget, layout, row_tokens=40).score(model64, *t, temperature=1.0, with_entropy=True)
            for i, (a_lp, a_ent) in enumerate(alone):
                m = batch.response_mask[i].bool()
                assert torch.allclose(lp[i][m], a_lp[0][m], atol=1e-9), (layout, i)
                assert torch.allclose(ent[i][m], a_ent[0][m], atol=1e-9), (layout, i)


def test_self_test_catches_attention_across_packed_sequences(tiny_policy, monkeypatch):
    """The silent failure: a mask that lets a packed sequence attend to the one before it. The self-test passes on
    the real layouts and fails (and ``choose_layout`` falls back to padded rows, saying why) when the tree mask is
    replaced by an all-visible causal one."""
    import core.packing as packing

    model = tiny_policy[0]
    for layout in ("packed", "tree"):
        ok, diff = self_test(model, layout)
        assert ok and diff < 1e-4, (layout, diff)
    real = packing.packed_inputs

    def leaky(*a, **k):
        x = real(*a, **k)
        if x.attention_mask is not None:
            W = x.input_ids.shape[1]
            causal = torch.ones(W, W, dtype=torch.bool).tril()
            x.attention_mask = torch.zeros_like(x.attention_mask).masked_fill(~causal, torch.finfo(x.attention_mask.dtype).min)
        else:
            x.position_ids = torch.arange(x.input_ids.shape[1]).expand_as(x.input_ids)  # one long sequence
        return x
    monkeypatch.setattr(packing, "packed_inputs", leaky)
    for layout in ("packed", "tree"):
        ok, diff = self_test(model, layout)
        assert not ok and diff > 1e-3, (layout, diff)
    layout, why = choose_layout(model, "auto")
    assert layout == "padded" and "not tree: its self-test differed" in why and "not packed" in why
