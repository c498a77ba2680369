"""Similarity, UCC@k, answer modes, flip rates and the paired bootstrap against hand computations."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.metrics.difficulty import difficulty_bucket, flip_rates
from evaluation.metrics.diversity import METRICS, pairwise_similarity, tokenize, ucc_at_k
from evaluation.metrics.modes import paired_bootstrap_ci, paired_bootstrap_ci_over_seeds, prompt_mode_stats
from evaluation.tables import compute_tables


def test_fixed_similarity_values():
    assert pairwise_similarity(["a b c d", "a c d e"], "rouge_l")[0, 1] == pytest.approx(0.75)
    assert pairwise_similarity(["kitten", "sitting"], "edit")[0, 1] == pytest.approx(1 - 3 / 7)
    assert pairwise_similarity(["a b c", "b c d"], "jaccard")[0, 1] == pytest.approx(2 / 4)
    thai = "สวัสดีครับ นี่คือคำตอบ"
    assert tokenize(thai)  # Unicode text is tokenised
    assert pairwise_similarity([thai, thai], "rouge_l")[0, 1] == 1.0
    assert pairwise_similarity([thai, "the answer is 7"], "rouge_l")[0, 1] == 0.0
    for m in METRICS:
        assert pairwise_similarity(["", ""], m)[0, 1] == 1.0
        assert pairwise_similarity(["", "x"], m)[0, 1] == 0.0
    tf = pairwise_similarity(["x = 1", "y = 2"], "tfidf_cosine")  # one-character tokens kept
    assert 0 < tf[0, 1] < 1


def _tfidf_by_hand(a, b):
    """sklearn's smooth idf: idf = ln((1 + n) / (1 + df)) + 1, L2-normalised tf-idf, cosine."""
    docs = [tokenize(a), tokenize(b)]
    vocab = sorted(set(docs[0]) | set(docs[1]))
    idf = {t: math.log(3 / (1 + sum(t in d for d in docs))) + 1 for t in vocab}
    vecs = [np.array([d.count(t) * idf[t] for t in vocab]) for d in docs]
    return float(vecs[0] @ vecs[1] / np.linalg.norm(vecs[0]) / np.linalg.norm(vecs[1]))


def test_tfidf_matches_hand_computation():
    a, b = "x = 1 + x", "y = 2 + x"
    assert pairwise_similarity([a, b], "tfidf_cosine")[0, 1] == pytest.approx(_tfidf_by_hand(a, b), rel=1e-9)


def _lcs(a, b):
    dp = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            dp[i + 1][j + 1] = dp[i][j] + 1 if a[i] == b[j] else max(dp[i][j + 1], dp[i + 1][j])
    return dp[-1][-1]


words = st.lists(st.sampled_from(["a", "b", "c", "x", "1", "=", "+"]), max_size=8).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(words, min_size=2, max_size=5))
def test_similarity_laws_and_rouge_equals_dynamic_programming_lcs(texts):
    for m in METRICS:
        s = pairwise_similarity(texts, m)
        assert np.allclose(s, s.T) and np.allclose(np.diag(s), 1.0) and (s >= -1e-12).all() and (s <= 1 + 1e-12).all()
    s = pairwise_similarity(texts, "rouge_l")
    ta, tb = tokenize(texts[0]), tokenize(texts[1])
    if ta or tb:
        assert s[0, 1] == pytest.approx(2 * _lcs(ta, tb) / (len(ta) + len(tb)))
    j = pairwise_similarity(texts, "jaccard")
    A, B = set(ta), set(tb)
    if A or B:
        assert j[0, 1] == pytest.approx(len(A & B) / len(A | B))


def test_ucc_counts_connected_components_of_correct_responses():
    texts = ["x = 2 so the answer is 4", "x = 2 so the answer is 4 .", "by symmetry we get 4", "wrong 5", "by symmetry we get 4"]
    correct = [True, True, True, False, True]
    assert ucc_at_k(texts, correct, 5, "rouge_l", 0.7) == 2
    assert ucc_at_k(texts, correct, 2, "rouge_l", 0.7) == 1
    assert ucc_at_k(texts, correct, 5, "rouge_l", 1.0) == 3  # only exact duplicates merge
    assert ucc_at_k(texts, [False] * 5, 5) == 0
    with pytest.raises(ValueError, match="k=6"):
        ucc_at_k(texts, correct, 6)


