"""Properties of every algorithm, checked against hand computations."""
import math

import pytest
import torch

from training.algorithms import get_advantage_fn, get_policy_loss_fn, registered_advantages, validate_params
from training.algorithms.exppo import ExppoParts, exppo_advantages
from training.algorithms.tr_grpo import TokenWeighting, token_weights, weight_range
from training.batch import RolloutBatch, concat_batches
from training.rewards import overlong_penalty


def _batch(old, mask, rewards=None, group_index=None, correct=None):
    B = old.shape[0]
    return RolloutBatch(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                        response_ids=torch.zeros(old.shape, dtype=torch.long), response_mask=mask, old_logprobs=old,
                        rewards=torch.zeros(B) if rewards is None else rewards,
                        group_index=torch.zeros(B, dtype=torch.long) if group_index is None else group_index,
                        response_lengths=mask.sum(-1).long(), correct=correct)


# ---------- zero-variance groups give zero advantage, for every estimator

@pytest.mark.parametrize("name", ["grpo", "gpg", "quatro", "exppo", "grpo_ur", "f_grpo"])
def test_zero_variance_groups_get_zero_advantage(name):
    torch.manual_seed(0)
    old = -torch.rand(8, 5)
    b = _batch(old, torch.ones(8, 5), rewards=torch.tensor([1.0] * 4 + [0.0] * 4),
               group_index=torch.tensor([0] * 4 + [1] * 4))
    b.correct = b.rewards > 0
    params = {"delta": 0.1} if name == "quatro" else {}
    adv, _ = get_advantage_fn(name)(b, **params)
    assert torch.equal(adv[4:], torch.zeros(4))  # the all-wrong group
    if name == "grpo_ur":
        # GRPO-UR shapes rewards *before* normalising: an all-correct group's rewards become
        # 1 - beta rank / G, which differ, so the least likely correct response gets A > 0 by design
        seq_lp = old.mean(-1)[:4]
        assert int(adv[:4].argmax()) == int(seq_lp.argmin())
    else:
        assert torch.equal(adv[:4], torch.zeros(4))  # the all-correct group


def test_every_registered_estimator_is_covered():
    from training.algorithms.registry import get_advantage_fn

    # the suite's own (a plug-in a test of this worker imported, tests/plugins/, is not the suite's)
    own = {n for n in registered_advantages() if not get_advantage_fn(n).__module__.startswith("tests.")}
    assert own == {"grpo", "gpg", "quatro", "exppo", "grpo_ur", "f_grpo"}


# ---------- CISPO / GMPO / GPG

def test_cispo_keeps_gradient_on_clipped_tokens():
    old = torch.log(torch.tensor([[0.2, 0.2]]))
    new = torch.log(torch.tensor([[0.4, 0.2]])).requires_grad_(True)  # ratio 2.0 (clipped at 1.2), 1.0
    loss, m = get_policy_loss_fn("cispo")(new, _batch(old, torch.ones(1, 2)), torch.tensor([1.5]),
                                          clip_ratio_low=None, clip_ratio_high=0.2)
    loss.backward()
    # d loss / d logp_t = -sg[clip(r_t)] A / 2 tokens
    assert torch.allclose(new.grad, torch.tensor([[-1.2 * 1.5 / 2, -1.0 * 1.5 / 2]]))
    assert m["clip_fraction"] == 0.5
    # PPO's clipped surrogate gives that token no gradient at all
    new2 = new.detach().clone().requires_grad_(True)
    get_policy_loss_fn("grpo")(new2, _batch(old, torch.ones(1, 2)), torch.tensor([1.5]), loss_agg_mode="token-mean")[0].backward()
    assert new2.grad[0, 0] == 0.0


