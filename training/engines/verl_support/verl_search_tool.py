"""The search tool as verl sees it: a function tool (``actor_rollout_ref.rollout.multi_turn.function_tool_path``) that
verl's tool agent loop calls in the model's own function-calling format, answered by the same retrieval server as the
local engine's ``<search>`` episodes (:mod:`core.retrieval`, Search-R1's protocol). verl masks the tool's tokens
out of the loss itself (its agent loop's response mask). The server's URL comes from ``RLVR_SEARCH_URL`` (set by
:func:`training.engines.verl.train` from ``tools.search.url``), the number of passages from ``RLVR_SEARCH_TOPK``.
Loaded by verl in its agent-loop workers; imports nothing of verl's beyond its decorator.
"""
from __future__ import annotations

import os

from verl.tools.function_tool import function_tool

URL_ENV, TOPK_ENV = "RLVR_SEARCH_URL", "RLVR_SEARCH_TOPK"


@function_tool
def search(query: str) -> str:
    """Search a knowledge base of Wikipedia passages and return the most relevant ones.

    Args:
        query: what to look for, e.g. the name of a person or a short question.
    """
    from core.retrieval import retrieve
    from core.tools import format_passages

    try:
        [hits] = retrieve(os.environ[URL_ENV], [query], int(os.environ.get(TOPK_ENV, "3")), 10.0)
    except Exception as e:  # one failed call is an answer the policy reads, as in the local engine
        return f"search failed: {type(e).__name__}: {str(e)[:200]}"
    return format_passages(hits)
