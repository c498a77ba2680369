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


CHUNK_TOKENS = 128  # response positions per output-head call in training's log-prob pass


def _separable(model) -> bool:
    """Whether the decoder trunk (``base_model``) and output head (``get_output_embeddings``) can be called apart."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    trunk = getattr(model, "base_model", None)
    return head is not None and trunk is not None and trunk is not model and \
        getattr(getattr(model, "config", None), "logit_scale", None) is None


def _head_chunk(head, softcap, temperature: float, with_entropy: bool, hidden, targets):
    """Log-probs of ``targets`` (and entropies) from the hidden states of one chunk: (b, c) float32 each."""
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / float(softcap)) * float(softcap)
    logp = torch.log_softmax(logits / float(temperature), dim=-1)
    lp = torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return lp, torch.zeros_like(lp)
    return lp, -(logp.exp() * logp).sum(-1)


def _shared_prompt_hidden(trunk, prompt_ids, prompt_mask, response_ids, attn_full, position_ids):
    """Hidden states (B, L, H) at the positions that predict each response token, the decoder run once per
    distinct prompt row: the distinct prompts (U, P) with a key/value cache, the cache expanded to the B rows
    (an index, so gradients reach the shared prompt activations from every response), then the responses
    (B, L) on top of it. None when it does not apply (no repeated prompt, gradient checkpointing in training,
    a cache other than a plain dynamic key/value cache); the caller then runs every row whole."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if getattr(trunk, "gradient_checkpointing", False) and trunk.training:
        return None
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == key.shape[0]:
        return None
    P = prompt_ids.shape[1]
    first = torch.zeros(uniq.shape[0], dtype=torch.long, device=inverse.device)
    first.scatter_(0, inverse, torch.arange(inverse.numel(), device=inverse.device))  # one row per distinct prompt
    out = trunk(input_ids=prompt_ids[first], attention_mask=prompt_mask[first], position_ids=position_ids[first, :P],
                use_cache=True)
    cache = out.past_key_values
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    cache.batch_select_indices(inverse)
    L = response_ids.shape[1]
    resp_hidden = trunk(input_ids=response_ids, attention_mask=attn_full, position_ids=position_ids[:, P:],
                        past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(P, P + L, device=response_ids.device)).last_hidden_state
    return torch.cat([out.last_hidden_state[inverse, P - 1:P], resp_hidden[:, :L - 1]], dim=1)


def compute_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float = 1.0,
                     with_entropy: bool = False, bf16: bool = False, chunk_tokens: int | None = CHUNK_TOKENS,
                     share_prompts: bool = True):
    """Log-probabilities (and optionally entropies) of response tokens under ``model``.

    The logits are divided by the sampling temperature, so that at fresh data the ratio to the
    rollout policy is exactly 1. Position ids follow the left padding, as ``generate`` does.

    Memory: the decoder runs once; the output head runs over at most ``chunk_tokens`` response positions at a
    time, and with gradients each chunk is checkpointed (its float32 logits are recomputed in the backward pass),
    so the full (B, L, vocab) logits never exist: for SmolLM2 (49k vocabulary) at B=32, L=48 that is 300 MB of
    logits plus as much again for the log-softmax, per pass. ``chunk_tokens=None`` (or a model whose trunk and
    head cannot be separated) takes the one-call path with ``logits_to_keep``.

    Args:
        prompt_ids, prompt_mask: (B, P); response_ids, response_mask: (B, L).
        temperature: sampling temperature (> 0).
        with_entropy: also return the exact next-token entropy (nats) from the full distribution.
        bf16: bf16 autocast for the decoder and head (their outputs are cast to float32 before the softmax).
        chunk_tokens: response positions per output-head call (None: all at once).
        share_prompts: run each distinct prompt row through the decoder once and continue every response from
            its key/value cache (gradients flow through the cache), instead of once per response: a group of
            G responses to one prompt costs one prompt pass, not G (for the default job, 43 prompt tokens and
            at most 48 response tokens, about 40% of the decoder's work). Numerically the same computation up
            to float rounding (tested against ``share_prompts=False``). Taken on the separable path when the
            batch repeats a prompt, the model's cache is a plain key/value cache and gradient checkpointing is
            off (it disables the cache in training); otherwise every row runs whole.
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
    if chunk_tokens is None or not _separable(model):
        with autocast(model, bf16):
            out = model(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids, logits_to_keep=resp_len + 1)
        logits = out.logits[:, :-1, :].float() / float(temperature)
        logp_all = torch.log_softmax(logits, dim=-1)
        logprobs = torch.gather(logp_all, -1, response_ids.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logprobs, entropy
    head, trunk = model.get_output_embeddings(), model.base_model
    softcap = getattr(model.config, "final_logit_softcapping", None)
    P = prompt_ids.shape[1]
    with autocast(model, bf16):
        hidden = _shared_prompt_hidden(trunk, prompt_ids, prompt_mask, response_ids, attn_full, position_ids) \
            if share_prompts else None
        if hidden is None:
            hidden = trunk(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids).last_hidden_state
            hidden = hidden[:, P - 1:P - 1 + resp_len]  # the position before each response token predicts it
        lps, ents = [], []
        for a in range(0, resp_len, int(chunk_tokens)):
            args = (head, softcap, float(temperature), with_entropy, hidden[:, a:a + int(chunk_tokens)],
                    response_ids[:, a:a + int(chunk_tokens)])
            if torch.is_grad_enabled() and hidden.requires_grad:
                from torch.utils.checkpoint import checkpoint

                lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
            else:
                lp, ent = _head_chunk(*args)
            lps.append(lp)
            ents.append(ent)
    logprobs = torch.cat(lps, dim=1)
    return logprobs, (torch.cat(ents, dim=1) if with_entropy else None)


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
    return compute_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature, with_entropy=True,
                            chunk_tokens=chunk_tokens)[1]


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
