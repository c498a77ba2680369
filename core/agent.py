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

from typing import Sequence

import torch

from .sampling import Generation

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


@torch.no_grad()
def generate_with_tools(model, tokenizer, texts: Sequence[str], n: int, temperature: float, top_p: float,
                        max_new_tokens: int, seed: int | None, tools: dict, max_turns: int = 4,
                        max_obs_tokens: int = 256) -> Generation:
    """Sample ``n`` episodes per input text, calling ``tools`` (``{name: core.tools.Tool}``) along the way.

    Args:
        texts: rendered model inputs (:func:`core.sampling.prompt_texts`).
        temperature: 0 is greedy; top_p in (0, 1].
        max_new_tokens: the budget of the whole response, policy and tool tokens together.
        max_turns: tool calls per episode at most; a call beyond it ends the episode unanswered.
        max_obs_tokens: tokens of one tool result kept (the rest is cut).
    Returns:
        :class:`core.sampling.Generation` (prompt-major), with ``tool_calls`` (B,), ``tool_tokens`` (B,) and
        ``finished`` (B,): the episode ended by EOS or ``</answer>``.
    Raises:
        core.tools.ToolUnavailable: a tool's service is gone.
    """
    device = next(model.parameters()).device
    greedy = float(temperature) == 0.0
    if seed is not None:
        torch.manual_seed(int(seed))
    pad = tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    eos_ids = set([eos] if isinstance(eos, int) else list(eos or [tokenizer.eos_token_id]))
    stops = [t.close_tag for t in tools.values()] + [ANSWER_CLOSE]
    enc = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    B = len(enc) * int(n)
    prompts = [enc[i // int(n)] for i in range(B)]
    resp: list[list[int]] = [[] for _ in range(B)]
    keep: list[list[int]] = [[] for _ in range(B)]
    calls, done, finished = [0] * B, [False] * B, [False] * B
    info_open = tokenizer("\n\n<information>", add_special_tokens=False).input_ids
    info_close = tokenizer("</information>\n\n", add_special_tokens=False).input_ids
    decoding = (dict(do_sample=False, temperature=None, top_p=None, top_k=None) if greedy else
                dict(do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=0))
    was_training = model.training
    model.eval()
    try:
        while not all(done):
            rows = [i for i in range(B) if not done[i]]
            budget = {i: int(max_new_tokens) - len(resp[i]) for i in rows}
            seqs = [prompts[i] + resp[i] for i in rows]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=device)
            att = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
            out = model.generate(input_ids=ids, attention_mask=att, **decoding, max_new_tokens=max(budget.values()),
                                 stop_strings=stops, tokenizer=tokenizer, pad_token_id=pad)
            new = out[:, width:].tolist()
            pending: dict[str, list[tuple[int, str]]] = {}
            for j, i in enumerate(rows):
                toks = new[j][: budget[i]]
                cut, why = _cut(toks, tokenizer, eos_ids, stops)
                resp[i] += toks[:cut]
                keep[i] += [1] * cut
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
                    calls[i] += 1
                    if len(resp[i]) >= int(max_new_tokens):
                        done[i] = True
    finally:
        model.train(was_training)
    width = max(1, max(len(r) for r in resp))
    response_ids = torch.tensor([r + [pad] * (width - len(r)) for r in resp], device=device)
    response_mask = torch.tensor([k + [0] * (width - len(k)) for k in keep], device=device)
    p_width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad] * (p_width - len(p)) + p for p in prompts], device=device)
    prompt_mask = torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts], device=device)
    return Generation(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, response_lengths=response_mask.sum(-1),
                      finished=torch.tensor(finished, device=device),
                      texts=[tokenizer.decode(r, skip_special_tokens=True) for r in resp],
                      tool_calls=torch.tensor(calls, device=device),
                      tool_tokens=torch.tensor([len(k) - sum(k) for k in keep], device=device))
