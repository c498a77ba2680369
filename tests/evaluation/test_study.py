"""evaluation.study (issue 32's comparisons) against hand computations and the one-seed paired bootstrap, and
``python -m evaluation.recompute --study`` on a manifest."""
import json

import numpy as np
import pandas as pd
import pytest

from evaluation import study as S
from evaluation.metrics.modes import paired_bootstrap_ci, paired_bootstrap_ci_over_seeds


def _samples(correct_by_prompt, texts_by_prompt=None, entropy_by_prompt=None):
    """A samples table: one row per (prompt, sample) with the given 0/1 correctness."""
    rows = []
    for p, cs in enumerate(correct_by_prompt):
        for i, c in enumerate(cs):
            rows.append({"benchmark": "arithmetic", "prompt_id": f"{p:03d}", "sample_idx": i, "correct": bool(c),
                         "response": (texts_by_prompt[p][i] if texts_by_prompt else f"answer {p}"),
                         "mean_token_entropy": (entropy_by_prompt[p][i] if entropy_by_prompt else 0.5)})
    return pd.DataFrame(rows)


def test_per_prompt_values_by_hand():
    s = _samples([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]],
                 texts_by_prompt=[["x = 4", "no", "no", "no"], ["the sum is 7", "the sum is 7", "7", "8"], ["a", "b", "c", "d"]],
                 entropy_by_prompt=[[0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 2.0]])
    # pass@1 = c/n; pass@2 = 1 - C(n-c, 2)/C(n, 2): prompt 0: 1 - 3/6 = 0.5, prompt 1: 1 - 1/6
    assert S.per_prompt(s, "pass@1").tolist() == [0.25, 0.5, 0.0]
    assert S.per_prompt(s, "pass@2").tolist() == pytest.approx([0.5, 5 / 6, 0.0])
    assert S.per_prompt(s, "pass@4").tolist() == [1.0, 1.0, 0.0]
    # UCC@4: prompt 1's two correct answers are the same text (one cluster); UCC@1 counts the first sample only
    assert S.per_prompt(s, "ucc@4").tolist() == [1.0, 1.0, 0.0]
    assert S.per_prompt(s, "ucc@1").tolist() == [1.0, 1.0, 0.0]
    assert S.per_prompt(s, "entropy").tolist() == pytest.approx([0.25, 1.0, 0.5])
    with pytest.raises(ValueError, match="k=8 exceeds the n=4"):
        S.per_prompt(s, "pass@8")
    with pytest.raises(ValueError, match="metric='accuracy'"):
        S.per_prompt(s, "accuracy")


def test_ucc_counts_distinct_correct_solutions():
    s = _samples([[1, 1, 1]], texts_by_prompt=[["seven plus zero gives 7", "7", "seven plus zero gives 7"]])
    assert S.per_prompt(s, "ucc@3").tolist() == [2.0]  # two distinct correct texts


def test_one_seed_each_is_the_paired_bootstrap_and_the_means_are_by_hand():
    rng = np.random.default_rng(3)
    a_c, b_c = rng.integers(0, 2, size=(30, 8)), rng.integers(0, 2, size=(30, 8))
    samples = {"a s0": _samples(a_c), "b s0": _samples(b_c)}
    out = S.compare_methods(samples, {"a": ["a s0"], "b": ["b s0"]}, "b", ["pass@1"], n_boot=2000)
    row = out.loc[("a", "pass@1")]
    pa, pb = a_c.mean(axis=1), b_c.mean(axis=1)
    ref = paired_bootstrap_ci(pa, pb, n_boot=2000)
    assert row["diff"] == pytest.approx(pa.mean() - pb.mean())
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ref["ci_low"], ref["ci_high"]))
    assert row["mean"] == pytest.approx(pa.mean()) and row["baseline_mean"] == pytest.approx(pb.mean())
    assert row["resolved"] == (ref["ci_low"] > 0 or ref["ci_high"] < 0)
    # one seed: the seed-pooled and the prompt-only spreads are the same draws
    assert row["se"] == pytest.approx(row["se_prompts"])