def test_mode_stats_by_hand():
    st_ = prompt_mode_stats(["4", " 4", "x=4", "4"])  # modes {"4": 3, "x=4": 1}
    assert st_["observed_yield"] == 2
    assert st_["effective_yield"] == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))
    assert st_["disagreement"] == pytest.approx(1 - (3 * 2) / (4 * 3))
    assert prompt_mode_stats([]) == {"observed_yield": 0, "effective_yield": 0.0, "disagreement": None}
    assert prompt_mode_stats(["4"])["disagreement"] is None


def test_paired_bootstrap_uses_the_same_prompts_for_both_runs():
    a = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    ci = paired_bootstrap_ci(a, a - 0.1, n_boot=2000)
    # identical prompts shifted by 0.1: every paired replicate differs by exactly 0.1
    assert ci["diff"] == pytest.approx(0.1) and ci["ci_low"] == pytest.approx(0.1) and ci["ci_high"] == pytest.approx(0.1)
    ci = paired_bootstrap_ci(a, np.zeros(6), n_boot=4000, seed=1)
    assert ci["ci_low"] < 4 / 6 < ci["ci_high"]
    with pytest.raises(ValueError):
        paired_bootstrap_ci([1.0], [1.0, 2.0])


def _samples(correct_by_prompt, bench="b"):
    rows = []
    for p, cs in enumerate(correct_by_prompt):
        for j, c in enumerate(cs):
            rows.append({"benchmark": bench, "prompt_id": str(p), "sample_idx": j, "response": f"answer {p} {j % 2}",
                         "correct": bool(c), "extracted_answer": str(p), "mean_token_entropy": 0.5 + 0.1 * c})
    return pd.DataFrame(rows)


def test_flip_rates_by_bucket():
    assert [difficulty_bucket(c, 256) for c in (0, 7, 8, 31, 32, 127, 128, 256)] == [
        "very_hard", "very_hard", "hard", "hard", "medium", "medium", "easy", "easy"]
    assert difficulty_bucket(1, 32) == "hard"  # edges scale with n: 1/32 of the samples
    base = _samples([[0] * 32, [0] * 32, [1] * 2 + [0] * 30, [1] * 32])
    after = _samples([[1] + [0] * 31, [0] * 32, [0] * 32, [1] * 32])
    fr = flip_rates(base, after).loc["b"]
    assert fr.loc["very_hard", "n_prompts"] == 2 and fr.loc["very_hard", "solved_from_unsolved"] == 0.5
    assert fr.loc["hard", "regressed"] == 1.0 and fr.loc["easy", "improved"] == 0.0


def test_budget_k_flip_rule_by_hand():
    """Hand-made 8-sample prompts; buckets from all base samples (edges 1/32, 1/8, 1/2 of n = 8: 0.25, 1, 4
    correct, so 0 is very hard, 1-3 medium, 4-8 easy, and no count falls in the hard bucket)."""
    base = pd.concat([_samples([[0] * 8, [0, 0, 0, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0]], "a"),
                      _samples([[0, 0, 1, 1, 0, 0, 1, 1]], "b")])
    after = pd.concat([_samples([[0, 0, 0, 0, 0, 0, 0, 1], [0, 1, 0, 0, 0, 0, 0, 0], [0] * 8], "a"),
                       _samples([[1, 0, 0, 0, 0, 0, 0, 0]], "b")])
    # prompt a0: very hard (0/8); a1: medium (1/8); a2: medium (1/8); b0: easy (4/8)
    lit = flip_rates(base, after)
    assert lit.loc[("a", "very_hard"), "solved_from_unsolved"] == 1.0  # a0: 0 -> 1 correct
    assert lit.loc[("a", "medium"), "solved_from_unsolved"] == 0.0  # literal: the base solved a1, a2 at least once
    assert lit.loc[("a", "medium"), "regressed"] == 0.5  # a2: 1 -> 0 correct
    assert lit.loc[("all", "medium"), "n_prompts"] == 2 and lit.loc[("all", "easy"), "n_prompts"] == 1
    assert ("all", "hard") not in lit.index  # empty buckets are left out
    k2 = flip_rates(base, after, k=2)
    # first two samples: a0 base (0,0) after (0,0): no flip; a1 base (0,0) after (0,1): flip; a2 base (1,0) after (0,0): regress
    assert k2.loc[("a", "very_hard"), "solved_from_unsolved"] == 0.0
    assert k2.loc[("a", "medium"), "solved_from_unsolved"] == 0.5 and k2.loc[("a", "medium"), "regressed"] == 0.5
    # b0 base (0,0) after (1,0): a flip in the easy bucket, impossible under the literal rule
    assert k2.loc[("b", "easy"), "solved_from_unsolved"] == 1.0 and lit.loc[("b", "easy"), "solved_from_unsolved"] == 0.0
    assert k2.loc[("all", "easy"), "improved"] == 0.0  # improved compares all samples: 4/8 -> 1/8
    with pytest.raises(ValueError, match="flip_k=9"):
        flip_rates(base, after, k=9)
    _, metrics = compute_tables(after, [1, 2], base_samples=base, eval_cfg={"flip_k": 2})
    assert metrics["eval/b/flip/easy/solved_from_unsolved"] == 1.0 and metrics["eval/all/flip/medium/n_prompts"] == 2


