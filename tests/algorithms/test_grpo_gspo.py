"""GRPO advantage, clipped surrogate, GSPO and loss aggregation against hand computations."""
import math

import pytest
import torch

from training.algorithms import agg_loss, get_advantage_fn, get_policy_loss_fn
from training.algorithms.advantages import group_normalized_advantages
from training.batch import RolloutBatch


def _batch(old, mask, rewards=None, group_index=None):
    B = old.shape[0]
    return RolloutBatch(prompt_ids=torch.zeros(B, 1), prompt_mask=torch.ones(B, 1), response_ids=torch.zeros_like(old),
                        response_mask=mask, old_logprobs=old,
                        rewards=torch.zeros(B) if rewards is None else rewards,
                        group_index=torch.zeros(B, dtype=torch.long) if group_index is None else group_index,
                        response_lengths=mask.sum(-1))


def test_grpo_advantage_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3)
    adv = group_normalized_advantages(torch.tensor([[1.0, 0, 0, 1]]))
    assert torch.allclose(adv, torch.tensor([[1, -1, -1, 1]]) * 0.5 / (math.sqrt(1 / 3) + 1e-6))
    dr = group_normalized_advantages(torch.tensor([[1.0, 0, 0, 1]]), norm_by_std=False)
    assert torch.allclose(dr, torch.tensor([[0.5, -0.5, -0.5, 0.5]]))
    assert (group_normalized_advantages(torch.tensor([[1.0, 1, 1]])) == 0).all()
    assert (group_normalized_advantages(torch.tensor([[1.0], [0.0]])) == 0).all()


def test_registered_grpo_estimator_groups_by_index():
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1])
    group_index = torch.tensor([0, 1, 0, 1, 1, 0])  # group 0: 1, 0, 1; group 1: 0, 0, 1
    adv, m = get_advantage_fn("grpo")(_batch(torch.zeros(6, 1), torch.ones(6, 1), rewards, group_index))
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1) and (0, 0, 1)
    expect = torch.tensor([1 / 3, -1 / 3, -2 / 3, -1 / 3, 2 / 3, 1 / 3]) / (std + 1e-6)
    assert torch.allclose(adv, expect, atol=1e-6)
    assert m["zero_variance_share"] == 0.0


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert float(agg_loss(loss, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_constant=5)) == pytest.approx(10 / (2 * 5))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(loss, mask, "sum")


def test_grpo_clipped_surrogate_value_gradient_and_clip_fraction():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    # token ratios: 1.5 (clipped for A > 0), 0.9 ; 0.7 (clipped for A < 0), 1.1
    new = torch.log(torch.tensor([[0.75, 0.45], [0.35, 0.55]])).requires_grad_(True)
    adv = torch.tensor([1.0, -2.0])
    loss, m = get_policy_loss_fn("grpo")(new, _batch(old, torch.ones(2, 2)), adv, clip_ratio_low=0.2, clip_ratio_high=0.2,
                                          loss_agg_mode="token-mean")
    loss.backward()
    # per token: max(-A r, -A clip(r)): [-1.2, -0.9], [1.6, 2.2]
    assert float(loss) == pytest.approx((-1.2 - 0.9 + 1.6 + 2.2) / 4, rel=1e-5)
    # gradient w.r.t. log-prob = -A r / 4 where unclipped, 0 where the clipped branch is taken
    expect = torch.tensor([[0.0, -0.9 / 4], [0.0, 2 * 1.1 / 4]])
    assert torch.allclose(new.grad, expect, atol=1e-6)
    assert m["clip_fraction"] == 0.5 and m["clip_fraction_active"] == 0.5


def test_gspo_value_and_gradient_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    old = torch.full((2, 3), -1.0)
    new = torch.tensor([[-1.0001, -0.9997, -5.0], [-0.8, -0.8, -0.8]], requires_grad=True)
    adv = torch.tensor([0.7, 0.5])
    loss, m = get_policy_loss_fn("gspo")(new, _batch(old, mask), adv)
    loss.backward()
    s0 = math.exp((-0.0001 + 0.0003) / 2)  # 1.0001: inside [1 - 3e-4, 1 + 4e-4]
    assert math.exp(0.2) > 1 + 4e-4  # the second response: far above the clip with A > 0: clipped, no gradient
    assert float(loss) == pytest.approx((-0.7 * s0 - 0.5 * (1 + 4e-4)) / 2, rel=1e-6)
    expect = torch.tensor([[-0.7 * s0 / 2 / 2, -0.7 * s0 / 2 / 2, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(new.grad, expect, atol=1e-7)
    assert m["clip_fraction"] == 0.5
    # a sequence clipped on the *other* side of its advantage keeps its gradient
    new2 = torch.tensor([[-0.8, -0.8, -0.8]], requires_grad=True)
    get_policy_loss_fn("gspo")(new2, _batch(torch.full((1, 3), -1.0), torch.ones(1, 3)), torch.tensor([-1.0]))[0].backward()
    assert torch.allclose(new2.grad, torch.full((1, 3), math.exp(0.2) / 3), atol=1e-6)
