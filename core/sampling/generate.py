"""The low-level transformers sampling call (training rollouts use it too), prompt rendering and the entropy of
a sampling distribution."""
from __future__ import annotations

from typing import Sequence

import torch

from ..generation import Generation, response_mask_from_ids  # noqa: F401  (the samplers' return type)
from .interface import SamplingSettings


def prompt_texts(tokenizer, prompts: Sequence[str], chat_template: bool = True, system_prompt: str | None = None) -> list[str]:
    """Render user prompts as model input text (the tokenizer's chat template when asked)."""
    if not chat_template or getattr(tokenizer, "chat_template", None) is None:
        return list(prompts)
    out = []
    for p in prompts:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": p}]
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out



def _shared_prefill(model, input_ids, attention_mask, n: int):
    """A key/value cache of every prompt but its last token, computed once per prompt and repeated ``n`` times
    (prompt-major, as ``num_return_sequences`` orders rows), for ``generate`` to continue from; None when it does
    not apply (n = 1, a one-token prompt, a cache other than a plain dynamic key/value cache).

    ``generate`` would otherwise run the prefill of each prompt n times. The samples are the same draws (the
    prefill consumes no random numbers); the logits agree with the unshared prefill up to float rounding.
    Left padding keeps a real token in the last column, which ``generate`` then feeds itself; position ids
    follow the padding as ``generate`` computes them.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if n < 2 or input_ids.shape[1] < 2:
        return None
    pos = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    trunk = getattr(model, "base_model", None)
    trunk = model if trunk is None else trunk  # the decoder without the output head, when the model has one
    cache = trunk(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1], position_ids=pos[:, :-1],
                  use_cache=True).past_key_values
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    cache.batch_repeat_interleave(n)
    return cache


def seeded_decoding(temperature: float, top_p: float, seed: int | None) -> dict:
    """The keyword arguments of transformers ``generate`` that sample from a generator of the call's own.

    ``generate`` draws its samples with ``torch.multinomial`` on torch's global generator, which every thread of the
    process shares: another thread that reseeds it, draws from it or sets its state (a gradient-checkpointed
    backward's recompute does, twice) changes the samples, as the update beside an overlapped rollout did
    (``train.rollout.overlap``). So generation runs greedy over scores that :class:`SeededDraw` has made one-hot on
    its own draw: the same warpers (temperature, then top-p), the same softmax and the same ``multinomial`` on a
    ``torch.Generator`` seeded with ``seed``, so the draws equal ``generate``'s own after ``torch.manual_seed(seed)``
    (tests/core/test_models_scoring_sampling.py). Temperature 0 is plain greedy decoding.

    Args:
        temperature: >= 0 (0 is greedy); top_p: in (0, 1]; seed: None takes a seed drawn from torch's global
            generator (reproducible after ``torch.manual_seed``, as ``generate`` without a seed is).
    Returns:
        ``do_sample``, ``temperature``, ``top_p``, ``top_k`` and, when sampling, ``logits_processor``.
    """
    greedy = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    if float(temperature) == 0.0:
        return greedy
    from transformers import LogitsProcessorList

    return {**greedy, "logits_processor": LogitsProcessorList([SeededDraw(temperature, top_p, seed)])}


class SeededDraw:
    """A transformers logits processor that samples the next token itself (see :func:`seeded_decoding`): scores
    (B, V) -> scores that are 0 at the drawn token and -inf elsewhere, so greedy decoding takes the draw."""

    def __init__(self, temperature: float, top_p: float, seed: int | None):
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        self.warpers = ([TemperatureLogitsWarper(float(temperature))] if float(temperature) != 1.0 else []) + \
                       ([TopPLogitsWarper(float(top_p))] if float(top_p) < 1.0 else [])
        # no seed: one drawn from torch's global generator (reproducible under torch.manual_seed, as generate is)
        self.seed = int(torch.randint(0, 2**62, (1,))) if seed is None else int(seed)
        self.generator = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.generator is None:  # on the scores' device (where generate keeps its tokens)
            self.generator = torch.Generator(device=scores.device).manual_seed(self.seed)
        for warp in self.warpers:
            scores = warp(input_ids, scores)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        token = torch.multinomial(probs, num_samples=1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


@torch.no_grad()
def generate_responses(model, tokenizer, texts: Sequence[str], n: int, settings: SamplingSettings = SamplingSettings(),
                       seed: int | None = None, with_entropy: bool = False) -> Generation:
    """Sample ``n`` responses to each input text with transformers ``generate``.

    The n samples of a prompt are drawn in one call from one RNG stream, so they differ; with a
    ``seed`` the whole call is reproducible.

    Args:
        texts: already-rendered model inputs (see :func:`prompt_texts`).
        n: samples per prompt (>= 1).
        settings: temperature >= 0 (0: greedy decoding, one sequence per prompt repeated n times; top_p is then
            unused); 0 < top_p <= 1; max_new_tokens >= 1 (:class:`core.sampling.interface.SamplingSettings`; its
            chat_template is unused: the texts are rendered).
        with_entropy: also fill ``Generation.entropy`` from the logits ``generate`` computes while sampling (its
            unprocessed logits, divided by the temperature: the full next-token distribution, before top-p), so
            no second pass over the samples is needed. The logits of the whole call are held until it ends
            (rows x max_new_tokens x vocabulary x 4 bytes; see :data:`ENTROPY_LOGITS_BUDGET`).
    Returns:
        :class:`Generation`, prompt-major: rows i*n .. i*n+n-1 belong to texts[i].
    Raises:
        ValueError: on out-of-range sampling parameters.
    """
    temperature, top_p, max_new_tokens = settings.temperature, settings.top_p, settings.max_new_tokens
    if n < 1 or temperature < 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"bad sampling parameters: n={n}, temperature={temperature}, top_p={top_p}, max_new_tokens={max_new_tokens}")
    greedy = float(temperature) == 0.0
    device = next(model.parameters()).device
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    was_training = model.training
    model.eval()
    inputs = dict(enc)
    if not greedy:  # n rows per prompt, prompt-major (as num_return_sequences would lay them out)
        inputs = {k: v.repeat_interleave(n, 0) for k, v in enc.items()}
        cache = _shared_prefill(model, enc["input_ids"], enc["attention_mask"], int(n))
        if cache is not None:  # each prompt's prefill once, its cache repeated for the n samples
            inputs["past_key_values"] = cache
    decoding = seeded_decoding(temperature, top_p, seed)
    out = model.generate(
        **inputs, **decoding, max_new_tokens=int(max_new_tokens), pad_token_id=tokenizer.pad_token_id, output_logits=with_entropy, return_dict_in_generate=with_entropy,
    )
    model.train(was_training)
    entropy = None
    if with_entropy:
        entropy = torch.stack([_entropy(step, temperature) for step in out.logits], dim=1)  # (B, L)
        out = out.sequences
    if greedy and n > 1:  # the one greedy sequence of each prompt stands for its n samples
        out = out.repeat_interleave(n, 0)
        entropy = None if entropy is None else entropy.repeat_interleave(n, 0)
    p_len = enc["input_ids"].shape[1]
    response_ids = out[:, p_len:]
    if response_ids.shape[1] == 0:
        response_ids = torch.full((out.shape[0], 1), tokenizer.pad_token_id, dtype=out.dtype, device=out.device)
    eos = model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])
    mask, finished = response_mask_from_ids(response_ids, eos_ids)
    texts_out = tokenizer.batch_decode(response_ids.masked_fill(mask == 0, tokenizer.pad_token_id), skip_special_tokens=True)
    return Generation(
        prompt_ids=enc["input_ids"].repeat_interleave(n, 0),
        prompt_mask=enc["attention_mask"].repeat_interleave(n, 0),
        response_ids=response_ids, response_mask=mask, response_lengths=mask.sum(-1), finished=finished, texts=texts_out,
        entropy=None if entropy is None else entropy[:, :response_ids.shape[1]],
    )


def entropy_temperature(temperature: float) -> float:
    """The temperature entropies are taken at: the sampling temperature, or 1 (the model's own distribution) for
    greedy decoding, whose sampling distribution is a point mass."""
    return float(temperature) if float(temperature) > 0 else 1.0


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B,) entropy (nats) of softmax(logits / T) for (B, V) logits, in float32 (T = 0: at T = 1)."""
    logp = torch.log_softmax(logits.float() / entropy_temperature(temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)
