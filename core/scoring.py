"""Teacher-forced scoring: log-probabilities and exact next-token entropies of given responses.

Used by training (old/reference log-probs, the policy loss's inputs) and by evaluation (the
entropy of each sampled response, from the full next-token distribution). Every sampler fills
``mean_token_entropy`` through :func:`mean_token_entropies`, which never materialises the whole
(B, L, vocab) logits: the decoder runs once, the output head in chunks of positions.
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


def _left_right_pad(prompts, responses, pad_id: int, device):
    b = len(prompts)
    P = max(1, max(len(p) for p in prompts))
    L = max(1, max(len(r) for r in responses))
    prompt_ids = torch.full((b, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, P), dtype=torch.long)
    response_ids = torch.full((b, L), pad_id, dtype=torch.long)
    response_mask = torch.zeros((b, L), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if len(p):
            prompt_ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            prompt_mask[i, P - len(p):] = 1
        if len(r):
            response_ids[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
            response_mask[i, :len(r)] = 1
    return [t.to(device) for t in (prompt_ids, prompt_mask, response_ids, response_mask)]


@torch.no_grad()
def token_entropies(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float = 1.0,
                    chunk_tokens: int = 512) -> torch.Tensor:
    """Exact next-token entropy (nats) at every response position, the output head applied in chunks.

    Same inputs and the same numbers as ``compute_logprobs(..., with_entropy=True)[1]``, but the logits of
    at most ``B x chunk_tokens`` positions exist at once (a 3,072-token response with a 152k vocabulary
    would otherwise need 1.9 GB of float32 logits per row). Models whose decoder trunk and output head
    cannot be separated (no ``base_model`` / ``get_output_embeddings``) take the full-logits path.

    Args:
        prompt_ids, prompt_mask: (B, P) left-padded; response_ids, response_mask: (B, L) right-padded.
        temperature: the sampling temperature (> 0): entropy of softmax(logits / T).
        chunk_tokens: response positions per output-head call.
    Returns:
        (B, L) float32 entropies; masked positions hold garbage (use with ``response_mask``).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    trunk = getattr(model, "base_model", None)
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if head is None or trunk is None or trunk is model or getattr(model.config, "logit_scale", None) is not None:
        return compute_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, with_entropy=True)[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn_full = torch.cat([prompt_mask, torch.ones_like(response_mask)], dim=1)
    position_ids = (attn_full.long().cumsum(-1) - 1).clamp(min=0)
    hidden = trunk(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids).last_hidden_state
    P, L = prompt_ids.shape[1], response_ids.shape[1]
    hidden = hidden[:, P - 1:P - 1 + L]  # the position before each response token predicts it
    out = torch.empty(hidden.shape[:2], dtype=torch.float32, device=hidden.device)
    for a in range(0, L, int(chunk_tokens)):
        logits = head(hidden[:, a:a + int(chunk_tokens)]).float()
        if softcap:
            logits = torch.tanh(logits / float(softcap)) * float(softcap)
        logp = torch.log_softmax(logits / float(temperature), dim=-1)
        out[:, a:a + int(chunk_tokens)] = -(logp.exp() * logp).sum(-1)
    return out


@torch.no_grad()
def mean_token_entropies(model, prompts, responses, temperature: float = 1.0, pad_id: int = 0, rows: int = 16,
                         chunk_tokens: int = 512) -> list[float]:
    """Mean next-token entropy (nats) of each response under ``model`` at ``temperature``: exact, from the
    full distribution, by a teacher-forced pass (the method every sampler's entropy column uses).

    Args:
        prompts: token ids of each prompt (lists of ints, as fed to the sampler, special tokens included).
        responses: token ids of each response (the EOS token included when one was generated).
        pad_id: any valid token id (padding is masked out).
        rows: responses per forward pass (sorted by length to waste little padding);
        chunk_tokens: see :func:`token_entropies`.
    Returns:
        One float per response, in input order (0.0 for an empty response).
    """
    device = next(model.parameters()).device
    out = [0.0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    for a in range(0, len(order), int(rows)):
        idx = order[a:a + int(rows)]
        p_ids, p_mask, r_ids, r_mask = _left_right_pad([prompts[i] for i in idx], [responses[i] for i in idx], pad_id, device)
        ent = token_entropies(model, p_ids, p_mask, r_ids, r_mask, temperature, chunk_tokens)
        m = r_mask.to(ent.dtype)
        means = ((ent * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
        for i, v in zip(idx, means):
            out[i] = float(v)
    return out