def test_gmpo_ratio_is_the_geometric_mean_of_token_ratios():
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    token_ratios = torch.tensor([1.2, 0.9, 1.1])  # all inside exp(+-0.4)
    new = (old + token_ratios.log()).requires_grad_(True)
    loss, m = get_policy_loss_fn("gmpo")(new, _batch(old, torch.ones(1, 3)), torch.tensor([2.0]))
    geo = float(token_ratios.prod() ** (1 / 3))
    assert m["seq_ratio_mean"] == pytest.approx(geo, rel=1e-6)
    assert float(loss) == pytest.approx(-2.0 * geo, rel=1e-6)
    loss.backward()
    assert torch.allclose(new.grad, torch.full((1, 3), -2.0 * geo / 3), atol=1e-6)
    # a token ratio of exp(0.6) is clipped to exp(0.4) for A > 0 (no gradient) but not for A < 0
    new = (old + torch.tensor([[0.6, 0.0, 0.0]])).requires_grad_(True)
    loss, m = get_policy_loss_fn("gmpo")(new, _batch(old, torch.ones(1, 3)), torch.tensor([1.0]))
    assert float(loss) == pytest.approx(-math.exp(0.4 / 3), rel=1e-6) and m["clip_fraction"] == pytest.approx(1 / 3)
    loss.backward()
    assert new.grad[0, 0] == 0.0 and new.grad[0, 1] != 0.0


def test_gpg_loss_is_minus_advantage_times_logprob():
    old = torch.zeros(2, 2)
    new = torch.tensor([[-1.0, -2.0], [-0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = get_policy_loss_fn("gpg")(new, _batch(old, mask), torch.tensor([0.5, -1.0]))
    assert float(loss) == pytest.approx((0.5 * 1 + 0.5 * 2 - 1.0 * 0.5) / 3)
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.5 / 3, -0.5 / 3], [1.0 / 3, 0.0]]))


def test_gpg_advantage_rescales_by_batch_over_nonzero():
    b = _batch(torch.zeros(8, 1), torch.ones(8, 1), rewards=torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 1]),
               group_index=torch.tensor([0] * 4 + [1] * 4))
    adv, m = get_advantage_fn("gpg")(b)
    assert m["gpg_alpha"] == 2.0  # 8 responses, 4 with non-zero advantage
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0]))


# ---------- GRPO-UR / F-GRPO

