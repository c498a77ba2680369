"""pass@k and avg@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1)."""
from __future__ import annotations

import numpy as np
import pandas as pd


def pass_at_k(n, c, k):
    """Unbiased pass@k = 1 - C(n - c, k) / C(n, k), per prompt.

    Computed in product form 1 - prod_{i=n-c+1}^{n} (1 - k/i), which never forms a binomial
    coefficient, so n = 2000 is as exact as n = 4. c = 0 gives 0; n - c < k gives 1.

    Args:
        n: samples drawn per prompt (int or int array, >= 1).
        c: correct samples among them (0 <= c <= n).
        k: the k of pass@k (1 <= k <= n).
    Returns:
        float, or float array of the broadcast shape of (n, c, k).
    Raises:
        ValueError: k > n (pass@k is undefined: never silently 1.0), k < 1, or c outside [0, n].
    """
    n_arr, c_arr, k_arr = np.broadcast_arrays(np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64), np.asarray(k, dtype=np.int64))
    if (k_arr > n_arr).any():
        bad = np.argwhere(k_arr > n_arr)[0]
        raise ValueError(f"pass@k needs k <= n, got k={int(k_arr[tuple(bad)])} with n={int(n_arr[tuple(bad)])} samples")
    if (k_arr < 1).any():
        raise ValueError(f"pass@k needs k >= 1, got k={int(k_arr.min())}")
    if (c_arr < 0).any() or (c_arr > n_arr).any():
        raise ValueError(f"number correct c must be in [0, n], got c={c_arr.ravel().tolist()} with n={n_arr.ravel().tolist()}")
    out = np.empty(n_arr.shape, dtype=np.float64)
    for idx in np.ndindex(n_arr.shape):
        nn, cc, kk = int(n_arr[idx]), int(c_arr[idx]), int(k_arr[idx])
        if cc == 0:
            out[idx] = 0.0
        elif nn - cc < kk:
            out[idx] = 1.0
        else:
            i = np.arange(nn - cc + 1, nn + 1, dtype=np.float64)
            out[idx] = 1.0 - float(np.prod(1.0 - kk / i))
    return float(out) if out.ndim == 0 else out


def passk_table(samples: pd.DataFrame, ks) -> pd.DataFrame:
    """pass@k per benchmark (mean over prompts) and avg@n, with an unweighted ``mean`` row.

    Args:
        samples: rows with columns ``benchmark``, ``prompt_id``, ``correct`` (bool).
        ks: the k values; each must be <= the smallest per-prompt sample count.
    Returns:
        DataFrame indexed by benchmark (plus ``mean``) with columns ``pass@k`` for each k and ``avg@n``.
    Raises:
        ValueError: a k larger than some prompt's number of samples.
    """
    per_prompt = samples.groupby(["benchmark", "prompt_id"])["correct"].agg(n="size", c="sum").reset_index()
    rows = {}
    for bench, grp in per_prompt.groupby("benchmark", sort=True):
        n, c = grp["n"].to_numpy(), grp["c"].to_numpy()
        row = {f"pass@{k}": float(np.mean(pass_at_k(n, c, k))) for k in ks}
        row["avg@n"] = float(np.mean(c / n))
        rows[bench] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    if len(table):
        table.loc["mean"] = table.mean(axis=0)
    return table
