"""The registry of rollout corrections (training/corrections.py): each correction's weights and kept tokens by hand
on a 2x3 example, against verl's own functions on random tensors, and through one optimiser step of the trainer.

verl's source: verl 0.9.1, ``verl/trainer/ppo/rollout_corr_helper.py``: ``compute_rollout_correction_weights``,
``compute_rollout_rejection_mask`` and ``compute_rollout_correction_and_rejection_mask``, called with the settings
that define the same quantity (their mapping and every difference: the corrections' docstrings).
"""
import copy
import math

import pytest
import torch

from training.corrections import CORRECTIONS, Correction, check_correction, correct, register_correction

BUILT_IN = ("none", "token_tis", "sequence_tis", "token_mis", "sequence_mis", "icepop", "geo_rs")

# two responses of 3 token slots; the second ends after 2 tokens; log r = p - b on the 5 tokens: 0.5, -1, 0 | 0, 1.5
P = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -2.5, 0.0]])
B = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -4.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
e = math.exp
# by hand, C = 2, lower = 1/C = 0.5: token ratios e^0.5 = 1.65, e^-1 = 0.37, 1 | 1, e^1.5 = 4.48;
# sequence ratios e^-0.5 = 0.61 | e^1.5 = 4.48; geometric means e^(-0.5/3) = 0.85 | e^(1.5/2) = 2.12
HAND = {  # name: (weights with 1 on padding, keep, metrics)
    "none": ([[1, 1, 1], [1, 1, 1]], [[1, 1, 1], [1, 1, 0]], {}),
    "token_tis": ([[e(0.5), e(-1), 1], [1, 2, 1]], [[1, 1, 1], [1, 1, 0]],
                  {"tis_capped_share": 1 / 5, "tis_weight_mean": (e(0.5) + e(-1) + 1 + 1 + 2) / 5,
                   "correction_masked_share": 0.0}),
    "sequence_tis": ([[e(-0.5)] * 3, [2, 2, 1]], [[1, 1, 1], [1, 1, 0]],
                     {"tis_capped_share": 2 / 5, "tis_weight_mean": (3 * e(-0.5) + 4) / 5}),
    "token_mis": ([[e(0.5), e(-1), 1], [1, 0, 1]], [[1, 1, 1], [1, 0, 0]],
                  {"correction_masked_share": 1 / 5, "correction_weight_mean": (e(0.5) + e(-1) + 2) / 4}),
    "sequence_mis": ([[e(-0.5)] * 3, [0, 0, 1]], [[1, 1, 1], [0, 0, 0]],
                     {"correction_masked_share": 2 / 5, "correction_rejected_share": 1 / 2,
                      "correction_weight_mean": e(-0.5)}),
    "icepop": ([[e(0.5), 0, 1], [1, 0, 1]], [[1, 0, 1], [1, 0, 0]],
               {"correction_masked_share": 2 / 5, "correction_weight_mean": (e(0.5) + 2) / 3}),
    "geo_rs": ([[1, 1, 1], [0, 0, 1]], [[1, 1, 1], [0, 0, 0]],
               {"correction_masked_share": 2 / 5, "correction_rejected_share": 1 / 2, "correction_weight_mean": 1.0}),
}


def test_the_built_ins_are_registered():
    assert set(BUILT_IN) <= set(CORRECTIONS.keys())
    assert set(HAND) == set(BUILT_IN)


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_correction_by_hand(name):
    weights, keep, metrics = HAND[name]
    c = correct(name, P, B, MASK, cap=2.0)
    assert isinstance(c, Correction) and not c.weights.requires_grad
    assert torch.allclose(c.weights, torch.tensor(weights, dtype=c.weights.dtype), atol=1e-6), c.weights
    assert torch.equal(c.keep, torch.tensor(keep, dtype=c.keep.dtype)), c.keep
    for key, value in metrics.items():
        assert c.metrics[key] == pytest.approx(value, abs=1e-6), key


def test_a_lower_bound_narrows_icepop_and_geo_rs_only():
    """lower = 0.3 lets e^-1 = 0.37 into IcePop's band; lower = 0.9 rejects the first response's geometric mean 0.85;
    MIS is one-sided and reads no lower bound."""
    assert torch.equal(correct("icepop", P, B, MASK, 2.0, 0.3).keep, torch.tensor([[1.0, 1, 1], [1, 0, 0]]))
    assert float(correct("geo_rs", P, B, MASK, 2.0, 0.9).keep.sum()) == 0
    assert torch.equal(correct("token_mis", P, B, MASK, 2.0, 0.9).keep, correct("token_mis", P, B, MASK, 2.0).keep)


