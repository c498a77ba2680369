"""Sampling responses from a policy: the transformers path (CPU, one GPU).

``generate_responses`` is the shared low-level call (training rollouts and evaluation both use
it); :class:`HFSampler` wraps it for evaluation. A vLLM sampler for GPUs plugs in behind the same
:class:`Sampler` protocol.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch


def prompt_texts(tokenizer, prompts: Sequence[str], chat_template: bool = True, system_prompt: str | None = None) -> list[str]:
    """Render user prompts as model input text (the tokenizer's chat template when asked)."""
    if not chat_template or getattr(tokenizer, "chat_template", None) is None:
        return list(prompts)
    out = []
    for p in prompts:
        msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": p}]
        out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    return out


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


def response_mask_from_ids(response_ids: torch.Tensor, eos_token_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask (B, L), finished (B,)): 1 on tokens up to and including the first EOS token."""
    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for e in eos_token_ids:
        is_eos |= response_ids == e
    before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS tokens strictly before t
    return (before == 0).long(), is_eos.any(-1)


@torch.no_grad()
def generate_responses(model, tokenizer, texts: Sequence[str], n: int, temperature: float = 1.0, top_p: float = 1.0,
                       max_new_tokens: int = 64, seed: int | None = None) -> Generation:
    """Sample ``n`` responses to each input text with transformers ``generate``.

    The n samples of a prompt are drawn in one call from one RNG stream, so they differ; with a
    ``seed`` the whole call is reproducible.

    Args:
        texts: already-rendered model inputs (see :func:`prompt_texts`).
        n: samples per prompt (>= 1); temperature > 0; 0 < top_p <= 1; max_new_tokens >= 1.
    Returns:
        :class:`Generation`, prompt-major: rows i*n .. i*n+n-1 belong to texts[i].
    Raises:
        ValueError: on out-of-range sampling parameters.
    """
    if n < 1 or temperature <= 0 or not 0 < top_p <= 1 or max_new_tokens < 1:
        raise ValueError(f"bad sampling parameters: n={n}, temperature={temperature}, top_p={top_p}, max_new_tokens={max_new_tokens}")
    device = next(model.parameters()).device
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    if seed is not None:
        torch.manual_seed(int(seed))
    was_training = model.training
    model.eval()
    out = model.generate(
        **enc, do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=0,
        max_new_tokens=int(max_new_tokens), num_return_sequences=int(n), pad_token_id=tokenizer.pad_token_id,
    )
    model.train(was_training)
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
    )


class Sampler(Protocol):
    """Draws n samples per prompt. Returns, per prompt, a list of dicts with keys
    ``response``, ``n_tokens``, ``finish_reason`` ('stop' or 'length')."""

    def sample(self, prompts: Sequence[str], n: int, seed: int) -> list[list[dict]]: ...


class HFSampler:
    """transformers sampler (CPU or one GPU) behind the :class:`Sampler` protocol."""

    def __init__(self, model, tokenizer, temperature=1.0, top_p=1.0, max_new_tokens=64, chat_template=True,
                 with_entropy: bool = True, score_rows: int = 16):
        self.model, self.tokenizer = model, tokenizer
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.chat_template, self.with_entropy, self.score_rows = chat_template, with_entropy, score_rows

    @torch.no_grad()
    def _mean_entropies(self, gen: "Generation") -> list[float]:
        """Exact mean next-token entropy (nats) of each response: a teacher-forced scoring pass with
        the full distribution at the sampling temperature, in chunks of ``score_rows`` rows."""
        from .scoring import compute_logprobs

        out = []
        for a in range(0, gen.response_ids.shape[0], self.score_rows):
            sl = slice(a, a + self.score_rows)
            _, ent = compute_logprobs(self.model, gen.prompt_ids[sl], gen.prompt_mask[sl], gen.response_ids[sl],
                                      gen.response_mask[sl], self.temperature, with_entropy=True)
            m = gen.response_mask[sl].to(ent.dtype)
            out += ((ent * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
        return out

    def sample(self, prompts: Sequence[str], n: int, seed: int) -> list[list[dict]]:
        texts = prompt_texts(self.tokenizer, prompts, self.chat_template)
        gen = generate_responses(self.model, self.tokenizer, texts, n, self.temperature, self.top_p, self.max_new_tokens, seed)
        entropies = self._mean_entropies(gen) if self.with_entropy else [None] * len(gen.texts)
        out = []
        for i in range(len(prompts)):
            rows = []
            for j in range(i * n, (i + 1) * n):
                rows.append({
                    "response": gen.texts[j], "n_tokens": int(gen.response_lengths[j]),
                    "finish_reason": "stop" if bool(gen.finished[j]) else "length",
                    "mean_token_entropy": entropies[j],
                })
            out.append(rows)
        return out


class VLLMSampler:
    """vLLM sampler (GPU) behind the :class:`Sampler` protocol: one ``generate`` call per batch of
    prompts with ``SamplingParams(n=n, seed=seed, temperature, top_p, max_tokens)``, so the n samples
    of a prompt are distinct draws of one seeded request.

    Token entropies are not computed here (vLLM returns top log-probs only); score samples with
    :class:`HFSampler` or leave ``mean_token_entropy`` empty.

    Args:
        model_path: a Hugging Face model directory or hub id; other arguments as :class:`HFSampler`.
        llm_kwargs: passed to ``vllm.LLM`` (e.g. ``gpu_memory_utilization``, ``enforce_eager``).
    Raises:
        ImportError: vLLM is not installed (``pip install -e .[gpu]``).
    """

    def __init__(self, model_path, temperature=1.0, top_p=1.0, max_new_tokens=64, chat_template=True, **llm_kwargs):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("VLLMSampler needs vLLM: pip install -e '.[gpu]' (or use HFSampler on the CPU)") from e
        self.llm = LLM(model=str(model_path), **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.temperature, self.top_p, self.max_new_tokens, self.chat_template = temperature, top_p, max_new_tokens, chat_template

    def sample(self, prompts: Sequence[str], n: int, seed: int) -> list[list[dict]]:
        from vllm import SamplingParams

        texts = prompt_texts(self.tokenizer, prompts, self.chat_template)
        params = SamplingParams(n=int(n), seed=int(seed), temperature=float(self.temperature), top_p=float(self.top_p),
                                max_tokens=int(self.max_new_tokens))
        results = self.llm.generate(texts, params, use_tqdm=False)
        out = []
        for res in results:
            out.append([{"response": c.text, "n_tokens": len(c.token_ids),
                         "finish_reason": "stop" if c.finish_reason == "stop" else "length",
                         "mean_token_entropy": None} for c in res.outputs])
        return out