def test_two_seeds_pool_over_seeds_and_the_prompt_part_averages_them_first():
    rng = np.random.default_rng(4)
    cs = {lab: rng.integers(0, 2, size=(20, 4)) for lab in ("a0", "a1", "b0", "b1")}
    samples = {lab: _samples(c) for lab, c in cs.items()}
    out = S.compare_methods(samples, {"a": ["a0", "a1"], "b": ["b0", "b1"]}, "b", ["pass@1"], n_boot=3000)
    row = out.loc[("a", "pass@1")]
    A = np.vstack([cs["a0"].mean(1), cs["a1"].mean(1)])
    B = np.vstack([cs["b0"].mean(1), cs["b1"].mean(1)])
    ref = paired_bootstrap_ci_over_seeds(A, B, n_boot=3000)
    assert (row["diff"], row["ci_low"], row["ci_high"]) == pytest.approx((ref["diff"], ref["ci_low"], ref["ci_high"]))
    prompt_only = paired_bootstrap_ci(A.mean(0), B.mean(0), n_boot=3000)
    assert row["se_prompts"] == pytest.approx((prompt_only["ci_high"] - prompt_only["ci_low"]) / (2 * 1.959963984540054))
    assert (row["n_seeds_a"], row["n_seeds_b"], row["n_prompts"]) == (2, 2, 20)
    # the variance splits into the prompt part and the seed part; scaling both by m resolves the difference
    assert row["se"] ** 2 == pytest.approx(row["se_prompts"] ** 2 + row["se_seed"] ** 2)
    assert row["scale_needed"] == pytest.approx(((1.959964 + 0.841621) * row["se"] / abs(row["diff"])) ** 2, rel=1e-5)


def test_prompts_needed_is_the_normal_sample_size():
    # (1.96 + 0.8416)^2 = 7.849: a difference of 2 standard errors on 24 prompts needs 24 * 7.849 / 4 = 47.1 prompts
    assert S.prompts_needed(0.1, 0.05, 24) == pytest.approx(24 * (1.959964 + 0.841621) ** 2 / 4, rel=1e-5)
    assert S.prompts_needed(0.0, 0.05, 24) == float("inf")
    # with a seed part: target variance (0.1 / 2.8016)^2 = 1.274e-3; seeds take 0.03^2 = 9e-4 of it, so the prompt
    # part 0.05^2 on 24 prompts must fall to 3.74e-4: 24 * 2.5e-3 / 3.74e-4 = 160.4 prompts
    target = (0.1 / (1.959964 + 0.841621)) ** 2
    assert S.prompts_needed(0.1, 0.05, 24, se_seed=0.03) == pytest.approx(24 * 0.05 ** 2 / (target - 0.03 ** 2), rel=1e-5)
    assert S.prompts_needed(0.1, 0.05, 24, se_seed=0.04) == float("inf")  # 1.6e-3 > target: more prompts cannot do it
    # seeds: the prompt part 0.02^2 = 4e-4 stays, the seed part 0.03^2 with 2 seeds shrinks: 2 * 9e-4 / 8.74e-4
    assert S.seeds_needed(0.1, 0.02, 0.03, 2) == pytest.approx(2 * 0.03 ** 2 / (target - 0.02 ** 2), rel=1e-5)
    assert S.seeds_needed(0.1, 0.05, 0.03, 2) == float("inf")
    with pytest.raises(ValueError, match="power=0.9"):
        S.prompts_needed(0.1, 0.05, 24, power=0.9)