def test_grpo_ur_scales_only_correct_responses_by_unlikeliness_rank():
    # one group of 4: length-normalised old log-probs -3 (least likely), -1, -2, -0.5
    old = torch.tensor([[-3.0], [-1.0], [-2.0], [-0.5]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    b = _batch(old, torch.ones(4, 1), rewards=rewards)
    adv, _ = get_advantage_fn("grpo_ur")(b, beta=0.25)
    # ranks 0, 2, 1, 3 -> shaped rewards 1, 1 - 0.25*2/4 = 0.875, 0, 0
    shaped = torch.tensor([1.0, 0.875, 0.0, 0.0])
    expect = (shaped - shaped.mean()) / (shaped.std() + 1e-6)
    assert torch.allclose(adv, expect, atol=1e-6)
    # the same group with only wrong responses rescaled: nothing changes (zero stays zero)
    b.rewards = torch.tensor([0.0, 0.0, 1.0, 1.0])
    ranks_wrong_first, _ = get_advantage_fn("grpo_ur")(b, beta=0.25)
    shaped = torch.tensor([0.0, 0.0, 1 - 0.25 * 1 / 4, 1 - 0.25 * 3 / 4])
    assert torch.allclose(ranks_wrong_first, (shaped - shaped.mean()) / (shaped.std() + 1e-6), atol=1e-6)


def test_f_grpo_scales_by_one_minus_pass_rate_power_gamma():
    b = _batch(torch.zeros(4, 1), torch.ones(4, 1), rewards=torch.tensor([1.0, 1, 1, 0]))
    grpo, _ = get_advantage_fn("grpo")(b)
    adv, m = get_advantage_fn("f_grpo")(b, gamma=2.0)
    assert torch.allclose(adv, grpo * 0.25 ** 2)
    assert m["pass_rate_mean"] == 0.75


# ---------- ExPPO

def test_exppo_keeps_signs_and_group_mass_and_orders_the_four_classes():
    torch.manual_seed(0)
    rewards = (torch.rand(50, 8) < 0.5).double()
    surprisal = torch.rand(50, 8) * 2
    base = (rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-6)
    a_hat, audit = exppo_advantages(rewards, surprisal, lam=0.2)
    assert torch.equal(torch.sign(a_hat), torch.sign(base))
    assert torch.allclose(a_hat.abs().sum(-1), base.abs().sum(-1), atol=1e-9)
    assert set(audit) >= {"audit_correct_rare", "audit_correct_common", "audit_wrong_rare", "audit_wrong_common"}
    total = sum(audit[k] for k in audit if k.startswith("audit_"))
    assert total == pytest.approx(float((a_hat - base).sum()), abs=1e-9)


def test_exppo_by_hand_on_one_group():
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    surprisal = torch.tensor([[2.0, 1.0, 2.0, 1.0]])  # u = +0.5, -0.5, +0.5, -0.5; rho = 0.5
    a = (rewards - 0.5) / (rewards.std() + 1e-6)
    t = math.tanh(0.5)
    m = torch.tensor([[1 + 0.2 * 0.5 * t, 1 - 0.2 * 0.5 * t, 1 - 0.2 * 0.5 * t, 1 + 0.2 * 0.5 * t]])
    expect = m * a * a.abs().sum() / (m * a).abs().sum()
    got, audit = exppo_advantages(rewards, surprisal, lam=0.2)
    assert torch.allclose(got, expect.double(), atol=1e-9)
    assert got[0, 0] > got[0, 1] > 0 > got[0, 2] > got[0, 3]  # rare-correct most, common-wrong least
    assert audit["audit_correct_rare"] > 0 > audit["audit_correct_common"]
    with pytest.raises(ValueError, match="lam"):
        exppo_advantages(rewards, surprisal, lam=1.5)


def test_exppo_lambda_one_keeps_every_advantage_sign():
    """Table 9 ablates lambda up to 1.00: the multiplier 1 + g tanh(u) sign(A) stays positive (g < 1 when A != 0)."""
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(64, 8, generator=g) < 0.5).double()
    surprisal = torch.randn(64, 8, generator=g, dtype=torch.float64) * 30   # tanh saturates
    a = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    got, _ = exppo_advantages(rewards, surprisal, lam=1.0)
    nz = a.abs() > 1e-9
    assert bool((torch.sign(got[nz]) == torch.sign(a[nz])).all()) and bool((got[~nz] == 0).all())
    assert validate_params("advantage", "exppo", {"lam": 1.0}) == []


# ---------- TR-GRPO

def _sig(x):
    return 1 / (1 + math.exp(-x))


def test_tr_grpo_printed_formula_gives_constant_weight_and_warns():
    p = torch.linspace(0, 1, 101)
    assert torch.equal(token_weights(p, TokenWeighting(weight_reading="literal")), torch.ones(101))
    assert weight_range(weight_reading="literal") == (1.0, 1.0)
    warnings = validate_params("policy_loss", "tr_grpo", {"tau": 9.0, "weight_reading": "literal"})
    assert len(warnings) == 1 and "constant" in warnings[0]
    # the printed placement warns when a weight can exceed 1 + eps_high (here with the default reading)
    warnings = validate_params("policy_loss", "tr_grpo", {"weight_placement": "inside_clip"})
    assert len(warnings) == 1 and "no gradient" in warnings[0]
    assert validate_params("policy_loss", "tr_grpo", {}) == []


def test_tr_grpo_default_weight_takes_many_values_by_hand():
    p = torch.linspace(0, 1, 1001, dtype=torch.float64)
    w = token_weights(p)
    assert len(torch.unique(w)) >= 10 and float(w.min()) == 1.0 and float(w.max()) == pytest.approx(1.4)
    assert bool((w[1:] >= w[:-1]).all())   # monotone in p
    # by hand: w = clip(2 (sigmoid(9 p) - 0.25), 1, 1.4)
    for prob, expect in [(0.05, 1.0), (0.15, 2 * (_sig(1.35) - 0.25)), (0.2, 2 * (_sig(1.8) - 0.25)),
                         (0.25, 2 * (_sig(2.25) - 0.25)), (0.5, 1.4), (0.9, 1.4)]:
        assert float(token_weights(torch.tensor([prob]))[0]) == pytest.approx(expect, rel=1e-6), prob
    assert torch.allclose(token_weights(torch.tensor([0.9]), TokenWeighting(weighting="reverse")), torch.tensor([0.6]))
    assert torch.equal(token_weights(torch.tensor([0.9]), TokenWeighting(weighting="equal")), torch.tensor([1.0]))
    r = token_weights(torch.rand(1000), TokenWeighting(weighting="random"), generator=torch.Generator().manual_seed(0))
    assert 0.5 <= float(r.min()) and float(r.max()) <= 1.5 and float(r.std()) > 0.2


@pytest.mark.parametrize("prob", [0.05, 0.15, 0.2, 0.25, 0.5, 0.9, 0.99])
def test_tr_grpo_gradient_on_fresh_data_is_w_times_grpo(prob):
    """Fresh data (pi_theta = pi_old, r = 1), one token, A = +1, token-mean: GRPO's loss is -r A, so
    d loss / d log pi = -1; TR-GRPO's (outside the clip, Eq. 13) is -w r A, gradient -w(p). The printed
    placement (inside the clip) gives 0 once w > 1.24 (p > 0.21): the clipped branch has no gradient."""
    old = torch.log(torch.tensor([[prob]], dtype=torch.float64))
    b = _batch(old, torch.ones(1, 1))
    grads = {}
    for name, params in [("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.24}), ("tr_grpo", {}),
                         ("inside", {"weight_placement": "inside_clip"})]:
        new = old.clone().requires_grad_(True)
        fn = get_policy_loss_fn("grpo" if name == "grpo" else "tr_grpo")
        loss, _ = fn(new, b, torch.tensor([1.0], dtype=torch.float64), loss_agg_mode="token-mean", **params)
        loss.backward()
        grads[name] = float(new.grad[0, 0])
    w = min(max(2 * (_sig(9 * prob) - 0.25), 1.0), 1.4)
    assert grads["grpo"] == pytest.approx(-1.0)
    assert grads["tr_grpo"] == pytest.approx(-w, rel=1e-9)
    assert grads["inside"] == (pytest.approx(-w, rel=1e-9) if w <= 1.24 else 0.0)


def test_tr_grpo_loss_by_hand_with_weights_and_weighted_kl():
    old = torch.log(torch.tensor([[0.9, 0.05]]))
    new = old.clone().requires_grad_(True)  # r = 1; weights at p = 0.9 -> 1.4, p = 0.05 -> 1.0 (sigmoid(9 p))
    ref = torch.log(torch.tensor([[0.8, 0.1]]))
    b = _batch(old, torch.ones(1, 2))
    b.ref_logprobs = ref
    w = torch.tensor([1.4, 1.0])
    x = w * torch.tensor([0.8 / 0.9, 0.1 / 0.05])
    kl = x - x.log() - 1
    # outside the clip (default): w * max(-r A, -clip(r) A) = -w at r = 1, A = 1
    loss, m = get_policy_loss_fn("tr_grpo")(new, b, torch.tensor([1.0]), kl_beta=0.5, loss_agg_mode="token-mean")
    assert float(loss) == pytest.approx(float((-w).mean() + 0.5 * kl.mean()), rel=1e-5)
    assert m["weight_mean"] == pytest.approx(1.2) and m["weight_std"] == pytest.approx(0.2)
    # inside the clip (Eq. 10 as printed): -min(w r A, clip(w r) A)
    loss, _ = get_policy_loss_fn("tr_grpo")(new, b, torch.tensor([1.0]), kl_beta=0.5, loss_agg_mode="token-mean",
                                            weight_placement="inside_clip")
    pg = torch.maximum(-w, -w.clamp(0.8, 1.24))
    assert float(loss) == pytest.approx(float(pg.mean() + 0.5 * kl.mean()), rel=1e-5)


# ---------- DAPO pieces

def test_dynamic_sampling_filters_on_correctness_not_shaped_reward():
    """Groups: 0 all correct (shaped rewards differ by the overlong penalty: dropped, DAPO eq. 11), 1 mixed
    (kept), 2 all wrong (dropped), 3 one of three correct (kept)."""
    from training.rewards import informative_rows

    correct = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0], dtype=torch.bool)
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert informative_rows(correct, group).tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True] * 3


