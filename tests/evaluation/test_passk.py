"""pass@k against the binomial definition (exact integers) and the issue's fixed values."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.metrics.passk import pass_at_k, passk_table


def pass_at_k_binomial(n, c, k):
    """The definition, with exact integer binomials (independent of the product form)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_fixed_values():
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(2, 0, 5)  # k > n is an error, never 1.0
    assert pass_at_k(4, 1, 4) == 1.0
    v = pass_at_k(2000, 10, 1000)
    assert math.isfinite(v) and v == pytest.approx(0.99905, abs=5e-6)
    assert v == pytest.approx(pass_at_k_binomial(2000, 10, 1000), rel=1e-12)
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.data())
def test_product_form_equals_binomial_and_is_monotone_in_k(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_binomial(n, c, k), abs=1e-12)
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-15


def test_vectorised_over_prompts():
    got = pass_at_k(np.array([4, 4, 8]), np.array([0, 1, 3]), 2)
    assert np.allclose(got, [0.0, pass_at_k_binomial(4, 1, 2), pass_at_k_binomial(8, 3, 2)])
    with pytest.raises(ValueError):
        pass_at_k(np.array([4, 2]), np.array([1, 1]), 3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_table_averages_per_prompt_then_unweighted_over_benchmarks():
    rows = []
    # benchmark a: 2 prompts x 4 samples, one correct each -> avg@4 = 0.25, pass@4 = 1
    for p in range(2):
        rows += [{"benchmark": "a", "prompt_id": str(p), "correct": j == 0} for j in range(4)]
    # benchmark b: 1 prompt, all wrong
    rows += [{"benchmark": "b", "prompt_id": "0", "correct": False} for _ in range(4)]
    table = passk_table(pd.DataFrame(rows), [1, 4])
    assert table.loc["a", "avg@n"] == 0.25 and table.loc["a", "pass@4"] == 1.0
    assert table.loc["mean", "pass@4"] == 0.5  # unweighted over benchmarks, not over prompts (2/3)
    with pytest.raises(ValueError):
        passk_table(pd.DataFrame(rows), [8])


# ---------------------------------------------------------------------------------------------- maj@k (issue 60)
def _brute_maj(labels, k):
    """maj@k by enumerating every k-subset: ``labels`` per sample "correct", None (abstains) or a wrong answer's
    group; a tie at the top counts 1 / (number tied) when the correct group is among them."""
    from collections import Counter
    from itertools import combinations

    hits = []
    for sub in combinations(range(len(labels)), k):
        counts = Counter(labels[i] for i in sub if labels[i] is not None)
        top = max(counts.values()) if counts else 0
        leaders = [g for g, v in counts.items() if v == top]
        hits.append(1.0 / len(leaders) if "correct" in leaders else 0.0)
    return sum(hits) / len(hits)


def test_maj_at_k_by_hand_with_ties_and_abstentions():
    """maj@k by hand on one prompt's 4 samples: 2 correct ("7"), 1 wrong ("8"), 1 without an answer.
    k = 1: 2 of 4 single draws are correct -> 1/2. k = 2: of the 6 pairs, {c,c} wins, {c,w} ties 1:1 (1/2, twice),
    {c,abstain} wins (twice), {w,abstain} loses -> (1 + 2 * 1/2 + 2) / 6 = 4/6. k = 4: 2 votes against
    1 -> 1. The exact formula, the brute force and the hand values agree; k = 1 is the share correct."""
    from evaluation.metrics.majority import maj_at_k

    assert maj_at_k(2, [1], 1, 1) == pytest.approx(0.5)
    assert maj_at_k(2, [1], 1, 2) == pytest.approx(4 / 6)
    assert maj_at_k(2, [1], 1, 4) == pytest.approx(1.0)
    assert maj_at_k(2, [2], 0, 4) == pytest.approx(0.5)  # 2 against 2: a coin
    assert maj_at_k(0, [3], 1, 2) == 0.0 and maj_at_k(3, [], 0, 2) == 1.0
    import random

    rng = random.Random(0)
    for _ in range(40):
        labels = [rng.choice(["correct", "a", "b", "c", None]) for _ in range(rng.randint(1, 9))]
        c = labels.count("correct")
        others = [labels.count(g) for g in "abc"]
        for k in range(1, len(labels) + 1):
            assert maj_at_k(c, others, labels.count(None), k) == pytest.approx(_brute_maj(labels, k), abs=1e-12)
    with pytest.raises(ValueError, match="k=5 with n=4"):
        maj_at_k(2, [1], 1, 5)


def test_maj_at_k_in_the_passk_table_votes_by_equivalence_and_abstains_on_restatements():
    """The passk table's maj@k on a fixture: prompt p1's wrong answers "1/2" and "0.5" are one group under the
    benchmark's equivalence (so they outvote the 1 correct sample at k = 3); a restatement (``restated``) abstains,
    though its extracted text equals the others'. Hand values: p1 at k = 3 (samples c, w, w', r): subsets
    {c,w,w'} lose (2 vs 1), {c,w,r} and {c,w',r} tie 1:1 (1/2 each), {w,w',r} lose -> 1/4; p2 (c, c, r, w):
    {c,c,r} 1, {c,c,w} 1, {c,r,w} 1/2 (twice) -> 3/4; mean over prompts 1/2."""
    import pandas as pd

    from evaluation.tables import compute_tables

    rows = [("p1", 0, True, "3", "stated"), ("p1", 1, False, "1/2", "stated"), ("p1", 2, False, "0.5", "stated"),
            ("p1", 3, False, "1/2", "restated"),
            ("p2", 0, True, "4", "stated"), ("p2", 1, True, "4", "stated"), ("p2", 2, False, "9", "restated"),
            ("p2", 3, False, "5", "stated")]
    df = pd.DataFrame([{"benchmark": "b", "prompt_id": p, "sample_idx": i, "correct": c, "extracted_answer": a,
                        "answer_status": st, "response": f"r{i}", "prompt": "q", "gold": "x", "n_tokens": 3,
                        "finish_reason": "stop", "reference_correct": None, "mean_token_entropy": None, "seed": 0,
                        "subset": None, "tool_calls": None} for p, i, c, a, st in rows])

    def same(a, b):
        return float(eval(a)) == float(eval(b))

    tables, metrics = compute_tables(df, [1, 3], same_answer={"b": same})
    assert tables["passk"].loc["b", "maj@3"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    assert tables["passk"].loc["b", "maj@1"] == pytest.approx(tables["passk"].loc["b", "pass@1"])
    assert metrics["eval/b/maj_at_3"] == pytest.approx(0.5) and metrics["eval/mean/maj_at_3"] == pytest.approx(0.5)
