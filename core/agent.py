"""Multi-turn generation with tools: the policy writes, calls a tool by its tag, reads the result, goes on.

One episode per sampled response (Search-R1's loop, as VerlTool packages it): generation stops at a tool's closing
tag (``</search>``), at ``</answer>``, at EOS or at the token budget; after a tool call the tool's result is
appended as ``\\n\\n<information>...</information>\\n\\n`` and generation continues, for at most ``max_turns`` calls.
The response is the policy's tokens and the tool's tokens in order; ``response_mask`` is 1 on the policy's tokens
only (its EOS included), 0 on the tool's, so no log-probability ratio, KL, entropy or loss is taken on text the
policy did not write, while the model still attends to it (:func:`core.scoring.compute_logprobs` attends to the
whole response and uses the mask for nothing else). ``response_lengths`` counts the policy's tokens.

Source: Search-R1 (Jin et al. 2025, the loss masking of retrieved tokens) and TR-GRPO's agentic setting (its Table 3
and Eq. 15).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .generation import Generation
from .sampling.interface import SamplingSettings


@dataclass(frozen=True)
class ToolUse:
    """The tools of an episode and their limits: ``tools`` ({name: :class:`core.tools.Tool`}), ``max_turns`` (tool
    calls per episode at most; a call beyond it ends the episode unanswered: ``tools.max_turns``) and
    ``max_obs_tokens`` (tokens of one tool result kept, the rest cut: ``tools.max_obs_tokens``)."""

    tools: dict
    max_turns: int = 4
    max_obs_tokens: int = 256

ANSWER_CLOSE = "</answer>"


def _cut(tokens: list[int], tokenizer, eos_ids: set, stops: Sequence[str]) -> tuple[int, str]:
    """(tokens to keep, why the turn ended): the first EOS (kept), the first completed stop string (kept up to the
    token that completes it), or the whole list (``budget``)."""
    for j, t in enumerate(tokens):
        if t in eos_ids:
            return j + 1, "eos"
        window = tokenizer.decode(tokens[max(0, j - 15): j + 1])  # the first window holding a stop completes it here
        for s in stops:
            if s in window:
                return j + 1, s
    return len(tokens), "budget"


def call_text(turn: str, tool) -> str:
    """The argument of the call that ends ``turn``: the text between the last opening tag and the closing tag, or
    all the turn's text before the closing tag when the opening tag is not in it (it was in the prompt's prefill)."""
    head = turn[: turn.rfind(tool.close_tag)] if tool.close_tag in turn else turn
    if tool.open_tag in head:
        head = head[head.rfind(tool.open_tag) + len(tool.open_tag):]
    return head.strip()


def hf_continuation(model, tokenizer, temperature: float, top_p: float, stops: Sequence[str], seed: int | None = None):
    """A continuation function for :func:`run_episodes` that samples with transformers ``generate`` on ``model``:
    ``fn(seqs, budgets, turn) -> [(new tokens, None), ...]`` (no log-probs), stopping at ``stops`` or EOS. Every turn
    draws from one generator seeded with ``seed`` (:func:`core.sampling.generate.seeded_decoding`), never from
    torch's global one."""
    from .sampling.generate import seeded_decoding

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    decoding = seeded_decoding(temperature, top_p, seed)

    @torch.no_grad()
    def cont(seqs: list[list[int]], budgets: list[int], turn: int):
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
        att = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
        was_training = model.training
        model.eval()
        try:
            out = model.generate(input_ids=ids, attention_mask=att, **decoding, max_new_tokens=max(budgets),
                                 stop_strings=list(stops), tokenizer=tokenizer, pad_token_id=pad)
        finally:
            model.train(was_training)
        return [(row[: b], None) for row, b in zip(out[:, width:].tolist(), budgets)]

    return cont


def model_eos_ids(model, tokenizer) -> list[int]:
    """The token ids that end a response: the model's generation config's ``eos_token_id`` (one or a list), else
    the tokenizer's EOS."""
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id])


@torch.no_grad()
def generate_with_tools(model, tokenizer, texts: Sequence[str], n: int, settings: SamplingSettings, seed: int | None,
                        use: ToolUse) -> Generation:
    """Sample ``n`` episodes per input text with transformers ``generate`` on ``model``, calling ``tools`` along the way
    (:func:`run_episodes` with :func:`hf_continuation`; ``seed`` seeds the episodes' one generator).

    Args:
        texts: rendered model inputs (:func:`core.sampling.prompt_texts`).
        settings: temperature (0 is greedy), top_p in (0, 1], max_new_tokens (the budget of the whole response,
            policy and tool tokens together); its chat_template is unused (the texts are rendered).
        use: the tools and their limits (:class:`ToolUse`).
    Returns:
        :class:`core.generation.Generation` (prompt-major), with ``tool_calls`` (B,), ``tool_tokens`` (B,) and
        ``finished`` (B,): the episode ended by EOS or ``</answer>``.
    Raises:
        core.tools.ToolUnavailable: a tool's service is gone.
    """
    stops = [t.close_tag for t in use.tools.values()] + [ANSWER_CLOSE]
    cont = hf_continuation(model, tokenizer, settings.temperature, settings.top_p, stops, seed)
    return run_episodes(cont, tokenizer, model_eos_ids(model, tokenizer), texts, n, settings.max_new_tokens, use,
                        device=next(model.parameters()).device)


