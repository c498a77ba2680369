"""Teacher-forced scoring: log-probabilities and exact next-token entropies of given responses.

Used by training (old/reference log-probs, the policy loss's inputs) and by evaluation (the
entropy of each sampled response, from the full next-token distribution). Every sampler fills
``mean_token_entropy`` through :func:`mean_token_entropies`, which never materialises the whole
(B, L, vocab) logits: the decoder runs once, the output head in chunks of positions.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch


def autocast(model, enabled: bool):
    """bf16 autocast on the model's device when ``enabled`` (about 2x faster on CPU), else a no-op."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


HEAD_TOKENS = 1024  # response tokens per output-head call (their float32 logits and log-softmax exist at once)


class Sequences(NamedTuple):
    """A batch's teacher-forced sequences: ``prompt_ids``, ``prompt_mask`` (B, P) left-padded and ``response_ids``,
    ``response_mask`` (B, L) right-padded, the four tensors every scoring pass reads together."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor

    @classmethod
    def of(cls, batch) -> "Sequences":
        """The sequences of anything with the four fields (a :class:`training.batch.RolloutBatch`, a generation)."""
        return cls(batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
CHUNK_TOKENS = HEAD_TOKENS  # the name earlier callers used


def _separable(model) -> bool:
    """Whether the decoder trunk (``base_model``) and output head (``get_output_embeddings``) can be called apart."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    trunk = getattr(model, "base_model", None)
    return head is not None and trunk is not None and trunk is not model and \
        getattr(getattr(model, "config", None), "logit_scale", None) is None