def test_overlong_buffer_is_a_fraction_of_the_maximum_length_by_default():
    from training.rewards import overlong_buffer_length

    assert overlong_buffer_length({"fraction": 0.2}, 20480) == 4096          # DAPO's own numbers
    assert overlong_buffer_length({}, 48) == 10                              # default 0.2: 9.6 -> 10
    assert overlong_buffer_length({"fraction": 0.2, "length": 16}, 48) == 16  # an explicit length wins
    with pytest.raises(ValueError, match="fraction=0"):
        overlong_buffer_length({"fraction": 0}, 48)


def test_overlong_penalty_by_hand():
    got = overlong_penalty(torch.tensor([10, 40, 44, 48]), max_length=48, buffer=8)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 8, 9)


def test_concat_batches_repads_and_renumbers_groups():
    a = _batch(torch.full((2, 3), -1.0), torch.ones(2, 3), group_index=torch.tensor([5, 5]))
    b = _batch(torch.full((2, 5), -2.0), torch.ones(2, 5), group_index=torch.tensor([5, 5]))
    b.prompt_ids = torch.ones(2, 2, dtype=torch.long)
    b.prompt_mask = torch.ones(2, 2, dtype=torch.long)
    c = concat_batches([a, b])
    assert c.response_ids.shape == (4, 5) and c.prompt_ids.shape == (4, 2)
    assert c.response_mask[:2, 3:].sum() == 0 and c.prompt_mask[:2, 0].sum() == 0  # right / left padding
    assert c.group_index.tolist() == [0, 0, 1, 1]


