"""training.token_probs: the per-token counts and mean probabilities behind TR-GRPO's Fig. 1 (hand-computed)."""
import math

import pandas as pd
import pytest
import torch

from training.token_probs import TokenProbs


def test_counts_and_mean_probabilities_by_hand():
    ids = torch.tensor([[5, 7, 5, 0], [7, 7, 9, 9]])
    p = torch.tensor([[0.5, 0.2, 0.7, 0.9], [0.4, 0.6, 0.1, 0.3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])  # the last column is padding: token 0 and the second 9 unseen
    tp = TokenProbs()
    tp.update(ids, p.log(), mask)
    t = tp.table()
    # token 7: three times (0.2, 0.4, 0.6) -> 0.4; token 5: twice (0.5, 0.7) -> 0.6; token 9: once (0.1)
    assert list(t["token_id"]) == [7, 5, 9] and list(t["count"]) == [3, 2, 1]
    assert list(t["mean_prob"]) == pytest.approx([0.4, 0.6, 0.1])
    assert list(t["share"]) == pytest.approx([3 / 6, 2 / 6, 1 / 6])
    # two batches accumulate as one, and a state round trip (a resumed run) continues the same sums
    a, b = TokenProbs(), TokenProbs()
    a.update(ids[:1], p[:1].log(), mask[:1])
    b.load_state_dict(a.state_dict())
    b.update(ids[1:], p[1:].log(), mask[1:])
    pd.testing.assert_frame_equal(b.table(), t, rtol=1e-12)
    assert TokenProbs().table().empty
    with pytest.raises(ValueError, match=r"token_ids \(2, 4\)"):
        tp.update(ids, p.log()[:, :3], mask)


def test_ties_break_by_token_id_and_the_top_cut_and_decoding():
    class Tok:
        def decode(self, ids):
            return " " + "xyz"[ids[0] % 3]

    tp = TokenProbs()
    tp.update(torch.tensor([[4, 3, 2]]), torch.full((1, 3), math.log(0.5)), torch.ones(1, 3))
    t = tp.table(Tok(), top=2)
    assert list(t["token_id"]) == [2, 3] and list(t["token"]) == [" z", " x"]