def run_episodes(cont, tokenizer, eos_ids: Sequence[int], texts: Sequence[str], n: int, max_new_tokens: int,
                 use: ToolUse, device="cpu") -> Generation:
    """Sample ``n`` episodes per input text through a continuation function, calling ``tools`` along the way.

    Args:
        cont: ``fn(seqs, budgets, turn) -> [(new token ids, their log-probs or None), ...]``: continue each token
            sequence by at most its budget, stopping at a tool's closing tag, ``</answer>`` or EOS (it may run past
            them: the turn is cut here); :func:`hf_continuation`, or the vLLM rollout's.
        eos_ids: the tokens that end a response.
        texts, n: as :func:`generate_with_tools`; max_new_tokens: the whole response's budget.
        use: the tools and their limits (:class:`ToolUse`).
    Returns:
        :class:`core.generation.Generation` as :func:`generate_with_tools`, with ``logprobs`` (B, L) when ``cont``
        returns them (0 on the tool's tokens).
    Raises:
        core.tools.ToolUnavailable: a tool's service is gone.
    """
    eos_ids = set(eos_ids)
    tools, max_turns, max_obs_tokens = use.tools, use.max_turns, use.max_obs_tokens
    stops = [t.close_tag for t in tools.values()] + [ANSWER_CLOSE]
    enc = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    B = len(enc) * int(n)
    prompts = [enc[i // int(n)] for i in range(B)]
    resp: list[list[int]] = [[] for _ in range(B)]
    keep: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    with_lp = False
    calls, done, finished = [0] * B, [False] * B, [False] * B
    info_open = tokenizer("\n\n<information>", add_special_tokens=False).input_ids
    info_close = tokenizer("</information>\n\n", add_special_tokens=False).input_ids
    turn = 0
    while not all(done):
        rows = [i for i in range(B) if not done[i]]
        budget = {i: int(max_new_tokens) - len(resp[i]) for i in rows}
        new = cont([prompts[i] + resp[i] for i in rows], [budget[i] for i in rows], turn)
        turn += 1
        pending: dict[str, list[tuple[int, str]]] = {}
        for (toks, lp), i in zip(new, rows):
            toks = list(toks)[: budget[i]]
            cut, why = _cut(toks, tokenizer, eos_ids, stops)
            resp[i] += toks[:cut]
            keep[i] += [1] * cut
            if lp is not None:
                with_lp = True
                lps[i] += list(lp)[:cut]
            else:
                lps[i] += [0.0] * cut
            if why in ("eos", ANSWER_CLOSE):
                done[i], finished[i] = True, True
                continue
            tool = next((t for t in tools.values() if t.close_tag == why), None)
            if tool is None or calls[i] >= int(max_turns) or len(resp[i]) >= int(max_new_tokens):
                done[i] = True  # out of budget, or a call beyond max_turns: the episode ends unanswered
                continue
            pending.setdefault(tool.name, []).append((i, call_text(tokenizer.decode(toks[:cut]), tool)))
        for name, items in pending.items():
            results = tools[name].call([q for _, q in items])
            for (i, _), text in zip(items, results):
                obs = info_open + tokenizer(text, add_special_tokens=False).input_ids[: int(max_obs_tokens)] + info_close
                obs = obs[: int(max_new_tokens) - len(resp[i])]
                resp[i] += obs
                keep[i] += [0] * len(obs)
                lps[i] += [0.0] * len(obs)
                calls[i] += 1
                if len(resp[i]) >= int(max_new_tokens):
                    done[i] = True
    return _generation(tokenizer, prompts, resp, keep, lps if with_lp else None, calls, finished, device)


def _generation(tokenizer, prompts: list, resp: list, keep: list, lps: list | None, calls: list, finished: list,
                device) -> Generation:
    """The episodes as a :class:`core.generation.Generation`: prompts left-padded, responses (``resp``, with
    ``keep`` 1 on the policy's tokens) right-padded, log-probs ``lps`` (None: the continuation returned none) masked
    to the policy's tokens, ``calls`` tool calls and ``finished`` flags per episode."""
    pad = tokenizer.pad_token_id
    width = max(1, max(len(r) for r in resp))
    response_ids = torch.tensor([r + [pad] * (width - len(r)) for r in resp], device=device)
    response_mask = torch.tensor([k + [0] * (width - len(k)) for k in keep], device=device)
    p_width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad] * (p_width - len(p)) + p for p in prompts], device=device)
    prompt_mask = torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts], device=device)
    logprobs = (torch.tensor([lp + [0.0] * (width - len(lp)) for lp in lps], device=device) * response_mask
                if lps is not None else None)
    return Generation(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, response_lengths=response_mask.sum(-1),
                      finished=torch.tensor(finished, device=device),
                      texts=[tokenizer.decode(r, skip_special_tokens=True) for r in resp],
                      tool_calls=torch.tensor(calls, device=device),
                      tool_tokens=torch.tensor([len(k) - sum(k) for k in keep], device=device), logprobs=logprobs)
