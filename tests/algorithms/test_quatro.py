"""QUATRO dual, advantages and loss against ALGORITHMS.md's check values and independent computations."""
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar

from training.algorithms.quatro import quatro_advantage, quatro_advantages, quatro_dual, quatro_loss
from training.batch import RolloutBatch

# (rewards, delta, lambda*, mu*, A correct, A wrong) from ../shared/ALGORITHMS.md
CHECK_ROWS = [
    ([1] + [0] * 7, 0.1, 0.93443, -0.73381, 0.8555, -0.2147),
    ([1] * 4 + [0] * 4, 0.1, 1.05995, -0.44615, 0.3644, -0.5791),
    ([1] * 7 + [0], 0.1, 0.36124, 0.59375, 0.1246, -2.6436),
    ([1] * 7 + [0], 0.01, 2.06419, -1.16572, 0.0492, -0.4353),
]


@pytest.mark.parametrize("rewards,delta,lam,mu,a_pos,a_neg", CHECK_ROWS)
def test_check_values(rewards, delta, lam, mu, a_pos, a_neg):
    r = torch.tensor([rewards], dtype=torch.float64)
    got_lam, got_mu = quatro_dual(r, delta)
    assert float(got_lam[0]) == pytest.approx(lam, abs=1e-4)
    assert float(got_mu[0]) == pytest.approx(mu, abs=1e-4)
    adv = quatro_advantages(r, delta)[0]
    assert float(adv[r[0] == 1][0]) == pytest.approx(a_pos, abs=1e-4)
    assert float(adv[r[0] == 0][0]) == pytest.approx(a_neg, abs=1e-4)


def test_batched_equals_rowwise_and_mean_exp_adv_is_one():
    torch.manual_seed(0)
    r = (torch.rand(64, 8) < 0.4).double()
    r[0] = 1.0  # a zero-variance group
    adv = quatro_advantages(r, 0.05)
    for i in range(0, 64, 9):
        assert torch.allclose(adv[i], quatro_advantages(r[i:i + 1], 0.05)[0], atol=1e-12)
    assert torch.allclose(adv.exp().mean(-1), torch.ones(64, dtype=torch.float64), atol=1e-6)


def _dual_by_scipy(rewards, delta):
    """Independent method: minimise the dual f(lambda) directly with scipy (bounded Brent)."""
    r = np.asarray(rewards, dtype=np.float64)

    def f(log_lam):
        lam = math.exp(log_lam)
        z = r / lam
        return lam * delta + lam * (np.logaddexp.reduce(z) - math.log(len(r)))

    res = minimize_scalar(f, bounds=(math.log(1e-4), math.log(1e4)), method="bounded", options={"xatol": 1e-12})
    return math.exp(res.x)


@pytest.mark.parametrize("seed", range(5))
def test_dual_matches_direct_minimisation_with_graded_rewards(seed):
    rng = np.random.default_rng(seed)
    rewards = rng.uniform(-1, 2, size=6)
    delta = float(rng.uniform(0.005, 0.3))
    lam, _ = quatro_dual(torch.tensor([rewards]), delta)
    assert float(lam[0]) == pytest.approx(_dual_by_scipy(rewards, delta), rel=1e-5)
    # the sampled trust region is tight at the optimum
    p = torch.softmax(torch.tensor(rewards) / lam[0], -1)
    kl = float((p * (p * len(rewards)).log()).sum())
    assert kl == pytest.approx(delta, abs=1e-8)


def test_larger_delta_gives_smaller_lambda_and_larger_advantages():
    r = torch.tensor([[1, 1, 0, 0, 0, 1, 0, 0]], dtype=torch.float64)
    lams = [float(quatro_dual(r, d)[0][0]) for d in (0.01, 0.05, 0.1)]
    assert lams[0] > lams[1] > lams[2]
    advs = [float(quatro_advantages(r, d).abs().sum()) for d in (0.01, 0.05, 0.1)]
    assert advs[0] < advs[1] < advs[2]


def test_edge_cases():
    lam, mu = quatro_dual(torch.ones(2, 8), 0.1)
    assert torch.isnan(lam).all() and torch.isnan(mu).all()
    assert (quatro_advantages(torch.ones(2, 8), 0.1) == 0).all()
    assert (quatro_advantages(torch.tensor([[1.0], [0.0]]), 0.1) == 0).all()  # G = 1
    # delta >= log(G/m): one max among 8 -> log 8 = 2.079; delta 3 has no interior optimum
    lam, _, info = quatro_dual(torch.tensor([[1.0] + [0.0] * 7]), 3.0, lambda_min=1e-3, return_info=True)
    assert float(lam[0]) == pytest.approx(1e-3) and bool(info["floored"][0])
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            quatro_dual(torch.ones(1, 8), bad)