def test_crossings_read_the_sign_changes():
    def curve(diffs, resolved):
        return pd.DataFrame({"diff": diffs, "resolved": resolved}, index=[1, 2, 4, 8])
    curves = pd.concat({"up_then_down": curve([0.2, 0.1, -0.05, -0.1], [True, True, False, True]),
                        "noisy": curve([0.1, 0.02, -0.01, -0.02], [False, False, False, False]),
                        "above": curve([0.2, 0.1, 0.05, 0.0], [True, True, True, False])}, names=["method", "k"])
    out = S.crossings(curves)
    assert out.loc["up_then_down", "crosses"] == "yes" and out.loc["up_then_down", "below_at"] == [8]
    assert out.loc["up_then_down", "first_k_below"] == 4
    assert out.loc["noisy", "crosses"] == "not resolved"
    assert out.loc["above", "crosses"] == "no" and pd.isna(out.loc["above", "first_k_below"])


def test_recompute_study_writes_the_tables_from_a_manifest(tmp_path, capsys):
    from evaluation.recompute import main

    rng = np.random.default_rng(5)
    files = {}
    for lab in ("Initialization", "grpo seed=0", "grpo seed=1", "gspo seed=0", "gspo seed=1"):
        f = tmp_path / "samples" / lab.replace(" ", "_") / "samples.parquet"
        f.parent.mkdir(parents=True)
        _samples(rng.integers(0, 2, size=(10, 4))).to_parquet(f)
        files[lab] = f
    methods = {"grpo": ["grpo seed=0", "grpo seed=1"], "gspo": ["gspo seed=0", "gspo seed=1"]}
    man = S.write_manifest(tmp_path / "study" / "runs.json", files, methods, "grpo", "Initialization", [1, 2, 4])
    assert json.loads(man.read_text())["samples"]["grpo seed=0"] == "../samples/grpo_seed=0/samples.parquet"
    assert main(["--study", str(man), "--n-boot", "500"]) == 0
    comp = pd.read_csv(tmp_path / "study" / "recomputed" / "comparisons.csv", index_col=[0, 1])
    _, samples = S.read_manifest(man)
    direct = S.study_tables(samples, methods, "grpo", "Initialization", [1, 2, 4], n_boot=500)
    assert list(comp.index) == [("gspo", "pass@1"), ("gspo", "pass@4"), ("gspo", "ucc@4"), ("gspo", "entropy")]
    assert np.allclose(comp["ci_low"], direct["comparisons"]["ci_low"])
    curves = pd.read_csv(tmp_path / "study" / "recomputed" / "base_curves.csv", index_col=[0, 1])
    assert len(curves) == 2 * 3
    (tmp_path / "bad.json").write_text("{}")
    assert main(["--study", str(tmp_path / "bad.json")]) == 2
    assert "not a study manifest" in capsys.readouterr().err


