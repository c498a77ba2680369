"""Generation primitives: the tensors one sampling call returns and the response mask, shared by the samplers
(:mod:`core.sampling`) and the multi-turn agent loop (:mod:`core.agent`), which both build on them; kept apart
so that neither of those imports the other to get them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class Generation:
    """Tensors of one ``generate`` call: B = number of prompts x n samples each, prompt-major.

    prompt_ids (B, P) left-padded, prompt_mask (B, P), response_ids (B, L) right-padded,
    response_mask (B, L) 1 up to and including the first EOS, response_lengths (B,),
    finished (B,) bool (an EOS was generated), texts: decoded responses (special tokens removed).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    response_lengths: torch.Tensor
    finished: torch.Tensor
    texts: list[str]
    entropy: torch.Tensor | None = None  # (B, L) next-token entropy (nats) at the sampling temperature, when asked
    tool_calls: torch.Tensor | None = None  # (B,) tool calls per response (core.agent); response_mask then marks
                                            # the policy's tokens only, tool results (attended) are 0
    tool_tokens: torch.Tensor | None = None  # (B,) tokens of tool results in each response (mask 0, attended)
    logprobs: torch.Tensor | None = None  # (B, L) the sampler's own log-prob of each sampled token at the sampling
                                          # temperature (vLLM's processed log-probs), 0 where response_mask is 0


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, L), finished (B,)): 1 on tokens up to and including the first EOS token."""
    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for e in eos_token_ids:
        is_eos |= response_ids == e
    before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS tokens strictly before t
    return (before == 0).long(), is_eos.any(-1)