def test_grpo_ur_leaves_negative_rewards_of_wrong_answers_unshaped():
    # K&K-style rewards: all four responses wrong with reward -1 -> zero-variance group -> zero advantage,
    # whatever their likelihoods (before the fix the likeliest wrong answer got +1.16)
    old = torch.tensor([[-3.0] * 3, [-2.0] * 3, [-1.0] * 3, [-0.5] * 3])
    b = _batch(old, torch.ones(4, 3), rewards=torch.full((4,), -1.0), correct=torch.zeros(4, dtype=torch.bool))
    adv, _ = get_advantage_fn("grpo_ur")(b)
    assert torch.equal(adv, torch.zeros(4))


# ---------- QUATRO's penalty scale and its pre-flight warning

@pytest.mark.parametrize("scale,penalty", [("mean", 0.2), ("sum", 0.4)])
def test_quatro_log_ratio_scale_by_hand(scale, penalty):
    """One response of two tokens with log r = 0.1 and 0.3: log s = 0.2 (mean) and the trajectory log-ratio 0.4
    (sum); A = 0.5, seq-mean-token-mean: loss = -s (A - penalty) with s = e^0.2 either way."""
    old = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    new = (old + torch.tensor([[0.1, 0.3]], dtype=torch.float64)).requires_grad_(True)
    loss, m = get_policy_loss_fn("quatro")(new, _batch(old, torch.ones(1, 2)), torch.tensor([0.5], dtype=torch.float64),
                                           log_ratio_scale=scale)
    assert float(loss) == pytest.approx(-math.exp(0.2) * (0.5 - penalty), rel=1e-9)
    assert m["reversed_share"] == 0.0
    # a penalty larger than the advantage reverses the sample's gradient: only the sum reading gets there
    loss, m = get_policy_loss_fn("quatro")(new, _batch(old, torch.ones(1, 2)), torch.tensor([0.3], dtype=torch.float64),
                                           log_ratio_scale=scale)
    assert m["reversed_share"] == (1.0 if scale == "sum" else 0.0)


