"""Teacher-forced scoring: log-probabilities and exact next-token entropies of given responses.

Used by training (old/reference log-probs, the policy loss's inputs) and by evaluation (the
entropy of each sampled response, from the full next-token distribution).
"""
from __future__ import annotations

import contextlib

import torch


def autocast(model, enabled: bool):
    """bf16 autocast on the model's device when ``enabled`` (about 2x faster on CPU), else a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


def compute_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float = 1.0,
                     with_entropy: bool = False, bf16: bool = False):
    """Log-probabilities (and optionally entropies) of response tokens under ``model``.

    The logits are divided by the sampling temperature, so that at fresh data the ratio to the
    rollout policy is exactly 1. Position ids follow the left padding, as ``generate`` does.

    Args:
        prompt_ids, prompt_mask: (B, P); response_ids, response_mask: (B, L).
        temperature: sampling temperature (> 0).
        with_entropy: also return the exact next-token entropy (nats) from the full distribution.
    Returns:
        (logprobs (B, L) float32, entropy (B, L) float32 or None). Masked positions hold garbage;
        always use them with ``response_mask``.
    """
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    # After the first EOS the response mask is 0: keep attending there is harmless, but the
    # positions must continue, as in generation (generate's attention mask is all ones there).
    attn_full = torch.cat([prompt_mask, torch.ones_like(response_mask)], dim=1)
    position_ids = (attn_full.long().cumsum(-1) - 1).clamp(min=0)
    resp_len = response_ids.shape[1]
    with autocast(model, bf16):
        out = model(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids, logits_to_keep=resp_len + 1)
    logits = out.logits[:, :-1, :].float() / float(temperature)
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = torch.gather(logp_all, -1, response_ids.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprobs, entropy
