"""Compute-performance curves (evaluation/curves.py, issue 60): ScaleRL's sigmoid fitted with bounded least squares,
bootstrap intervals checked for coverage on synthetic curves drawn from known parameters, refusals, the
extrapolation check and paired method differences."""
import numpy as np
import pandas as pd
import pytest

from evaluation.curves import Points, compare_fits, fit_curve, fit_methods, fit_table, sigmoid

TRUE = {"A": 0.7, "B": 1.5, "c_mid": 40.0}
R0 = 0.2
GRID = np.arange(0, 101, 5.0)  # validation every 5 compute units from 0 to 100: 21 points (linear, as steps are)


def _draw(rng, P=200, n=4, A=TRUE["A"], B=TRUE["B"], c_mid=TRUE["c_mid"], grid=GRID, seeds=1):
    """Per-prompt pass rates: each of P prompts' n samples correct with probability R(C) at each point (binomial)."""
    p = sigmoid(grid, A, B, c_mid, R0)
    vals = rng.binomial(n, np.broadcast_to(p[None, :, None], (seeds, len(grid), P))) / n
    return Points(vals, np.broadcast_to(grid, (seeds, len(grid))).copy())


def test_sigmoid_by_hand_and_a_noise_free_fit_recovers_the_parameters():
    """R(C_mid) = R0 + (A - R0) / 2; R(0) = R0; at C = 2 C_mid with B = 1: R0 + (A - R0) / (1 + 1/2). Noise-free
    points give back A, B and C_mid, and the extrapolation from the first half predicts the second exactly."""
    assert sigmoid(40.0, 0.7, 1.5, 40.0, 0.2) == pytest.approx(0.45)
    assert sigmoid(0.0, 0.7, 1.5, 40.0, 0.2) == pytest.approx(0.2)
    assert sigmoid(80.0, 0.7, 1.0, 40.0, 0.2) == pytest.approx(0.2 + 0.5 / 1.5)
    exact = sigmoid(GRID, **TRUE, r0=R0)
    pts = Points(np.broadcast_to(exact[None, :, None], (1, len(GRID), 3)).copy(), GRID[None].copy())
    fit = fit_curve(pts, n_boot=0)
    assert fit.ok and fit.A == pytest.approx(0.7, abs=1e-6) and fit.B == pytest.approx(1.5, abs=1e-5)
    assert fit.c_mid == pytest.approx(40.0, rel=1e-5) and fit.r0 == pytest.approx(0.2)
    assert fit.skipped == 1 and len(fit.compute) == 19  # compute 5 < 0.1 x 100 is the first stretch; 0 is R0
    ex = fit.extrapolation
    assert ex["made"] and ex["points_fitted"] == 9 and ex["points_predicted"] == 10 and ex["mae"] < 1e-5


@pytest.mark.slow
def test_bootstrap_intervals_cover_the_true_parameters_in_at_least_90_of_100_draws():
    """Acceptance: 100 synthetic series (200 prompts x 4 samples, binomial noise) from known (A, B, C_mid); the 95%
    prompt-bootstrap intervals cover each true parameter in >= 90 of them (93-97 measured with 200 replicates)."""
    rng = np.random.default_rng(123)
    cover = {k: 0 for k in TRUE}
    for d in range(100):
        fit = fit_curve(_draw(rng), n_boot=200, seed=d, extrapolate=False)
        assert fit.ok, fit.reason
        for k, true in TRUE.items():
            cover[k] += fit.ci[k][0] <= true <= fit.ci[k][1]
    assert all(v >= 90 for v in cover.values()), cover


def test_flat_short_and_startless_series_are_refused_with_a_reason():
    rng = np.random.default_rng(0)
    flat = fit_curve(_draw(rng, A=R0), n_boot=20)  # no gain at all: A = R0
    assert not flat.ok and flat.reason.startswith("flat:") and np.isnan(flat.A)
    short = fit_curve(_draw(rng, grid=np.array([0.0, 2, 4, 6])), n_boot=20)  # validate_every=2 over 6 steps
    assert not short.ok and short.reason.startswith("too few points: 3")
    late = fit_curve(_draw(rng, grid=GRID[1:]), n_boot=20)
    assert not late.ok and "step-0" in late.reason
    # issue 70: every point at 0.0 (standard error 0) is refused, never fitted with intervals of width 0
    zeros = fit_curve(Points(np.zeros((1, len(GRID), 4)), GRID[None].copy()), n_boot=20)
    assert not zeros.ok and zeros.reason.startswith("flat: every point is 0.0000") and np.isnan(zeros.A)
    still = fit_curve(Points(np.full((1, len(GRID), 4), 0.5), GRID[None].copy()), n_boot=20)
    assert not still.ok and still.reason.startswith("flat:")
    table = fit_table({"flat": flat, "short": short})
    assert table.loc["short", "note"].startswith("too few points") and np.isnan(table.loc["short", "A"])


def test_seeds_pool_and_methods_compare_with_paired_draws():
    """Two methods from the same validation prompts: one with a higher ceiling (A 0.9 against 0.5), one equal to the
    baseline; the ceiling difference is resolved for the first, and the long table's fits equal the direct ones."""
    rng = np.random.default_rng(7)
    rows = []
    for method, A in (("base", 0.5), ("high", 0.9), ("same", 0.5)):
        pts = _draw(rng, A=A, seeds=2)
        for s in range(2):
            for t, c in enumerate(GRID):
                rows += [{"run": f"{method} {s}", "step": t, "compute": c, "prompt_id": p, "value": pts.values[s, t, p]}
                         for p in range(pts.values.shape[-1])]
    series = pd.DataFrame(rows)
    methods = {m: [f"{m} 0", f"{m} 1"] for m in ("base", "high", "same")}
    fits = fit_methods(series, methods, n_boot=100, seed=1)
    assert all(f.ok for f in fits.values())
    assert fits["high"].ci["A"][0] <= 0.9 <= fits["high"].ci["A"][1]
    cmp = compare_fits(fits, "base")
    assert cmp.loc["high", "ceiling_differs"] and cmp.loc["high", "dA"] == pytest.approx(fits["high"].A - fits["base"].A)
    assert not cmp.loc["same", "ceiling_differs"]
