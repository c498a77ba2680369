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