def test_quatro_warns_when_delta_leaves_no_interior_solution():
    """G = 8: log(8/7) = 0.1335. delta 0.2 floors lambda for a group with seven correct answers; the wrong answer's
    advantage is then 0/1e-3 - log mean exp([1000] * 7 + [0]) = -(1000 + log(7/8)) = -999.87."""
    assert validate_params("advantage", "quatro", {"delta": 0.1}, context={"group_size": 8}) == []
    [w] = validate_params("advantage", "quatro", {"delta": 0.2}, context={"group_size": 8})
    assert "log(G/(G-1)) = 0.1335" in w and "advantage is -1000" in w
    adv, m = get_advantage_fn("quatro")(_batch(torch.zeros(8, 1), torch.ones(8, 1), rewards=torch.tensor([1.0] * 7 + [0.0]),
                                                group_index=torch.zeros(8, dtype=torch.long)), delta=0.2)
    assert float(adv[-1]) == pytest.approx(-(1000 + math.log(7 / 8)), rel=1e-4) and m["lambda_floored_groups"] == 1


def test_exppo_ablation_switches_by_hand_and_exppo_on_another_estimator():
    """ExPPO's Table 9 parts switched off one at a time, each against the rule written out by hand; the shuffled
    control equals ExPPO on the surprisals permuted by the same random draw; ``base_estimator=grpo`` with DAPO's
    ``norm_by_std`` shapes GRPO's advantages (the ExPPO + DAPO preset's path)."""
    from training.algorithms import get_advantage_fn
    from training.algorithms.advantages import group_normalized_advantages
    from training.batch import RolloutBatch

    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    surprisal = torch.tensor([[3.0, 1.0, 2.0, 2.4]], dtype=torch.float64)   # mean 2.1: u = .9, -1.1, -.1, .3
    u = surprisal - 2.1
    rho = 0.25
    a = (rewards - 0.25) / (0.5 + 1e-6)                                     # GRPO, unbiased std of [1, 0, 0, 0]
    gate = torch.where(u > 0, 1 - rho, rho)
    sign = torch.sign(a)

    def norm(m):
        return m * a * a.abs().sum() / (m * a).abs().sum()

    cases = {
        (): norm(1 + 0.2 * gate * torch.tanh(u) * sign),
        ("rarity",): norm(1 + 0.2 * gate * sign),
        ("pass_rate_gate",): norm(1 + 0.2 * torch.tanh(u) * sign),
        ("shared_norm",): (1 + 0.2 * gate * torch.tanh(u) * sign) * a,
    }
    for off, expect in cases.items():
        got, _ = exppo_advantages(rewards, surprisal, lam=0.2, parts=ExppoParts(**{k: False for k in off}))
        assert torch.allclose(got, expect, atol=1e-6), off
    assert not torch.allclose(cases[()], cases[("rarity",)]) and not torch.allclose(cases[()], cases[("shared_norm",)])
    g = torch.Generator().manual_seed(3)
    shuffled, _ = exppo_advantages(rewards, surprisal, lam=0.2, parts=ExppoParts(shuffle_surprisal=True), generator=g)
    perm = torch.randperm(4, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(perm, torch.arange(4))
    expect, _ = exppo_advantages(rewards, surprisal[:, perm], lam=0.2)
    assert torch.allclose(shuffled, expect)

    B, L = 8, 3
    r = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1])
    old = -torch.rand(B, L, generator=torch.Generator().manual_seed(0))
    batch = RolloutBatch(prompt_ids=torch.zeros(B, 1), prompt_mask=torch.ones(B, 1), response_ids=torch.zeros(B, L),
                         response_mask=torch.ones(B, L), old_logprobs=old, rewards=r,
                         group_index=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), response_lengths=torch.full((B,), L))
    on, metrics = get_advantage_fn("exppo")(batch, lam=0.2, base_estimator="grpo", norm_by_std=False)
    base = group_normalized_advantages(r.view(2, 4).double(), norm_by_std=False)
    expect, _ = exppo_advantages(r.view(2, 4), -old.mean(-1).view(2, 4), 0.2, base_advantages=base)
    assert torch.allclose(on, expect.view(-1).float(), atol=1e-6)
    plain, _ = get_advantage_fn("exppo")(batch, lam=0.2)
    assert not torch.allclose(on, plain)  # GRPO without std normalisation is another base
    with pytest.raises(ValueError, match="unknown parameter"):
        validate_params("advantage", "exppo", {"lam": 0.2, "norm_by_std": True})  # a base key without base_estimator