def test_thresholds_and_names_are_checked():
    assert check_correction("icepop", 2.0, None) == (2.0, 0.5)
    with pytest.raises(ValueError, match=r"train.rollout.correction='tis': unknown; registered: \['none', "):
        correct("tis", P, B, MASK)
    with pytest.raises(ValueError, match="correction_cap=0.5"):
        correct("token_tis", P, B, MASK, cap=0.5)
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(ValueError, match=f"correction_lower={bad}"):
            correct("icepop", P, B, MASK, cap=2.0, lower=bad)


def test_the_mismatch_module_still_gives_the_tis_weights():
    from training.mismatch import tis_weights

    for name in ("token_tis", "sequence_tis"):
        assert torch.equal(tis_weights(P, B, MASK, name, 2.0), correct(name, P, B, MASK, 2.0).weights)
    assert tis_weights(P, B, MASK, "none") is None


# --- conformance with verl ----------------------------------------------------------------------------------------

def _random(seed=0, rows=6, width=9):
    """Seeded log-probs with a ragged mask (one response of a single token, one full) and log-ratios of a few tenths."""
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 7, 5, 3, 1, 8][:rows]
    mask = torch.zeros(rows, width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    b = -torch.rand(rows, width, generator=g) * 3
    p = b + torch.randn(rows, width, generator=g) * 0.4
    return p, b, mask


#: (name, C, lower) and verl's call for the same quantity: -> (verl's weight of each token in the loss, verl's mask)
def _verl(name, p, b, mask, cap, lower):
    from verl.trainer.ppo import rollout_corr_helper as h

    lr = p - b
    if name in ("token_tis", "sequence_tis"):
        w, _ = h.compute_rollout_correction_weights(lr, mask, rollout_is=name.split("_")[0], rollout_is_threshold=cap)
        return w, mask
    if name == "icepop":  # zero weights outside [lower, C], the response mask unchanged
        w, _ = h.compute_rollout_correction_weights(lr, mask, rollout_is="token",
                                                    rollout_is_threshold=f"{lower!r}_{cap!r}")
        return w, mask * (w > 0)
    if name == "geo_rs":  # -log r's mean in [1/C, 1/lower]: the geometric-mean ratio in [lower, C]; no IS weight
        kept, _ = h.compute_rollout_rejection_mask(lr, mask, rollout_rs="seq_mean_k1",
                                                   rollout_rs_threshold=f"{1 / cap!r}_{1 / lower!r}")
        return kept, kept
    if name in ("token_mis", "sequence_mis", "none"):  # IS weights plus a one-sided k1 rejection (r <= C)
        level, rs = {"token_mis": ("token", "token_k1"), "sequence_mis": ("sequence", "seq_sum_k1"),
                     "none": (None, None)}[name]
        proto, kept, _ = h.compute_rollout_correction_and_rejection_mask(
            p, b, mask, rollout_is=level, rollout_is_threshold=cap, rollout_rs=rs,
            rollout_rs_threshold=None if rs is None else f"{1 / cap!r}_inf")
        w = mask if proto is None else proto.batch["rollout_is_weights"]
        return w * kept, kept
    raise AssertionError(name)


CONFORMANCE = [("none", 2.0, None), ("token_tis", 1.5, None), ("sequence_tis", 2.0, None), ("token_mis", 1.5, None),
               ("sequence_mis", 2.0, None), ("icepop", 1.5, 0.8), ("icepop", 2.0, None), ("geo_rs", 1.2, 0.9),
               ("geo_rs", 1.3, None)]


@pytest.mark.parametrize("name,cap,lower", CONFORMANCE)
def test_agrees_with_verl(name, cap, lower):
    """Every built-in against verl 0.9.1's rollout_corr_helper on the same random tensors: the weight each response
    token carries in the loss (``weights * keep``; verl's IS weight times its rejection mask) and the kept tokens
    (verl's response mask after the rejection), to 1e-6; the thresholds are crossed on both sides."""
    pytest.importorskip("verl")
    weighted = rejected = 0
    for seed in range(4):
        p, b, mask = _random(seed)
        c = correct(name, p, b, mask, cap=cap, lower=lower)
        want_w, want_keep = _verl(name, p, b, mask, cap, 1.0 / cap if lower is None else lower)
        assert torch.allclose(c.weights * c.keep, want_w.to(c.weights.dtype) * mask, atol=1e-6), (seed, c.weights)
        assert torch.equal(c.keep, want_keep.to(c.keep.dtype)), (seed, c.keep, want_keep)
        assert float(c.keep.sum()) > 0
        weighted += not torch.equal(c.weights * c.keep, mask)
        rejected += float(c.keep.sum()) < float(mask.sum())
    # not a trivial agreement: on some seeds tokens are weighted, and the masking corrections reject some
    assert weighted > 0 or name == "none"
    assert rejected > 0 or name in ("none", "token_tis", "sequence_tis")


# --- through the trainer ------------------------------------------------------------------------------------------

class Capture:
    """An optimiser that keeps the gradient it was asked to step with (and changes nothing)."""

    def __init__(self, model):
        self.params = list(model.parameters())
        self.grads = None

    def zero_grad(self, set_to_none=True):
        for q in self.params:
            q.grad = None

    def step(self):
        self.grads = [q.grad.detach().clone() if q.grad is not None else torch.zeros_like(q) for q in self.params]


@pytest.fixture(scope="module")
def tiny():
    """A two-layer Llama with a 300-token vocabulary and a batch of 2 prompts x 3 responses of uneven lengths, its
    old log-probs the policy's own and the sampler's 0.4-nat noisy copies (some ratios leave every threshold)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from core.scoring import Sequences, compute_logprobs
    from training.batch import RolloutBatch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1,
                                         max_position_embeddings=64)).train()
    g = torch.Generator().manual_seed(1)
    rows, L = 6, 7
    prompt_ids = torch.randint(10, 290, (rows, 4), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    response_ids = torch.randint(10, 290, (rows, L), generator=g)
    response_mask = torch.zeros((rows, L), dtype=torch.long)
    for i, n in enumerate((7, 5, 3, 6, 2, 4)):
        response_mask[i, :n] = 1
    with torch.no_grad():
        lp, _ = compute_logprobs(model, Sequences(prompt_ids, prompt_mask, response_ids, response_mask))
    batch = RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                         response_mask=response_mask, old_logprobs=lp.clone(),
                         rewards=torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]),
                         group_index=torch.tensor([0, 0, 0, 1, 1, 1]), response_lengths=response_mask.sum(-1),
                         ref_logprobs=lp - 0.05, correct=torch.tensor([True, False, True, False, False, True]),
                         entropy=torch.zeros(rows, L), rollout_logprobs=lp + torch.randn(rows, L, generator=g) * 0.4)
    return model, batch


def _step(model, batch, name, optimizer_fn, cap=1.5, lower=None, beta=0.05, max_grad_norm=1.0, budget=None):
    from core.scoring import Scorer
    from training.algorithms import BoundLoss, get_advantage_fn
    from training.update import Updater, UpdateSettings, minibatch_step

    adv = get_advantage_fn("grpo")(batch)[0]
    settings = UpdateSettings(beta=beta, correction=name, correction_cap=cap, correction_lower=lower,
                              max_grad_norm=max_grad_norm)
    loss = BoundLoss.named("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "loss_agg_mode": "token-mean"})
    opt = optimizer_fn(model)
    up = Updater(model, opt, loss, settings, Scorer(budget, "padded"))
    return opt, minibatch_step(up, batch, torch.arange(batch.batch_size), adv, first=False)


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_correction_trains_one_step(tiny, name):
    """One AdamW step of GRPO (with the k3 KL term) under each correction: the weights move, the loss is finite and
    the correction's metrics are logged."""
    model, batch = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    before = [q.detach().clone() for q in model.parameters()]
    _, m = _step(model, batch, name, lambda mod: torch.optim.AdamW(mod.parameters(), lr=1e-3))
    assert math.isfinite(m["loss"]) and m["nonfinite_skips"] == 0
    assert any(not torch.equal(a, q.detach()) for a, q in zip(before, model.parameters()))
    if name != "none":
        assert "correction_masked_share" in m and "correction_weight_mean" in m
    if name in ("token_mis", "icepop"):
        assert 0 < m["correction_masked_share"] < 1


@pytest.mark.parametrize("name", ["token_mis", "sequence_mis", "icepop", "geo_rs"])
def test_all_tokens_rejected_gives_a_zero_gradient_not_nan(tiny, name):
    """Every ratio e^3 = 20 > C: each masking correction rejects every token, so the policy loss and the KL term
    weigh nothing: a finite loss of 0 and a zero gradient."""
    model, batch = tiny[0], copy.deepcopy(tiny[1])
    batch.rollout_logprobs = batch.old_logprobs - 3.0
    opt, m = _step(model, batch, name, Capture)
    assert m["correction_masked_share"] == 1.0 and m["loss"] == 0.0
    assert all(torch.isfinite(gr).all() and not gr.any() for gr in opt.grads)


@pytest.mark.parametrize("name", ["sequence_tis", "token_mis", "sequence_mis", "icepop", "geo_rs"])
def test_micro_batches_give_the_one_pass_gradient(tiny, name):
    """The correction is a function of each response's own tokens and the denominators are the minibatch's, so the
    micro-batches' accumulated gradient is the one-pass gradient, and the metrics are the whole minibatch's."""
    model, batch = tiny
    one, m1 = _step(model, batch, name, Capture, max_grad_norm=1e12)
    split, m2 = _step(model, batch, name, Capture, max_grad_norm=1e12, budget=24)
    assert m1["micro_batches"] == 1 and m2["micro_batches"] > 1
    a, b = (torch.cat([gr.flatten() for gr in o.grads]) for o in (one, split))
    assert float((a - b).norm() / a.norm()) < 1e-5
    for key in m1:
        if key.startswith(("correction_", "tis_")):
            assert m2[key] == pytest.approx(m1[key], rel=1e-6), key


def test_a_rejected_token_adds_nothing_to_the_loss(tiny):
    """token_mis's gradient equals the gradient with its rejected tokens' terms zeroed by hand (token_weights with
    weights * keep for the policy loss, keep for the KL term): nothing else changes."""
    from core.scoring import Sequences, compute_logprobs
    from training.algorithms import BoundLoss, get_advantage_fn
    from training.update import policy_objective

    model, batch = tiny
    opt, m = _step(model, batch, "token_mis", Capture, max_grad_norm=1e12)  # the gradient before any clipping
    c = correct("token_mis", batch.old_logprobs, batch.rollout_logprobs, batch.response_mask, 1.5)
    assert 0 < m["correction_masked_share"] < 1
    model.zero_grad(set_to_none=True)
    lp, _ = compute_logprobs(model, Sequences.of(batch))
    adv = get_advantage_fn("grpo")(batch)[0]
    loss = BoundLoss.named("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "loss_agg_mode": "token-mean"})
    total, _, _ = policy_objective(lp, None, batch, adv, loss, beta=0.05, correction=c)
    total.backward()
    by_hand = torch.cat([q.grad.flatten() for q in model.parameters()])
    got = torch.cat([gr.flatten() for gr in opt.grads])
    assert torch.allclose(got, by_hand, rtol=1e-5, atol=1e-7)
    model.zero_grad(set_to_none=True)


def test_a_plugin_correction_is_registered_and_accepted_by_the_schema():
    """A plug-in registers a correction by name; the schema's choices are the registry's names, so the config takes
    it, and refuses an unknown name with one line naming the key."""
    from omegaconf import OmegaConf

    from orchestrator import ConfigError
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.checks.schema import check_schema, collect_specs

    @register_correction("toy_half")
    def toy_half(p, b, mask, cap, lower):
        m = mask.float()
        return Correction(torch.where(m > 0, 0.5, 1.0), m, {"correction_weight_mean": 0.5})

    assert torch.equal(correct("toy_half", P, B, MASK).weights, torch.tensor([[0.5] * 3, [0.5, 0.5, 1.0]]))
    overrides = ["train.rollout.correction=toy_half", "train.rollout.correction_lower=0.5"]
    cfg = sweep_points(overrides, multirun=False)[0][1]
    assert "toy_half" in collect_specs(cfg)["train.rollout.correction"].choices
    check_schema(cfg)
    OmegaConf.update(cfg, "train.rollout.correction", "nosuch", merge=False)
    with pytest.raises(ConfigError, match=r"^train.rollout.correction='nosuch': expected one of \['none', "):
        check_schema(cfg)
