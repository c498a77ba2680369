"""Tools a policy can call during a rollout, registered by name (search first).

A tool is called by a tag pair in the policy's text (``<search>query</search>``); generation stops at the closing
tag, the tool answers, and its result is appended as ``<information>...</information>`` before generation goes on
(:mod:`core.agent`). A tool answers a batch of calls at once (:meth:`Tool.call`); a call that fails (a timeout, a
bad reply) is answered with an error text the policy reads, so a rollout never crashes on one bad call; a tool whose
service is gone raises :class:`ToolUnavailable` with one line saying which, so the run stops instead of training on
error texts.

Tools are opened per run from the ``tools`` config (:func:`open_tools`): ``tools.search.url`` names a running
retrieval server (:mod:`core.retrieval`, or Search-R1's); without it, the server is started over
``tools.search.index`` (a built index) or over the corpus the run's rows name (``row["corpus"]``: the generated
world's; indexed on first use, cached under ``$RLVR_CACHE/retrieval``) and stopped when the run ends.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .retrieval import RetrievalError, RetrievalServer, build_index, retrieve

log = logging.getLogger("rlvr")


class ToolUnavailable(RuntimeError):
    """A tool's service is gone (its server is not answering): the rollout cannot go on."""


class Tool:
    """A callable tool: ``name`` (its tag: ``<name>...</name>``) and :meth:`call`."""

    name: str = ""

    @property
    def open_tag(self) -> str:
        return f"<{self.name}>"

    @property
    def close_tag(self) -> str:
        return f"</{self.name}>"

    def call(self, queries: list[str]) -> list[str]:
        """One result text per query (an error text for a call that failed).

        Raises:
            ToolUnavailable: the tool's service is gone.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release what the tool holds (a server it started)."""


@dataclass
class SearchTool(Tool):
    """Search over a retrieval server: the top ``topk`` passages, formatted ``Doc i(Title: t) text`` one per line
    (Search-R1's observation format; the title is the first line of a passage when it is quoted)."""

    url: str
    topk: int = 3
    timeout_s: float = 10.0
    server: RetrievalServer | None = None
    name: str = "search"

    def call(self, queries: list[str]) -> list[str]:
        if not queries:
            return []
        try:
            hits = retrieve(self.url, [q.strip() for q in queries], self.topk, self.timeout_s)
        except RetrievalError as e:
            raise ToolUnavailable(f"search tool: {e}") from None
        except Exception as e:  # a failed call while the server is there: the policy reads why
            return [f"search failed: {type(e).__name__}: {str(e)[:200]}"] * len(queries)
        return [format_passages(row) for row in hits]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def format_passages(docs: list[dict]) -> str:
    """``Doc 1(Title: T) text`` lines from passages whose contents start with a quoted title line."""
    lines = []
    for i, d in enumerate(docs):
        contents = str(d.get("contents", ""))
        first, _, rest = contents.partition("\n")
        title, text = (first.strip('"'), rest) if rest and first.startswith('"') else ("", contents)
        lines.append(f"Doc {i + 1}(Title: {title}) {text.strip()}")
    return "\n".join(lines)


TOOLS: dict[str, Callable] = {}


def register_tool(name: str):
    """Decorator registering ``factory(tool_cfg, corpora: list[Path]) -> Tool`` under ``name`` (the tag)."""
    def deco(factory):
        TOOLS[name] = factory
        return factory
    return deco


def cache_dir() -> Path:
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr")) / "retrieval"


@register_tool("search")
def _search_tool(cfg, corpora: list[Path]) -> SearchTool:
    """The search tool from ``tools.search`` (``url``, ``index``, ``backend``, ``topk``, ``timeout_s``)."""
    get = cfg.get if hasattr(cfg, "get") else dict(cfg).get
    topk, timeout = int(get("topk", 3) or 3), float(get("timeout_s", 10) or 10)
    if get("url"):
        return SearchTool(str(get("url")), topk, timeout)
    index = get("index")
    if not index:
        if len(corpora) != 1:
            raise ValueError("tools.search: no url and no index, and the run's tasks give "
                             f"{'no' if not corpora else 'several'} corpora to index; set tools.search.index or tools.search.url")
        from .retrieval import corpus_digest

        backend = str(get("backend", "bm25") or "bm25")
        index = cache_dir() / f"{corpus_digest(corpora[0])[:16]}-{backend}"
        build_index(corpora[0], index, backend)
    server = RetrievalServer(index)
    log.info("search tool: retrieval server over %s at %s", index, server.url)
    return SearchTool(server.url, topk, timeout, server=server)


def open_tools_for(rows, tools_cfg) -> dict[str, Tool]:
    """The tools the tasks of ``rows`` declare, opened from ``tools_cfg``; a search tool with neither url nor index
    indexes the corpus the rows name (``row["corpus"]``, e.g. the generated world's). {} when no task has tools."""
    names = tool_names(rows)
    if not names:
        return {}
    corpora = list(dict.fromkeys(str(r["corpus"]) for r in rows if r.get("corpus")))
    return open_tools(names, tools_cfg, corpora)


def tool_names(rows) -> list[str]:
    """The tools the tasks of ``rows`` declare (``Task.tools``), in order of first use."""
    from .tasks import get_task

    out = []
    for name in dict.fromkeys(r.get("task") for r in rows):
        for t in getattr(get_task(name), "tools", ()) if name else ():
            if t not in out:
                out.append(t)
    return out


def open_tools(names, tools_cfg, corpora=()) -> dict[str, Tool]:
    """``{name: Tool}`` for the named tools, from their ``tools.<name>`` config; close them with :func:`close_tools`.

    Raises:
        KeyError: an unregistered tool; ValueError: a tool without what it needs to start.
    """
    out = {}
    try:
        for n in names:
            if n not in TOOLS:
                raise KeyError(f"unknown tool {n!r}; registered: {sorted(TOOLS)}")
            sub = tools_cfg.get(n, {}) if tools_cfg is not None else {}
            out[n] = TOOLS[n](sub or {}, [Path(c) for c in corpora])
    except BaseException:
        close_tools(out)
        raise
    return out


def close_tools(tools: dict) -> None:
    for t in (tools or {}).values():
        try:
            t.close()
        except Exception as e:  # closing must not hide the run's own outcome
            log.warning("closing tool %s: %s", getattr(t, "name", "?"), e)
