"""How far two samples tables can be compared prompt by prompt (flip rates, paired differences): the prompts they
share and the protocol differences the samples show."""
from __future__ import annotations

import pandas as pd


def protocol_differences(samples: pd.DataFrame, base: pd.DataFrame) -> tuple[list[str], int, int]:
    """How far two samples tables can be compared prompt by prompt (flip rates, paired differences), read from the
    samples themselves (a file carries no config): the prompts they share, and the protocol differences the samples
    show: the samples per prompt, the response-length cap (the longest response that stopped for length, against
    the other's longest response), and the rendered prompt of a shared prompt (another template).

    Args:
        samples, base: samples tables (``benchmark``, ``prompt_id``, ``prompt``, ``n_tokens``, ``finish_reason``).
    Returns:
        (differences, one line each; the number of prompts both have; the number of prompts ``samples`` has).
    """
    key = ["benchmark", "prompt_id"]
    a, b = samples.groupby(key).size(), base.groupby(key).size()
    shared = a.index.intersection(b.index)
    out = []
    if len(shared):
        na, nb = sorted(set(a[shared])), sorted(set(b[shared]))
        if na != nb:
            out.append(f"samples per prompt {'/'.join(map(str, na))} against the base's {'/'.join(map(str, nb))}")

        def cap(t):
            cut = t[t["finish_reason"].astype(str) == "length"]["n_tokens"] if "finish_reason" in t else []
            return (int(max(cut)) if len(cut) else None), int(t["n_tokens"].max()) if "n_tokens" in t and len(t) else 0

        (ca, la), (cb, lb) = cap(samples), cap(base)
        if (ca is not None and (lb > ca or (cb is not None and cb != ca))) or (cb is not None and la > cb):
            out.append(f"responses cut at {ca if ca is not None else f'more than {la}'} tokens against the base's "
                       f"{cb if cb is not None else f'more than {lb}'} (a different max_new_tokens: truncation alone "
                       "turns correct answers wrong)")
        if "prompt" in samples and "prompt" in base:
            pa = samples.drop_duplicates(key).set_index(key)["prompt"]
            pb = base.drop_duplicates(key).set_index(key)["prompt"]
            differ = int((pa[shared].astype(str) != pb[shared].astype(str)).sum())
            if differ:
                out.append(f"{differ} of the {len(shared)} shared prompts are rendered differently (another template)")
    return out, len(shared), len(a)