def _head_chunk(head, softcap, temperature: float, with_entropy: bool, hidden, targets):
    """Log-probs of ``targets`` (and entropies) from the hidden states of one chunk: (..., ) float32 each (float64
    for a float64 model)."""
    logits = _upcast(head(hidden))
    if softcap:
        logits = torch.tanh(logits / float(softcap)) * float(softcap)
    logp = torch.log_softmax(logits if float(temperature) == 1.0 else logits / float(temperature), dim=-1)
    lp = torch.gather(logp, -1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return lp, torch.zeros_like(lp)
    return lp, -(logp.exp() * logp).sum(-1)


def _upcast(x):
    """float32 unless already float32 or float64 (bf16 and half logits are upcast before the softmax)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


#: below this many bytes of float32 logits (and as many again for their log-softmax) for a whole pass, the output
#: head keeps them for the backward pass instead of recomputing them (checkpointing costs one more head forward:
#: a fifth of SmolLM2's work per token)
HEAD_KEEP_BYTES = 256 << 20


def _head(model, hidden, targets, temperature: float, with_entropy: bool, head_tokens: int | None):
    """The output head over (N, H) hidden states in chunks of ``head_tokens`` (when gradients flow and the pass's
    logits exceed :data:`HEAD_KEEP_BYTES`, each chunk is checkpointed: its float32 logits are recomputed in the
    backward pass): (log-probs (N,), entropies (N,))."""
    head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    n = hidden.shape[0]
    step = max(1, int(head_tokens)) if head_tokens else max(n, 1)
    keep = n * int(getattr(model.config, "vocab_size", 0) or 0) * 8 <= HEAD_KEEP_BYTES
    lps, ents = [], []
    for a in range(0, n, step):
        args = (head, softcap, float(temperature), with_entropy, hidden[a:a + step], targets[a:a + step])
        if torch.is_grad_enabled() and hidden.requires_grad and not keep:
            from torch.utils.checkpoint import checkpoint

            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        z = _upcast(hidden.new_zeros(0))
        return z, z
    return torch.cat(lps), torch.cat(ents)


def _scatter(values, rows, cols, shape):
    """A (b, L) tensor holding ``values`` at (rows, cols), zeros elsewhere (differentiable)."""
    out = values.new_zeros(shape)
    return out.index_put((rows, cols), values)


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


def compute_logprobs(model, seqs: Sequences, temperature: float = 1.0, with_entropy: bool = False, bf16: bool = False,
                     chunk_tokens: int | None = HEAD_TOKENS, share_prompts: bool = True):
    """Log-probabilities (and optionally entropies) of response tokens under ``model``, all rows in one pass (the
    ``padded`` layout; :class:`Scorer` splits a batch into passes under a token budget).

    The logits are divided by the sampling temperature, so that at fresh data the ratio to the
    rollout policy is exactly 1. Position ids follow the left padding, as ``generate`` does.

    Memory: the decoder runs once; the output head runs only on the positions ``response_mask`` keeps, at most
    ``chunk_tokens`` of them per call, and with gradients each chunk is checkpointed (its float32 logits are
    recomputed in the backward pass), so the full (B, L, vocab) logits never exist: for SmolLM2 (49k vocabulary) at
    B=32, L=48 that would be 300 MB of logits plus as much again for the log-softmax, per pass.
    ``chunk_tokens=None`` (or a model whose trunk and head cannot be separated) takes the one-call path with
    ``logits_to_keep``.

    Args:
        seqs: :class:`Sequences`: prompt_ids, prompt_mask (B, P); response_ids, response_mask (B, L).
        temperature: sampling temperature (> 0).
        with_entropy: also return the exact next-token entropy (nats) from the full distribution.
        bf16: bf16 autocast for the decoder and head (their outputs are cast to float32 before the softmax).
        chunk_tokens: response tokens per output-head call (None: all at once).
        share_prompts: run each distinct prompt row through the decoder once and continue every response from
            its key/value cache (gradients flow through the cache), instead of once per response: a group of
            G responses to one prompt costs one prompt pass, not G (for the default job, 43 prompt tokens and
            at most 48 response tokens, about 40% of the decoder's work). Numerically the same computation up
            to float rounding (tested against ``share_prompts=False``). Taken on the separable path when the
            batch repeats a prompt, the model's cache is a plain key/value cache and gradient checkpointing is
            off (it disables the cache in training); otherwise every row runs whole.
    Returns:
        (logprobs (B, L) float32, entropy (B, L) float32 or None). Masked positions hold garbage (zeros on the
        separable path); always use them with ``response_mask``.
    """
    prompt_ids, prompt_mask, response_ids, response_mask = seqs
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    # After the first EOS the response mask is 0: keep attending there is harmless, but the
    # positions must continue, as in generation (generate's attention mask is all ones there).
    attn_full = torch.cat([prompt_mask, torch.ones_like(response_mask)], dim=1)
    position_ids = (attn_full.long().cumsum(-1) - 1).clamp(min=0)
    resp_len = response_ids.shape[1]
    if chunk_tokens is None or not _separable(model):
        with autocast(model, bf16):
            out = model(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids, logits_to_keep=resp_len + 1)
        logits = _upcast(out.logits[:, :-1, :]) / float(temperature)
        logp_all = torch.log_softmax(logits, dim=-1)
        logprobs = torch.gather(logp_all, -1, response_ids.unsqueeze(-1)).squeeze(-1)
        entropy = None
        if with_entropy:
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logprobs, entropy
    trunk = model.base_model
    P = prompt_ids.shape[1]
    with autocast(model, bf16):
        hidden = _shared_prompt_hidden(trunk, prompt_ids, prompt_mask, response_ids, attn_full, position_ids) \
            if share_prompts else None
        if hidden is None:
            hidden = trunk(input_ids=input_ids, attention_mask=attn_full, position_ids=position_ids).last_hidden_state
            hidden = hidden[:, P - 1:P - 1 + resp_len]  # the position before each response token predicts it
        rows, cols = torch.nonzero(response_mask, as_tuple=True)
        lp, ent = _head(model, hidden[rows, cols], response_ids[rows, cols], temperature, with_entropy, chunk_tokens)
    shape = tuple(response_ids.shape)
    return _scatter(lp, rows, cols, shape), (_scatter(ent, rows, cols, shape) if with_entropy else None)


def packed_logprobs(model, mb, seqs: Sequences, temperature: float = 1.0, with_entropy: bool = False,
                    bf16: bool = False, head_tokens: int | None = HEAD_TOKENS, pad_id: int = 0):
    """Log-probs (and entropies) of the rows of a ``packed`` or ``tree`` micro-batch (:func:`core.packing.plan`),
    the decoder run once over its packed rows (no key/value cache, so nothing attends across sequences but what the
    layout allows; :func:`core.packing.packed_inputs`).

    Args:
        mb: a :class:`core.packing.MicroBatch` of the batch ``seqs``.
        seqs: :class:`Sequences` of the whole batch (``mb.rows`` picks the rows): prompt_ids, prompt_mask (B, P)
            left-padded; response_ids, response_mask (B, L) right-padded.
    Returns:
        (logprobs (b, L), entropy (b, L) or None), float32, row k for batch row ``mb.rows[k]``; zeros where the
        response mask is 0 past the response's last kept token.
    """
    from .packing import packed_inputs

    trunk = model.base_model
    mask_dtype = torch.bfloat16 if bf16 else next(model.parameters()).dtype  # the attention's query dtype
    x = packed_inputs(mb, *seqs, pad_id, mask_dtype)
    response_ids = seqs.response_ids
    with autocast(model, bf16):
        hidden = trunk(input_ids=x.input_ids, attention_mask=x.attention_mask, position_ids=x.position_ids,
                       use_cache=False).last_hidden_state
        lp, ent = _head(model, hidden[x.src_row, x.src_col], x.targets, temperature, with_entropy, head_tokens)
    shape = (len(mb.rows), response_ids.shape[1])
    return _scatter(lp, x.dst_row, x.dst_col, shape), (_scatter(ent, x.dst_row, x.dst_col, shape) if with_entropy
                                                         else None)


class Scorer:
    """How a run teacher-forces batches through a model: at most ``budget`` positions per pass, in ``layout``.

    Every pass that scores responses goes through one: the trainer's old-log-prob, reference and entropy passes and
    its update's forward passes (:mod:`training.update`), and the evaluation's teacher-forced entropies.

    Args:
        budget: positions per forward (and backward) pass, padding included (``train.micro_batch_tokens``);
            None: the whole batch in one pass.
        layout: ``padded``, ``packed`` or ``tree`` (:mod:`core.packing`); check it with :func:`choose_layout`
            before using a packed one on a model.
        row_tokens: width of a packed or tree row (raised to the longest sequence).
        head_tokens: response tokens per output-head call.
        pad_id: a valid token id for padding.
    """

    def __init__(self, budget: int | None = None, layout: str = "padded", row_tokens: int | None = None,
                 head_tokens: int | None = HEAD_TOKENS, pad_id: int = 0):
        from .packing import ATTENTION_WIDTH, LAYOUTS, ROW_TOKENS

        if layout not in LAYOUTS:
            raise ValueError(f"layout={layout!r}: expected one of {list(LAYOUTS)}")
        self.budget = None if budget is None else int(budget)
        self.layout, self.row_tokens = layout, int(row_tokens or ROW_TOKENS)
        self.head_tokens, self.pad_id = head_tokens, int(pad_id)
        self.rollout_budget: int | None = self.budget  # a transformers rollout's key/value cache (the engine sets it)
        self.attention_width: float = ATTENTION_WIDTH  # core.packing.balanced_rows (for_model: 6 x the hidden size)

    def for_model(self, model) -> "Scorer":
        """This scorer with its row-width cost set for ``model`` (attention per token equals the rest of a token's
        work at about 6 x the hidden size: 24 h^2 per layer for the projections and the MLP against 4 W h)."""
        hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0) or 0)
        if hidden:
            self.attention_width = 6.0 * hidden
        return self

    def __repr__(self) -> str:
        return f"Scorer(budget={self.budget}, layout={self.layout!r}, row_tokens={self.row_tokens})"

    def plan(self, prompt_ids, prompt_mask, response_mask) -> list:
        """The batch's micro-batches (:func:`core.packing.plan`), largest first."""
        from .packing import plan

        return plan(prompt_ids, prompt_mask, response_mask, self.budget, self.layout, self.row_tokens,
                    self.attention_width)

    def forward(self, model, mb, seqs: Sequences, temperature: float = 1.0, with_entropy: bool = False,
                bf16: bool = False):
        """One micro-batch's (log-probs (b, L), entropy (b, L) or None), float32, rows in ``mb.rows`` order, with
        gradients when they are enabled. ``seqs`` (:class:`Sequences`) is the whole batch's."""
        prompt_ids, prompt_mask, response_ids, response_mask = seqs
        if mb.layout == "padded":
            from .packing import trim

            rows = mb.rows.to(response_ids.device)
            p_ids, p_mask, r_ids, r_mask = trim(prompt_ids[rows], prompt_mask[rows], response_ids[rows],
                                                response_mask[rows])
            lp, ent = compute_logprobs(model, Sequences(p_ids, p_mask, r_ids, r_mask), temperature, with_entropy=with_entropy,
                                       bf16=bf16, chunk_tokens=self.head_tokens)
            L = response_ids.shape[1]
            if lp.shape[1] < L:
                pad = (0, L - lp.shape[1])
                lp = torch.nn.functional.pad(lp, pad)
                ent = None if ent is None else torch.nn.functional.pad(ent, pad)
            return lp, ent
        return packed_logprobs(model, mb, seqs, temperature, with_entropy, bf16, self.head_tokens, self.pad_id)

    def score(self, model, prompt_ids, prompt_mask, response_ids, response_mask, temperature: float = 1.0,
              with_entropy: bool = False, bf16: bool = False):
        """(log-probs (B, L), entropy (B, L) or None) of the whole batch, pass by pass (a no-grad scoring pass:
        old, reference or entropy); masked positions hold garbage."""
        B, L = response_ids.shape
        dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
        lp = torch.zeros((B, L), dtype=dtype, device=response_ids.device)
        ent = torch.zeros_like(lp) if with_entropy else None
        for mb in self.plan(prompt_ids, prompt_mask, response_mask):
            a, e = self.forward(model, mb, Sequences(prompt_ids, prompt_mask, response_ids, response_mask), temperature,
                                with_entropy, bf16)
            rows = mb.rows.to(lp.device)
            lp[rows] = a.detach() if torch.is_grad_enabled() else a
            if with_entropy:
                ent[rows] = e.detach() if torch.is_grad_enabled() else e
        return lp, ent


def _sliding_window(config) -> bool:
    """Whether some attention layer of ``config`` only sees a window shorter than the model's context."""
    types = getattr(config, "layer_types", None) or ()
    if any("sliding" in str(t) for t in types):
        return True
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return False
    return int(window) < int(getattr(config, "max_position_embeddings", 0) or 0)


def layout_support(model, layout: str) -> str | None:
    """Why ``model`` cannot take ``layout`` (None when it can, as far as its configuration says; the self-test of
    :func:`choose_layout` decides): a trunk and head that cannot be called apart, an attention implementation
    without packed rows, or (``tree``) a sliding-window layer, which the 4-D mask would override."""
    if layout == "padded":
        return None
    if not _separable(model):
        return "its decoder and output head cannot be called apart"
    impl = str(getattr(model.config, "_attn_implementation", None) or "eager")
    if layout == "tree":
        if impl not in ("sdpa", "eager"):
            return f"its attention ({impl}) takes no 4-D mask"
        if _sliding_window(model.config):
            return "it has sliding-window attention layers"
        return None
    if not (impl in ("sdpa", "eager") or impl.startswith("flash_attention")):
        return f"its attention ({impl}) does not detect packed sequences from position ids"
    return None


@torch.no_grad()
def self_test(model, layout: str, bf16: bool = False, tolerance: float | None = None) -> tuple[bool, float]:
    """Compare ``layout``'s log-probs of four sequences of different lengths (two sharing a prompt) packed into one
    row with the same sequences scored one at a time in the padded layout.

    Returns:
        (passed, the largest absolute difference in nats over the response tokens). The tolerance: 1e-3 nats in
        float32 and float64, 0.1 in bf16 or half precision (rounding); attention across sequences moves log-probs
        by far more.
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    vocab = int(getattr(model.config, "vocab_size", 1000))
    g = torch.Generator().manual_seed(1234)
    lo, hi = min(10, vocab - 2), min(vocab - 1, 2000)
    spec = [(6, 9), (6, 4), (3, 7), (9, 5)]   # (prompt, response) lengths; rows 0 and 1 share their prompt
    P, L = max(p for p, _ in spec), max(r for _, r in spec)
    prompt_ids = torch.zeros((len(spec), P), dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    response_ids = torch.zeros((len(spec), L), dtype=torch.long)
    response_mask = torch.zeros_like(response_ids)
    for i, (p, r) in enumerate(spec):
        prompt_ids[i, P - p:] = torch.randint(lo, hi, (p,), generator=g)
        prompt_mask[i, P - p:] = 1
        response_ids[i, :r] = torch.randint(lo, hi, (r,), generator=g)
        response_mask[i, :r] = 1
    prompt_ids[1], prompt_mask[1] = prompt_ids[0], prompt_mask[0]
    t = [x.to(device) for x in (prompt_ids, prompt_mask, response_ids, response_mask)]
    was_training = model.training
    model.eval()
    try:
        packed, _ = Scorer(None, layout, row_tokens=10_000).score(model, *t, bf16=bf16)
        worst = 0.0
        for i in range(len(spec)):
            one, _ = compute_logprobs(model, Sequences(*(x[i:i + 1] for x in t)), bf16=bf16, share_prompts=False)
            m = t[3][i].bool()
            worst = max(worst, float((packed[i][m] - one[0][m]).abs().max()))
    finally:
        model.train(was_training)
    if tolerance is None:
        tolerance = 0.1 if bf16 or dtype in (torch.bfloat16, torch.float16) else 1e-3
    return worst <= tolerance, worst


def choose_layout(model, wanted: str = "auto", bf16: bool = False) -> tuple[str, str]:
    """The layout a run scores in, and why: ``wanted`` (``auto``: ``tree``, else ``packed``, else ``padded``) when
    the model supports it (:func:`layout_support`) and its :func:`self_test` passes; else the next one down, the
    reason naming what failed (tagged on the run)."""
    order = {"auto": ("tree", "packed", "padded"), "tree": ("tree", "packed", "padded"),
             "packed": ("packed", "padded"), "padded": ("padded",)}
    if wanted not in order:
        raise ValueError(f"train.packing={wanted!r}: expected one of {list(order)}")
    notes = []
    for layout in order[wanted]:
        why = layout_support(model, layout)
        if why is None and layout != "padded":
            try:
                ok, diff = self_test(model, layout, bf16)
            except Exception as e:  # an attention kernel that refuses the layout's inputs
                ok, diff = False, float("nan")
                why = f"its self-test failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
            if not ok and why is None:
                why = f"its self-test differed from one-at-a-time scoring by {diff:.3g} nats"
        if why is None:
            head = "asked for" if layout == wanted else ("auto" if wanted == "auto" else f"instead of {wanted}")
            return layout, "; ".join([f"{layout} ({head})"] + notes)
        notes.append(f"not {layout}: {why}")
    return "padded", "; ".join(notes)  # not reached: padded is always supported


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
    return compute_logprobs(model, Sequences(prompt_ids, prompt_mask, response_ids, response_mask), temperature, with_entropy=True,
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
