"""Diversity among correct responses: pairwise similarity matrices and UCC@k.

Four similarities, each returning an (n, n) symmetric matrix with ones on the diagonal and
similarity 1 between two empty strings (0 between an empty and a non-empty one):

- ``rouge_l``: ROUGE-L F1 on word tokens, 2 LCS / (|a| + |b|) (Lin 2004), LCS by rapidfuzz;
- ``jaccard``: token-set Jaccard |A ∩ B| / |A ∪ B|, one sparse matrix product;
- ``tfidf_cosine``: cosine of TF-IDF vectors (scikit-learn), one-character tokens kept (digits and
  variables matter in math);
- ``edit``: normalised Levenshtein similarity on characters, 1 - d / max(|a|, |b|) (rapidfuzz).

Tokens are Unicode-aware (``\\w+`` runs and single non-space symbols), lowercased, so Thai or
Chinese text is tokenised too, not only [a-z0-9].

UCC@k (unique correct count): among the first k samples of a prompt, the number of connected
components of the graph that links two correct responses when their similarity reaches a threshold.
"""
from __future__ import annotations

import re

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import Indel, Levenshtein
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

METRICS = ("rouge_l", "jaccard", "tfidf_cosine", "edit")
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens (Unicode ``\\w+`` runs) and single symbols; whitespace dropped."""
    return _TOKEN.findall(text.lower())


def _empty_fix(sim: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    empty = lengths == 0
    if empty.any():
        sim[np.ix_(empty, empty)] = 1.0
        sim[np.ix_(empty, ~empty)] = 0.0
        sim[np.ix_(~empty, empty)] = 0.0
    np.fill_diagonal(sim, 1.0)
    return sim


def _rouge_l(texts):
    vocab: dict[str, int] = {}
    seqs = [[vocab.setdefault(t, len(vocab)) for t in tokenize(x)] for x in texts]
    lengths = np.array([len(s) for s in seqs])
    # Indel distance = |a| + |b| - 2 LCS, so 1 - normalized Indel distance = 2 LCS / (|a| + |b|) = ROUGE-L F1
    sim = process.cdist(seqs, seqs, scorer=Indel.normalized_similarity, dtype=np.float64, workers=-1)
    return _empty_fix(np.asarray(sim, dtype=np.float64), lengths)


def _token_matrix(texts, binary):
    from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

    cls = CountVectorizer if binary else TfidfVectorizer
    kwargs = dict(tokenizer=tokenize, lowercase=False, token_pattern=None)
    if binary:
        kwargs["binary"] = True
    try:
        return cls(**kwargs).fit_transform(texts)
    except ValueError:  # every text empty: "empty vocabulary"
        return csr_matrix((len(texts), 1))


def _jaccard(texts):
    x = _token_matrix(texts, binary=True).astype(np.float64)
    inter = (x @ x.T).toarray()
    sizes = np.asarray(x.sum(axis=1)).ravel()
    union = sizes[:, None] + sizes[None, :] - inter
    sim = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return _empty_fix(sim, sizes)


def _tfidf(texts):
    x = _token_matrix(texts, binary=False)
    sim = (x @ x.T).toarray()  # rows are L2-normalised by TfidfVectorizer
    lengths = np.asarray((x != 0).sum(axis=1)).ravel()
    return _empty_fix(np.clip(sim, 0.0, 1.0), lengths)


def _edit(texts):
    sim = process.cdist(texts, texts, scorer=Levenshtein.normalized_similarity, dtype=np.float64, workers=-1)
    return _empty_fix(np.asarray(sim, dtype=np.float64), np.array([len(t) for t in texts]))


_FNS = {"rouge_l": _rouge_l, "jaccard": _jaccard, "tfidf_cosine": _tfidf, "edit": _edit}


def pairwise_similarity(texts, metric: str) -> np.ndarray:
    """Pairwise similarity of ``texts``.

    Args:
        texts: n strings.
        metric: ``rouge_l``, ``jaccard``, ``tfidf_cosine`` or ``edit`` (see the module docstring).
    Returns:
        (n, n) float64 array in [0, 1], symmetric, ones on the diagonal.
    Raises:
        ValueError: unknown metric.
    """
    if metric not in _FNS:
        raise ValueError(f"metric={metric!r}: expected one of {list(METRICS)}")
    texts = ["" if t is None else str(t) for t in texts]
    if not texts:
        return np.zeros((0, 0))
    return _FNS[metric](texts)


def mean_pairwise_similarity(texts, metric: str) -> float | None:
    """Mean similarity over distinct pairs (i < j); None for fewer than two texts."""
    n = len(texts)
    if n < 2:
        return None
    sim = pairwise_similarity(texts, metric)
    return float(sim[np.triu_indices(n, 1)].mean())


def ucc_at_k(texts, correct, k: int, metric: str = "rouge_l", threshold: float = 0.7) -> int:
    """UCC@k: distinct correct solutions among the first k samples of one prompt.

    Two correct responses are the same solution when their ``metric`` similarity is >= ``threshold``;
    solutions are the connected components of that near-duplicate graph.

    Args:
        texts: the prompt's n responses in sample order; correct: n booleans; k <= n.
    Returns:
        int in [0, k].
    Raises:
        ValueError: k > n or k < 1, threshold outside (0, 1], unknown metric.
    """
    n = len(texts)
    if not 1 <= k <= n:
        raise ValueError(f"UCC@k needs 1 <= k <= n, got k={k} with n={n} samples")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold={threshold!r}: must be in (0, 1]")
    chosen = [t for t, c in zip(list(texts)[:k], list(correct)[:k]) if c]
    if len(chosen) <= 1:
        return len(chosen)
    adjacency = csr_matrix(pairwise_similarity(chosen, metric) >= threshold)
    n_components, _ = connected_components(adjacency, directed=False)
    return int(n_components)
