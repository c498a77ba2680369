"""The training-inference mismatch metrics and the truncated importance-sampling correction (training/mismatch.py),
checked against hand computation; the correction reaches every registered policy loss through the shared
aggregation (training/algorithms/aggregation.py::token_weights)."""
import math

import pytest
import torch

from training.batch import RolloutBatch
from training.mismatch import mismatch_metrics, tis_weights

# two responses of 3 token slots; the second ends after 2 tokens
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])
ROLL = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -4.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# log r = old - rollout on the 5 tokens: 0.5, -1.0, 0.0, 0.0, 1.0


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(OLD, ROLL, MASK)
    log_r = [0.5, -1.0, 0.0, 0.0, 1.0]
    assert m["mismatch_logprob_abs_diff"] == pytest.approx(2.5 / 5)
    assert m["mismatch_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in log_r) / 5, rel=1e-6)
    # ratios e^0.5 = 1.65 (in), e^-1 = 0.37 (out), 1, 1, e^1 = 2.72 (out)
    assert m["mismatch_ratio_out_share"] == pytest.approx(2 / 5)


def test_tis_weights_by_hand():
    tok = tis_weights(OLD, ROLL, MASK, "token_tis", cap=2.0)
    expected = torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0], [1.0, 2.0, 1.0]])  # e^1 capped at 2; padding 1
    assert torch.allclose(tok, expected)
    seq = tis_weights(OLD, ROLL, MASK, "sequence_tis", cap=2.0)
    # products of the ratios: e^(0.5 - 1 + 0) = e^-0.5; e^(0 + 1) = e capped at 2
    assert torch.allclose(seq, torch.tensor([[math.exp(-0.5)] * 3, [2.0, 2.0, 1.0]]))
    assert tis_weights(OLD, ROLL, MASK, "none") is None
    with pytest.raises(ValueError, match="correction='tis'"):
        tis_weights(OLD, ROLL, MASK, "tis")
    with pytest.raises(ValueError, match="correction_cap=0.5"):
        tis_weights(OLD, ROLL, MASK, "token_tis", cap=0.5)


def _batch(old):
    return RolloutBatch(prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.long),
                        response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=MASK, old_logprobs=old,
                        rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]),
                        response_lengths=MASK.sum(-1), rollout_logprobs=ROLL)


def test_token_tis_changes_the_grpo_loss_as_its_formula_says():
    """GRPO's clipped surrogate at the old policy (ratio 1, inside the clip) is -A_i per token; token-mean over the 5
    tokens. With token_tis each token's term is multiplied by w_t = min(pi_old / pi_vllm, 2):
    loss = -(A_1 (e^0.5 + e^-1 + 1) + A_2 (1 + 2)) / 5, and its gradient with respect to each log-prob is -A_i w_t / 5."""
    from training.algorithms import BoundLoss
    from training.corrections import Correction
    from training.update import policy_objective

    adv = torch.tensor([1.0, -1.0])
    loss = BoundLoss.named("grpo", {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "loss_agg_mode": "token-mean"})
    lp = OLD.clone().requires_grad_(True)
    plain, _, _ = policy_objective(lp, None, _batch(OLD), adv, loss)
    assert float(plain.detach()) == pytest.approx(-(1.0 * 3 - 1.0 * 2) / 5)
    w = tis_weights(OLD, ROLL, MASK, "token_tis", 2.0)
    weighted, _, _ = policy_objective(lp, None, _batch(OLD), adv, loss, correction=Correction(w, None))
    by_hand = -(1.0 * (math.exp(0.5) + math.exp(-1.0) + 1.0) - 1.0 * (1.0 + 2.0)) / 5
    assert float(weighted) == pytest.approx(by_hand, abs=1e-6)  # float32 sums
    weighted.backward()
    assert torch.allclose(lp.grad, -adv[:, None] * w * MASK / 5)


@pytest.mark.parametrize("name", ["grpo", "gspo", "gmpo", "cispo", "gpg", "quatro", "tr_grpo"])
def test_sequence_weights_scale_every_registered_loss(name):
    """With one weight c per response (sequence_tis) every policy loss's value at the old policy is the weighted
    version of its plain value: all of them aggregate through the shared agg_loss, so none escapes the correction.
    Checked with c = 2 on both responses (the loss doubles) and c = 0 on the second (its terms vanish)."""
    from training.algorithms import get_policy_loss_fn
    from training.algorithms.aggregation import token_weights

    loss_fn = get_policy_loss_fn(name)
    adv = torch.tensor([1.0, -0.5])
    batch = _batch(OLD)
    batch.ref_logprobs = OLD - 0.1
    batch.entropy = torch.ones(2, 3)
    plain, _ = loss_fn(OLD, batch, adv)
    with token_weights(torch.full((2, 3), 2.0)):
        doubled, _ = loss_fn(OLD, batch, adv)
    assert float(doubled) == pytest.approx(2 * float(plain), rel=1e-5)
    first_only = _batch(OLD)
    first_only.ref_logprobs, first_only.entropy = batch.ref_logprobs, batch.entropy
    with token_weights(torch.tensor([[1.0] * 3, [0.0] * 3])):
        dropped, _ = loss_fn(OLD, batch, adv)
    assert float(plain) != pytest.approx(float(dropped))
