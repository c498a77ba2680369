"""Per-token probabilities of the sampled tokens over a whole training run: how often each vocabulary token was
sampled and its mean probability under the rollout policy when it was.

TR-GRPO's Fig. 1 ranks the most frequent tokens of the rollouts by their mean probability, the quantity its token
weights are a function of. The local engine accumulates these counts every step
(:class:`TokenProbs`), keeps them in its resumable state, and writes ``token_probs.csv`` at the end of training
(logged to the run); the report's ``trgrpo_tokens`` section (reports/sections/paper.py) shows the table.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

ARTIFACT = "token_probs.csv"


class TokenProbs:
    """Running per-token-id counts and probability sums over sampled response tokens.

    ``counts[v]``: how many response tokens equal ``v``; ``prob_sums[v]``: the sum of ``exp(logprob)`` over them,
    so ``prob_sums / counts`` is the mean probability of token ``v`` when sampled (float64, on the CPU).
    """

    def __init__(self):
        self.counts = torch.zeros(0, dtype=torch.float64)
        self.prob_sums = torch.zeros(0, dtype=torch.float64)

    def update(self, token_ids: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor) -> None:
        """Add one batch of responses.

        Args:
            token_ids: (B, L) sampled token ids.
            logprobs: (B, L) log pi(y_t) of those tokens (natural log; the policy at sampling time).
            mask: (B, L) 1 on response tokens, 0 on padding (and on tool results the policy did not write).
        Raises:
            ValueError: the three shapes differ.
        """
        if not (token_ids.shape == logprobs.shape == mask.shape):
            raise ValueError(f"token_ids {tuple(token_ids.shape)}, logprobs {tuple(logprobs.shape)} and mask "
                             f"{tuple(mask.shape)} must have the same shape")
        keep = mask.detach().bool().cpu()
        if not keep.any():
            return
        ids = token_ids.detach().cpu()[keep].long()
        p = logprobs.detach().float().cpu()[keep].double().exp()
        size = max(int(ids.max()) + 1, len(self.counts))
        self.counts = _grow(self.counts, size) + torch.bincount(ids, minlength=size).double()
        self.prob_sums = _grow(self.prob_sums, size) + torch.bincount(ids, weights=p, minlength=size)

    def state_dict(self) -> dict:
        """The running sums (saved with the training state, so a resumed run keeps the earlier steps')."""
        return {"counts": self.counts.clone(), "prob_sums": self.prob_sums.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.counts = state["counts"].detach().cpu().double().clone()
        self.prob_sums = state["prob_sums"].detach().cpu().double().clone()

    def table(self, tokenizer=None, top: int = 200) -> pd.DataFrame:
        """The ``top`` most frequent tokens: columns ``token_id``, ``token`` (decoded; empty without a
        tokenizer), ``count``, ``share`` (of all response tokens), ``mean_prob``; rows by count, descending (ties:
        the lower id first)."""
        nz = torch.nonzero(self.counts > 0).squeeze(-1)
        if not len(nz):
            return pd.DataFrame(columns=["token_id", "token", "count", "share", "mean_prob"])
        counts = self.counts[nz]
        order = sorted(range(len(nz)), key=lambda i: (-float(counts[i]), int(nz[i])))[:top]
        ids = [int(nz[i]) for i in order]
        total = float(self.counts.sum())
        return pd.DataFrame({
            "token_id": ids,
            "token": [tokenizer.decode([i]) if tokenizer is not None else "" for i in ids],
            "count": [int(self.counts[i]) for i in ids],
            "share": [float(self.counts[i]) / total for i in ids],
            "mean_prob": [float(self.prob_sums[i] / self.counts[i]) for i in ids],
        })

    def write(self, path: Path, tokenizer=None, top: int = 200) -> Path:
        """Write :meth:`table` as CSV to ``path``; returns ``path``."""
        path = Path(path)
        self.table(tokenizer, top).to_csv(path, index=False)
        return path


def _grow(t: torch.Tensor, size: int) -> torch.Tensor:
    return t if len(t) >= size else torch.cat([t, torch.zeros(size - len(t), dtype=t.dtype)])
