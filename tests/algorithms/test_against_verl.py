"""Loss values and gradients against verl's own implementations (verl as a test-only oracle).

verl 0.9.1's ``core_algos`` imports on the CPU when installed with ``--no-deps`` (see
scripts/install.sh); without it these tests skip.
"""
import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl (test oracle) is not installed")
from verl.workers.config import ActorConfig  # noqa: E402

from training.algorithms import agg_loss, get_advantage_fn, get_policy_loss_fn  # noqa: E402
from training.batch import RolloutBatch  # noqa: E402

MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def _data(seed=0, B=6, L=7):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, L)
    for i, n in enumerate([7, 3, 5, 1, 6, 4][:B]):
        mask[i, n:] = 0
    old = -torch.rand(B, L, generator=g) * 3
    new = old + 0.25 * torch.randn(B, L, generator=g)  # ratios mostly inside (0.5, 2): verl's dual clip (3.0) never binds
    adv = torch.randn(B, generator=g)
    return old, new, adv, mask


def _batch(old, mask):
    B = old.shape[0]
    return RolloutBatch(prompt_ids=torch.zeros(B, 1), prompt_mask=torch.ones(B, 1), response_ids=torch.zeros_like(old),
                        response_mask=mask, old_logprobs=old, rewards=torch.zeros(B),
                        group_index=torch.zeros(B, dtype=torch.long), response_lengths=mask.sum(-1))


def _actor_config(low=0.2, high=0.2, clip_ratio_c=3.0):
    return ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio_low=low, clip_ratio_high=high, ppo_mini_batch_size=1,
                       ppo_micro_batch_size_per_gpu=1, clip_ratio_c=clip_ratio_c)


def _compare(ours_name, ours_params, verl_fn, verl_mode, low, high, seed=0, spread=None, clip_ratio_c=3.0):
    old, new, adv, mask = _data(seed)
    if spread is not None:   # wider ratios, so that verl's dual clip binds
        new = old + spread * (new - old)
    new_ours = new.clone().requires_grad_(True)
    loss_ours, _ = get_policy_loss_fn(ours_name)(new_ours, _batch(old, mask), adv, **ours_params)
    loss_ours.backward()
    new_verl = new.clone().requires_grad_(True)
    adv_tok = adv.unsqueeze(-1).expand_as(mask) * mask
    loss_verl, _ = verl_fn(old_log_prob=old, log_prob=new_verl, advantages=adv_tok, response_mask=mask,
                           loss_agg_mode=verl_mode, config=_actor_config(low, high, clip_ratio_c))
    loss_verl.backward()
    assert float(loss_ours) == pytest.approx(float(loss_verl), rel=1e-5, abs=1e-7)
    assert torch.allclose(new_ours.grad * mask, new_verl.grad * mask, atol=1e-6)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_and_dapo_clipped_surrogate_match_verl_vanilla(mode, seed):
    _compare("grpo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=mode), core_algos.compute_policy_loss_vanilla, mode, 0.2, 0.2, seed)
    _compare("grpo", dict(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode), core_algos.compute_policy_loss_vanilla, mode, 0.2, 0.28, seed)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dual_clip_matches_verl_vanilla_where_it_binds(mode, seed):
    """verl's built-in vanilla loss caps a negative-advantage token's loss at -c A (clip_ratio_c = 3): with ratios
    spread 8x wider some tokens pass r = 3 and the cap binds; ours with dual_clip=3 matches values and gradients."""
    old, new, adv, mask = _data(seed)
    assert float(((old + 8 * (new - old)).exp() / old.exp() * mask).max()) > 3.0   # the cap binds somewhere
    _compare("grpo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=mode, dual_clip=3.0),
             core_algos.compute_policy_loss_vanilla, mode, 0.2, 0.2, seed, spread=8.0)
    _compare("grpo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=mode, dual_clip=2.0),
             core_algos.compute_policy_loss_vanilla, mode, 0.2, 0.2, seed, spread=8.0, clip_ratio_c=2.0)
    # and without our dual clip the two differ there (the test can fail)
    with pytest.raises(AssertionError):
        _compare("grpo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode=mode),
                 core_algos.compute_policy_loss_vanilla, mode, 0.2, 0.2, seed, spread=8.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_matches_verl(seed):
    # wider clip bounds than GSPO's 3e-4/4e-4 so that both branches occur in the random data
    _compare("gspo", dict(clip_ratio_low=0.05, clip_ratio_high=0.08, loss_agg_mode="seq-mean-token-mean"),
             core_algos.compute_policy_loss_gspo, "seq-mean-token-mean", 0.05, 0.08, seed)


@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_matches_verl(seed):
    _compare("cispo", dict(clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_mode="token-mean"),
             core_algos.compute_policy_loss_cispo, "token-mean", 0.2, 0.2, seed)


@pytest.mark.parametrize("seed", [0, 1])
def test_gpg_loss_matches_verl(seed):
    _compare("gpg", dict(loss_agg_mode="token-mean"), core_algos.compute_policy_loss_gpg, "token-mean", 0.2, 0.2, seed)


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_matches_verl_geo_mean(seed):
    _compare("gmpo", dict(clip_ratio_low=0.1, clip_ratio_high=0.1), core_algos.compute_policy_loss_geo_mean,
             "seq-mean-token-mean", 0.1, 0.1, seed)


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_matches_verl(mode):
    _, new, _, mask = _data(3)
    assert float(agg_loss(new, mask, mode)) == pytest.approx(float(core_algos.agg_loss(new, mask, mode)), rel=1e-6)


def test_grpo_advantage_matches_verl():
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0])
    index = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2])
    mask = torch.ones(12, 3)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=torch.nn.functional.pad(rewards.unsqueeze(-1), (2, 0)), response_mask=mask, index=index)
    b = _batch(torch.zeros(12, 3), mask)
    b.rewards, b.group_index = rewards, torch.tensor(index)
    ours, _ = get_advantage_fn("grpo")(b)
    assert torch.allclose(ours, verl_adv[:, 0], atol=1e-5)


def test_gpg_advantage_matches_verl_when_counts_agree_and_documents_the_difference():
    mask = torch.ones(8, 2)
    index = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    b = _batch(torch.zeros(8, 2), mask)
    b.group_index = torch.tensor(index)
    # groups with mixed rewards: 4 non-zero rewards in verl's count; our count of non-zero
    # advantages is 8: alpha differs by 2x by design (ALGORITHMS.md, GPG)
    b.rewards = torch.tensor([1.0, 0, 1, 0, 0, 1, 0, 1])
    verl_adv, _ = core_algos.compute_gpg_outcome_advantage(
        token_level_rewards=torch.nn.functional.pad(b.rewards.unsqueeze(-1), (1, 0)), response_mask=mask, index=index)
    ours, m = get_advantage_fn("gpg")(b)
    assert m["gpg_alpha"] == 1.0  # 8 responses / 8 non-zero advantages
    assert torch.allclose(ours * 2.0, verl_adv[:, 0], atol=1e-6)  # verl: alpha = 8 / 4 non-zero rewards