def test_the_shown_tables_format_the_numbers_they_are_given(tmp_path, capsys):
    comp = pd.DataFrame({"mean": [0.5, 0.3, 0.3, 0.3], "baseline_mean": [0.25] * 4, "diff": [0.25, 0.05, 0.05, 0.05],
                         "ci_low": [0.1, -0.1, -0.1, -0.1], "ci_high": [0.4, 0.2, 0.2, 0.2],
                         "resolved": [True, False, False, False], "prompts_needed": [12.4, 96.2, float("inf"), float("inf")],
                         "seeds_needed": [1.0, float("inf"), 4.2, float("inf")], "scale_needed": [0.5, 4.0, 3.0, 2.5],
                         "n_prompts": [24] * 4, "n_seeds_a": [2] * 4, "n_seeds_b": [2] * 4},
                        index=pd.MultiIndex.from_tuples([("quatro", "pass@1"), ("gspo", "pass@1"), ("exppo", "pass@1"),
                                                         ("tr_grpo", "pass@1")], names=["method", "metric"]))
    shown = S.formatted(comp, "grpo")
    assert shown.loc[("quatro", "pass@1")].tolist() == ["0.5000", "0.2500", "+0.2500 [+0.1000, +0.4000]", "yes", "-", "2 vs 2"]
    assert shown.loc[("gspo", "pass@1"), "to resolve at 80% power"] == "97 prompts"
    assert shown.loc[("exppo", "pass@1"), "to resolve at 80% power"] == "5 seeds"
    # neither alone: both multiplied by 2.5 (24 prompts -> 60, 2 seeds -> 5)
    assert shown.loc[("tr_grpo", "pass@1"), "to resolve at 80% power"] == "60 prompts and 5 seeds"
    md = S.to_markdown(shown).splitlines()
    assert md[0] == ("| method | metric | method mean | grpo mean | difference [95% CI] | resolved | to resolve at 80% power "
                     "| seeds |")
    assert md[3] == "| gspo | pass@1 | 0.3000 | 0.2500 | +0.0500 [-0.1000, +0.2000] | no | 97 prompts | 2 vs 2 |"
    curves = pd.DataFrame({"mean": [0.5, 0.9], "base": [0.4, 0.95], "diff": [0.1, -0.05], "ci_low": [0.0, -0.1],
                           "ci_high": [0.2, 0.0]}, index=pd.MultiIndex.from_tuples([("grpo", 1), ("grpo", 4)], names=["method", "k"]))
    fc = S.formatted_curves(curves)
    assert fc.loc["base model"].tolist() == ["0.4000", "0.9500"]
    assert fc.loc["grpo", "pass@4"] == "0.9000 (-0.0500 [-0.1000, +0.0000])"


def test_holm_adjusts_by_hand_and_the_study_table_corrects_over_its_rows():
    """Holm-Bonferroni by hand: p = (0.01, 0.04, 0.03, 0.005), m = 4; sorted 0.005 x 4 = 0.02, 0.01 x 3 = 0.03,
    0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> running max 0.06; so adjusted (0.03, 0.06, 0.06, 0.02) and at 0.05 only the
    first and last are rejected (raw, all four are). The bootstrap p of replicates (-1, 1, 2, 3): 2 min(1/4, 3/4).
    The study table's p_holm is Holm over its rows' p-values, its family their number, and its shown column says
    so."""
    from evaluation.metrics.modes import bootstrap_p_value, holm

    adj, rej = holm([0.01, 0.04, 0.03, 0.005])
    assert np.allclose(adj, [0.03, 0.06, 0.06, 0.02]) and rej.tolist() == [True, False, False, True]
    adj, rej = holm([0.2, np.nan, 0.01])  # NaN is not a test: m = 2
    assert np.allclose(adj[[0, 2]], [0.2, 0.02]) and np.isnan(adj[1]) and rej.tolist() == [False, False, True]
    assert bootstrap_p_value([-1, 1, 2, 3]) == 0.5 and bootstrap_p_value([1, 2]) == 0.0

    rng = np.random.default_rng(3)
    samples = {lab: _samples(rng.integers(0, 2, size=(12, 4)) | (rng.random((12, 4)) < bias))
               for lab, bias in [("grpo 0", 0), ("grpo 1", 0), ("a 0", 0.6), ("a 1", 0.6), ("b 0", 0.05), ("b 1", 0.05)]}
    methods = {"grpo": ["grpo 0", "grpo 1"], "a": ["a 0", "a 1"], "b": ["b 0", "b 1"]}
    comp = S.compare_methods(samples, methods, "grpo", ["pass@1", "pass@2"], n_boot=400)
    adj, rej = holm(comp["p_value"].to_numpy())
    assert np.allclose(comp["p_holm"], adj) and comp["resolved_holm"].tolist() == rej.tolist()
    assert (comp["family"] == 4).all() and (comp["p_holm"] >= comp["p_value"]).all()
    assert comp.loc[("a", "pass@1"), "resolved"] and comp.loc[("a", "pass@1"), "resolved_holm"]
    shown = S.formatted(comp, "grpo")
    assert shown.loc[("a", "pass@1"), "Holm (4 comparisons)"].startswith("yes (p=")