def test_registered_estimator_keeps_response_order_and_reports_lambda():
    rewards = torch.tensor([0.0, 1, 0, 0, 0, 0, 0, 0] + [1.0] * 8)
    # interleave the two groups to check the scatter back to response order
    group_index = torch.tensor([0, 1] * 8)
    r = torch.empty(16)
    r[group_index == 0] = rewards[:8]
    r[group_index == 1] = rewards[8:]
    batch = RolloutBatch(*(torch.zeros(16, 1),) * 5, rewards=r, group_index=group_index, response_lengths=torch.ones(16))
    adv, m = quatro_advantage(batch, delta=0.1)
    assert float(adv[2]) == pytest.approx(0.8555, abs=1e-4)  # group 0 holds positions 0, 2, 4...; its 2nd is correct
    assert float(adv[group_index == 1].abs().max()) == 0.0
    assert m["zero_variance_share"] == 0.5 and m["lambda_mean"] == pytest.approx(0.93443, abs=1e-4)


def _batch(old, mask):
    B = old.shape[0]
    return RolloutBatch(prompt_ids=torch.zeros(B, 1), prompt_mask=torch.ones(B, 1), response_ids=torch.zeros_like(old),
                        response_mask=mask, old_logprobs=old, rewards=torch.zeros(B), group_index=torch.zeros(B),
                        response_lengths=mask.sum(-1))


def test_loss_value_and_gradient_match_hand_derivation():
    torch.manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float32)
    old = -torch.rand(3, 4) * 2
    new = (old + 0.3 * torch.randn(3, 4)).requires_grad_(True)
    adv = torch.tensor([0.8, -0.4, 0.1])
    loss, m = quatro_loss(new, _batch(old, mask), adv)
    loss.backward()
    # hand derivation: log s_i = mean_t (new - old); J = mean_i s_i (A_i - log s_i) with log s detached
    # in the bracket; d(-J)/d new_{i,t} = -(1/B) s_i (A_i - log s_i) / |y_i| on valid tokens.
    n = mask.sum(-1)
    log_s = ((new.detach() - old) * mask).sum(-1) / n
    s = log_s.exp()
    assert float(loss) == pytest.approx(float(-(s * (adv - log_s)).mean()), rel=1e-5)
    expected = (-(s * (adv - log_s)) / n / 3).unsqueeze(-1) * mask
    assert torch.allclose(new.grad, expected, atol=1e-6)


def test_gradient_weight_is_plain_policy_gradient_at_s1_and_reverses_past_advantage():
    mask = torch.ones(1, 2)
    old = torch.tensor([[-1.0, -2.0]])
    for shift, expect_sign in ((0.0, -1.0), (0.2, -1.0), (0.4, +1.0)):  # A = 0.3: log s = shift
        new = (old + shift).requires_grad_(True)
        loss, m = quatro_loss(new, _batch(old, mask), torch.tensor([0.3]))
        loss.backward()
        g = new.grad[0, 0].item()
        if shift == 0.0:  # plain policy gradient: -A / |y|
            assert g == pytest.approx(-0.3 / 2, abs=1e-7)
        assert math.copysign(1.0, g) == expect_sign
    assert m["reversed_share"] == 1.0
    # without the log-ratio term the gradient never reverses (the paper's ablation)
    new = (old + 0.4).requires_grad_(True)
    quatro_loss(new, _batch(old, mask), torch.tensor([0.3]), log_ratio_penalty=False)[0].backward()
    assert new.grad[0, 0].item() < 0


def test_token_ratio_level():
    mask = torch.ones(1, 2)
    old = torch.tensor([[-1.0, -2.0]])
    new = torch.tensor([[-0.9, -2.2]], requires_grad=True)
    loss, _ = quatro_loss(new, _batch(old, mask), torch.tensor([0.5]), ratio_level="token")
    loss.backward()
    lr = (new.detach() - old)[0]
    r = lr.exp()
    assert float(loss) == pytest.approx(float(-(r * (0.5 - lr)).mean()), rel=1e-6)
    assert torch.allclose(new.grad[0], -(r * (0.5 - lr)) / 2, atol=1e-7)
    with pytest.raises(ValueError, match="ratio_level"):
        quatro_loss(new, _batch(old, mask), torch.tensor([0.5]), ratio_level="word")