def test_tables_report_the_issue_example_and_unweighted_means():
    samples = pd.concat([_samples([[1, 0, 0, 0], [1, 0, 0, 0]], "a"), _samples([[0, 0, 0, 0]], "b")])
    tables, metrics = compute_tables(samples, [1, 2, 4])
    assert metrics["eval/a/avg_at_4"] == 0.25 and metrics["eval/a/pass_at_4"] == 1.0
    assert metrics["eval/mean/pass_at_4"] == 0.5
    assert metrics["eval/a/entropy"] == pytest.approx((0.6 + 0.5 * 3) / 4)
    assert metrics["eval/a/ucc_at_4"] == 1.0 and metrics["eval/a/coverage_at_4"] == 1.0
    assert "eval/a/observed_yield" in metrics and set(tables) >= {"passk", "ucc", "similarity", "entropy", "modes"}


def test_verifier_disagreement_audit_by_hand():
    """a: 8 samples, verdicts differ on 2 (one each way) -> 0.25; b: 4 samples, 1 suite-only -> 0.25 and
    0.25/0; c (no reference verdicts: another task kind) is left out; mean = unweighted over a and b."""
    a = _samples([[1, 1, 0, 0], [1, 0, 1, 0]], "a").assign(reference_correct=[1, 1, 0, 0, 0, 0, 1, 1])
    b = _samples([[1, 1, 0, 0]], "b").assign(reference_correct=[0, 1, 0, 0])
    c = _samples([[1, 0]], "c").assign(reference_correct=None)
    samples = pd.concat([a, b, c], ignore_index=True)
    samples["reference_correct"] = samples["reference_correct"].astype("boolean")
    tables, metrics = compute_tables(samples, [1, 2])
    assert metrics["eval/a/verifier_disagreement"] == 0.25 and metrics["eval/b/verifier_disagreement"] == 0.25
    assert metrics["eval/a/verifier_only_suite"] == 0.125 and metrics["eval/a/verifier_only_math_verify"] == 0.125
    assert metrics["eval/b/verifier_only_suite"] == 0.25 and metrics["eval/b/verifier_only_math_verify"] == 0.0
    assert metrics["eval/mean/verifier_disagreement"] == 0.25 and "eval/c/verifier_disagreement" not in metrics
    listing = tables["verifier_disagreements"]
    assert list(zip(listing["benchmark"], listing["prompt_id"], listing["sample_idx"])) == [
        ("a", "1", 0), ("a", "1", 3), ("b", "0", 0)]
    assert list(listing["correct"]) == [True, False, True] and list(listing["reference_correct"]) == [False, True, False]
    # samples without any reference verdict (older tables, other tasks): no audit tables, no metrics
    tables, metrics = compute_tables(c, [1])
    assert "verifier" not in tables and not any("verifier" in k for k in metrics)


