"""The similarity suite on 256 responses of about 300 tokens: ours vs a straightforward reference.

    python -m benchmarks.similarity [--n 256] [--tokens 300] [--repeats 3]

Reference per metric (a pairwise Python loop over the n (n - 1) / 2 pairs):
- rouge_l: the ``rouge-score`` package's ``RougeScorer(['rougeL'])`` (pip install rouge-score);
- edit: ``rapidfuzz.distance.Levenshtein.normalized_similarity`` called per pair;
- jaccard: Python sets per pair;
- tfidf_cosine: per-pair cosine of the same TF-IDF rows (scikit-learn), in a Python loop.
Prints the time of each, ours and reference, and the ratio reference / ours.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from evaluation.metrics.diversity import METRICS, pairwise_similarity, tokenize

_WORDS = ("we", "have", "x", "=", "2", "so", "the", "answer", "is", "+", "3", "therefore", "sum", "of", "roots",
          "\\frac", "{", "}", "y", "equation", "gives", "4", "(", ")", "then", "by", "symmetry", "let", "n", "1")


def synthetic_responses(n: int, tokens: int, seed: int = 0) -> list[str]:
    """n math-like responses of about ``tokens`` tokens, sharing phrasing like a group of samples."""
    rng = random.Random(seed)
    base = [rng.choice(_WORDS) for _ in range(tokens)]
    out = []
    for _ in range(n):
        toks = [t if rng.random() < 0.7 else rng.choice(_WORDS) for t in base]
        out.append(" ".join(toks))
    return out


def _reference(texts, metric):
    n = len(texts)
    sim = np.eye(n)
    if metric == "rouge_l":
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rougeL"])
        for i in range(n):
            for j in range(i + 1, n):
                sim[i, j] = sim[j, i] = scorer.score(texts[i], texts[j])["rougeL"].fmeasure
    elif metric == "edit":
        from rapidfuzz.distance import Levenshtein

        for i in range(n):
            for j in range(i + 1, n):
                sim[i, j] = sim[j, i] = Levenshtein.normalized_similarity(texts[i], texts[j])
    elif metric == "jaccard":
        sets = [set(tokenize(t)) for t in texts]
        for i in range(n):
            for j in range(i + 1, n):
                sim[i, j] = sim[j, i] = len(sets[i] & sets[j]) / len(sets[i] | sets[j])
    else:
        from sklearn.feature_extraction.text import TfidfVectorizer

        x = TfidfVectorizer(tokenizer=tokenize, lowercase=False, token_pattern=None).fit_transform(texts).toarray()
        for i in range(n):
            for j in range(i + 1, n):
                sim[i, j] = sim[j, i] = float(x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j])))
    return sim


def _time(fn, repeats):
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    texts = synthetic_responses(args.n, args.tokens)
    results, total = {}, 0.0
    print(f"{args.n} responses of {args.tokens} tokens ({args.n * (args.n - 1) // 2} pairs)")
    for metric in METRICS:
        t_ours, ours = _time(lambda: pairwise_similarity(texts, metric), args.repeats)
        t_ref, ref = _time(lambda: _reference(texts, metric), 1)
        total += t_ours
        # rouge-score tokenises differently (drops symbols): compare values only where tokenisers agree
        agree = float(np.abs(ours - ref).max()) if metric != "rouge_l" else float("nan")
        results[metric] = {"ours_s": t_ours, "reference_s": t_ref, "speedup": t_ref / t_ours, "max_abs_diff": agree}
        print(f"{metric:13s} ours {t_ours:7.3f} s   reference {t_ref:8.2f} s   ratio {t_ref / t_ours:7.1f}x"
              + (f"   max |diff| {agree:.1e}" if metric != "rouge_l" else ""))
    print(f"all four metrics: {total:.3f} s per prompt of {args.n} responses")
    results["total_s"] = total
    return results


if __name__ == "__main__":
    main()