def test_modes_are_answers_the_verifier_calls_equal():
    """\\frac{1}{2} and x=\\frac{1}{2} are the two correct answers of one prompt: one mode (observed yield 1,
    D = 0), where string modes would count two (yield 2, D = 1 - 2/6 = 2/3 for counts 2 and 2)."""
    from core.tasks import get_task

    same = get_task("math500").same_answer
    assert same("\\frac{1}{2}", "x=\\frac{1}{2}") and same("0.5", "\\frac{1}{2}") and not same("\\frac{1}{2}", "2")
    samples = pd.DataFrame({"benchmark": "math500", "prompt_id": "0", "sample_idx": range(5),
                            "response": ["r"] * 5, "correct": [True, True, True, True, False],
                            "extracted_answer": ["\\frac{1}{2}", "x=\\frac{1}{2}", "\\frac{1}{2}", "x = \\frac{1}{2}", "3"],
                            "mean_token_entropy": 0.5})
    _, metrics = compute_tables(samples, [1], same_answer={"math500": same})
    assert metrics["eval/math500/observed_yield"] == 1 and metrics["eval/math500/disagreement"] == 0.0
    assert metrics["eval/math500/effective_yield"] == 1.0
    _, strings = compute_tables(samples, [1])
    assert strings["eval/math500/observed_yield"] == 2 and strings["eval/math500/disagreement"] == pytest.approx(2 / 3)


def test_disagreement_on_the_shared_set_by_hand():
    """Run A: p0 answers a, a, b (D = 1 - 2/6 = 2/3), p1 a, a (D = 0), p2 one correct (not shared).
    Baseline B: p0 a, a, a (D = 0), p1 a, b (D = 1), p2 a, b (D = 1; not shared: A has one correct).
    Shared = {p0, p1}: D_A = 1/3, D_B = 1/2, Delta-D = -1/6; the CI is the paired bootstrap of [2/3, 0] vs [0, 1]."""
    from evaluation.metrics.modes import paired_bootstrap_ci, shared_set_disagreement

    def table(prompts):
        rows = [{"benchmark": "b", "prompt_id": pid, "correct": ans is not None, "extracted_answer": ans}
                for pid, answers in prompts.items() for ans in answers]
        return pd.DataFrame(rows)

    a = table({"p0": ["a", "a", "b"], "p1": ["a", "a", None], "p2": ["a", None, None]})
    b = table({"p0": ["a", "a", "a"], "p1": ["a", "b", None], "p2": ["a", "b", None]})
    got = shared_set_disagreement({"A": a, "B": b}, baseline="B", n_boot=2000, seed=1)
    assert got.loc["A", "n_shared"] == 2 and got.loc["A", "D"] == pytest.approx(1 / 3)
    assert got.loc["B", "D"] == pytest.approx(0.5) and got.loc["A", "delta_D"] == pytest.approx(-1 / 6)
    ci = paired_bootstrap_ci([2 / 3, 0.0], [0.0, 1.0], n_boot=2000, seed=1)
    assert (got.loc["A", "ci_low"], got.loc["A", "ci_high"]) == (pytest.approx(ci["ci_low"]), pytest.approx(ci["ci_high"]))
    assert got.loc["B", "delta_D"] == 0.0
    with pytest.raises(KeyError, match="baseline 'C'"):
        shared_set_disagreement({"A": a, "B": b}, baseline="C")


def test_the_seed_pooled_bootstrap_is_the_paired_one_with_one_seed_and_carries_the_seed_spread():
    rng = np.random.default_rng(3)
    a, b = rng.random(12), rng.random(12)
    one = paired_bootstrap_ci_over_seeds(a[None], b[None], n_boot=3000, seed=5)
    ref = paired_bootstrap_ci(a, b, n_boot=3000, seed=5)  # the same prompt draws: the same interval, to the bit
    assert (one["diff"], one["ci_low"], one["ci_high"]) == (ref["diff"], ref["ci_low"], ref["ci_high"])
    # by hand: seeds offset by +0.1 and +0.3 on every prompt against b itself; the prompt draws cancel, a
    # replicate's difference is the mean of two seeds drawn with replacement: 0.1 (p 1/4), 0.2 (1/2), 0.3 (1/4),
    # so the 95% interval is [0.1, 0.3] around 0.2, where averaging the seeds first would give [0.2, 0.2]
    two = paired_bootstrap_ci_over_seeds(np.stack([b + 0.1, b + 0.3]), b[None], n_boot=4000, seed=0)
    assert two["diff"] == pytest.approx(0.2) and two["n_seeds_a"] == 2 and two["n_prompts"] == 12
    assert two["ci_low"] == pytest.approx(0.1) and two["ci_high"] == pytest.approx(0.3)
    flat = paired_bootstrap_ci(np.stack([b + 0.1, b + 0.3]).mean(0), b, n_boot=4000)
    assert flat["ci_high"] - flat["ci_low"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="same non-empty prompts"):
        paired_bootstrap_ci_over_seeds(np.zeros((2, 3)), np.zeros((2, 4)))
