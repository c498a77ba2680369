"""Micro-batches under a token budget, and the row layouts the decoder sees them in.

A batch of (prompt, response) pairs is teacher-forced through the decoder in *micro-batches*: groups of rows whose
forward (and backward) pass holds at most ``budget`` token positions, padding included. Three layouts:

- ``padded``: one row per response, the prompt left-padded and the response right-padded to the micro-batch's
  longest (the one-pass path of :func:`core.scoring.compute_logprobs`, which runs each distinct prompt once and
  shares its key/value cache among its responses).
- ``packed``: several (prompt, response) sequences one after the other in a row, no padding between them, position
  ids restarting at 0 for each; ``attention_mask=None`` and no cache, so transformers (>= 4.53.1) derives a
  block-diagonal causal mask from the position ids (and flash-attention's varlen kernel takes the same layout).
- ``tree``: a prompt once, followed by several of its responses, each response attending to the prompt and to its
  own earlier tokens only (a 4-D additive mask, which transformers passes to ``sdpa`` and ``eager`` attention as it
  is): no padding and no prompt repeated. A group of G responses to one prompt costs p + sum r_i positions
  instead of G (p + r_i) (packed) or p + G max r (padded, shared prompt).

Segments (a prompt and the responses that follow it, at most ``row_tokens`` positions) go into decoder rows padded
to the widest: as many rows as minimise the positions computed plus attention's share, which grows with a row's width
(sdpa computes the masked scores too; :func:`balanced_rows`), each row filled to nearly the same width (longest
segment first into the least-filled row); in the tree layout, when it costs less, a prompt's group is cut where a
row is full and goes on in the next behind its prompt again (:func:`poured_rows`: rows of nearly equal width at the
price of a repeated prompt, where whole groups of unequal sizes leave padding). Rows go into micro-batches; the micro-batches are ordered largest first,
so the first pass of a step is its peak (an out-of-memory error shows at step 0). The budget is a hard cap: no micro-batch computes more positions than it (unlike verl's balancing,
which can overshoot, verl #7272).

Silent failure: a packed row attends across its sequences when a cache object or an all-ones attention mask
reaches the model, and the first sequence of a row always looks right. :func:`self_test` compares a layout's
log-probs with the sequences scored one at a time before a run uses it (:class:`core.scoring.Scorer`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

LAYOUTS = ("padded", "packed", "tree")
ROW_TOKENS = 1024  # the widest a packed or tree row grows (at least the longest sequence): see docs/training.md
ATTENTION_WIDTH = 3072  # the row width at which attention per token costs as much as the rest (about 6 x hidden size)


@dataclass(frozen=True)
class Segment:
    """A prompt (the batch row ``prompt_row`` holds it) followed by the responses of rows ``responses`` (all to that
    prompt; one response in the ``packed`` layout)."""

    prompt_row: int
    responses: tuple[int, ...]
    length: int


@dataclass
class MicroBatch:
    """Rows of the batch scored in one pass (``rows``: batch indices, in the order the pass returns them).

    Attributes:
        layout: one of :data:`LAYOUTS`.
        rows: (b,) long tensor of batch row indices.
        packed_rows: for ``packed``/``tree``: the decoder rows, each a list of :class:`Segment`; for ``padded`` [].
        width: positions per decoder row (the padded or packed row width).
        tokens: positions the pass computes, padding included (decoder rows x width).
        real: positions that hold a token (prompts counted once per decoder row they appear in).
    """

    layout: str
    rows: torch.Tensor
    packed_rows: list = field(default_factory=list)
    width: int = 0
    tokens: int = 0
    real: int = 0

    @property
    def padding(self) -> int:
        """Positions computed that hold no token."""
        return self.tokens - self.real


def lengths(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt lengths (B,), response lengths (B,)): real prompt tokens, and response positions up to the last one
    the mask keeps (tool observations inside a multi-turn response are masked out but stay in the sequence)."""
    p = prompt_mask.long().sum(-1)
    m = response_mask.long()
    L = m.shape[1]
    pos = torch.arange(1, L + 1, device=m.device).expand_as(m)
    r = (pos * (m > 0)).max(-1).values if L else torch.zeros(m.shape[0], dtype=torch.long, device=m.device)
    return p, r


def prompt_keys(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """(B,) long: rows with the same key have the same prompt (ids and mask)."""
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    return torch.unique(key, dim=0, return_inverse=True)[1]


def _segments(rows, p, r, keys, width: int, share: bool) -> list[Segment]:
    """Each prompt's responses in segments of at most ``width`` positions (one response each without ``share``)."""
    out: list[Segment] = []
    if not share:
        return [Segment(i, (i,), p[i] + r[i]) for i in rows]
    by_key: dict[int, list[int]] = {}
    for i in rows:
        by_key.setdefault(keys[i], []).append(i)
    for members in by_key.values():
        members = sorted(members, key=lambda i: (-r[i], i))
        cur, size = [], 0
        for i in members:
            if cur and size + r[i] > width:
                out.append(Segment(cur[0], tuple(cur), size))
                cur, size = [], 0
            if not cur:
                size = p[i]
            cur.append(i)
            size += r[i]
        if cur:
            out.append(Segment(cur[0], tuple(cur), size))
    return out


def plan(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor, budget: int | None,
         layout: str = "padded", row_tokens: int = ROW_TOKENS, attention_width: float = ATTENTION_WIDTH
         ) -> list[MicroBatch]:
    """Split a batch into micro-batches of at most ``budget`` computed positions, longest first.

    Args:
        prompt_ids, prompt_mask: (B, P) left-padded; response_mask: (B, L) right-padded.
        budget: positions per pass (padding included); None: the whole batch in one pass.
        layout: ``padded``, ``packed`` or ``tree`` (module docstring).
        row_tokens: the widest a packed or tree row may be (raised to the longest sequence).
        attention_width: the row width at which a token's attention costs as much as the rest of its pass
            (:func:`balanced_rows`; about 6 x the hidden size).
    Returns:
        Micro-batches covering every row exactly once; the first is the largest.
    Raises:
        ValueError: an unknown layout, or a sequence longer than the budget (one line, with both numbers).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {list(LAYOUTS)}")
    B = int(response_mask.shape[0])
    if B == 0:
        return []
    p_t, r_t = lengths(prompt_mask, response_mask)
    p, r = p_t.tolist(), r_t.tolist()
    longest = max(a + b for a, b in zip(p, r))
    if budget is not None and longest > int(budget):
        raise ValueError(f"train.micro_batch_tokens={budget}: a sequence of {longest} tokens (prompt and response) does "
                         f"not fit one pass; set it to at least {longest}")
    if layout == "padded":
        return _largest_first(_plan_padded(p, r, budget))
    keys = prompt_keys(prompt_ids, prompt_mask).tolist()
    cap = max(longest, int(row_tokens) if budget is None else min(int(row_tokens), int(budget)))
    segs = sorted(_segments(range(B), p, r, keys, cap, layout == "tree"), key=lambda s: (-s.length, s.prompt_row))
    rows, fill = balanced_rows(segs, cap, attention_width if layout == "tree" else float("inf"))
    if layout == "tree":  # a prompt's group may also be cut between rows (its prompt repeated) to even the rows out
        poured = poured_rows(range(B), p, r, keys, cap, attention_width)
        if poured is not None and _row_cost(poured[1], attention_width) < _row_cost(fill, attention_width):
            rows, fill = poured
    order = sorted(range(len(rows)), key=lambda j: -fill[j])
    out, cur, cur_w = [], [], 0
    for j in order:
        w = max(cur_w, fill[j])
        if cur and budget is not None and (len(cur) + 1) * w > int(budget):
            out.append(_packed_mb(layout, [rows[k] for k in cur], [fill[k] for k in cur]))
            cur, w = [], fill[j]
        cur.append(j)
        cur_w = w
    if cur:
        out.append(_packed_mb(layout, [rows[k] for k in cur], [fill[k] for k in cur]))
    return _largest_first(out)


def balanced_rows(segs: list[Segment], cap: int, attention_width: float = ATTENTION_WIDTH
                  ) -> tuple[list[list[Segment]], list[int]]:
    """Segments (longest first) into R decoder rows of at most ``cap`` positions, for the R that minimises the
    estimated cost R W (1 + W / ``attention_width``), W the widest row: R W positions are computed (the rows are padded
    to W), and attention over a row of W positions adds W / attention_width of a token's other work per token (sdpa
    computes the masked scores too; for flash-attention's varlen kernel, ``inf``). Each R's rows are filled longest
    segment first into the least-filled row (LPT scheduling), so they come out nearly equal and the padding small.

    Returns:
        (rows, their fills).
    """
    import heapq
    import math

    total = sum(x.length for x in segs)
    longest = segs[0].length if segs else 0
    best = None
    R = max(1, math.ceil(total / cap))
    while R <= len(segs):
        heap = [(0, j) for j in range(R)]
        rows: list[list[Segment]] = [[] for _ in range(R)]
        fill = [0] * R
        ok = True
        for seg in segs:
            f, j = heapq.heappop(heap)
            if f + seg.length > cap:
                ok = False
                break
            rows[j].append(seg)
            fill[j] = f + seg.length
            heapq.heappush(heap, (fill[j], j))
        if ok:
            width = max(fill)
            cost = R * width * (1 + width / attention_width)
            if best is None or cost < best[0]:
                best = (cost, rows, fill)
            if width <= longest:  # more rows only add padding now
                break
        R = max(R + 1, int(R * 1.05))
    if best is None:  # not reached: one segment per row always fits the cap
        return [[x] for x in segs], [x.length for x in segs]
    return best[1], best[2]


def _row_cost(fill: list[int], attention_width: float) -> float:
    """:func:`balanced_rows`'s estimated cost of rows with these fills: R W (1 + W / ``attention_width``)."""
    width = max(fill)
    return len(fill) * width * (1 + width / attention_width)


def poured_rows(rows, p: list[int], r: list[int], keys: list[int], cap: int, attention_width: float = ATTENTION_WIDTH
                ) -> tuple[list[list[Segment]], list[int]] | None:
    """Tree rows of nearly equal width, the alternative to :func:`balanced_rows` that cuts a prompt's group where a
    row is full: the groups (largest first, each one's responses longest first) are poured into R rows of at most T
    positions, a group continuing in the next row behind its prompt again (the repeat is computed, and counted as a
    computed position, not padding). For each R from the fewest rows that can hold the batch (then 5% more at a
    time), the smallest T that holds everything (bisection); the R of the lowest cost R T' (1 + T' /
    ``attention_width``), T' the widest row, searched until it has risen three times. None when no R fits ``cap``.

    Args:
        rows: the batch rows; p, r: their prompt and response lengths; keys: their prompt identities
            (:func:`prompt_keys`); cap: the widest a row may be.
    """
    import math

    groups: dict[int, list[int]] = {}
    for i in rows:
        groups.setdefault(keys[i], []).append(i)
    order = sorted((sorted(m, key=lambda i: (-r[i], i)) for m in groups.values()),
                   key=lambda m: (-(p[m[0]] + sum(r[i] for i in m)), m[0]))
    total = sum(p[m[0]] + sum(r[i] for i in m) for m in order)
    longest = max(p[i] + r[i] for m in order for i in m)
    best, rising, n_rows = None, 0, sum(len(m) for m in order)
    R = max(1, math.ceil(total / cap))
    while R <= n_rows and rising < 3:
        lo, hi = max(longest, math.ceil(total / R)), cap  # the smallest width that holds it all (pouring into wider
        poured = _pour(order, p, r, R, hi) if lo <= hi else None  # rows never needs more of them: bisection)
        while poured is not None and lo < hi:
            mid = (lo + hi) // 2
            tried = _pour(order, p, r, R, mid)
            if tried is None:
                lo = mid + 1
            else:
                hi, poured = mid, tried
        if poured is not None:
            cost = _row_cost(poured[1], attention_width)
            if best is None or cost < best[0]:
                best, rising = (cost, *poured), 0
            else:
                rising += 1
        R = max(R + 1, int(R * 1.05))
    return None if best is None else (best[1], best[2])


def _pour(groups: list[list[int]], p: list[int], r: list[int], R: int, width: int
          ) -> tuple[list[list[Segment]], list[int]] | None:
    """The groups poured into at most ``R`` rows of at most ``width`` positions (:func:`poured_rows`), or None."""
    out: list[list[Segment]] = [[]]
    fill = [0]
    for members in groups:
        cur: list[int] = []
        size = 0
        for i in members:
            add = r[i] + (0 if cur else p[i])
            if fill[-1] + size + add > width:  # the row is full: the group goes on in the next, behind its prompt
                if cur:
                    out[-1].append(Segment(cur[0], tuple(cur), size))
                    fill[-1] += size
                    cur, size, add = [], 0, r[i] + p[i]
                if len(out) == R or add > width:
                    return None
                out.append([])
                fill.append(0)
            cur.append(i)
            size += add
        if cur:
            out[-1].append(Segment(cur[0], tuple(cur), size))
            fill[-1] += size
    return out, fill


def _largest_first(mbs: list["MicroBatch"]) -> list["MicroBatch"]:
    """The micro-batches by positions computed, largest first (stable): the first pass of a step is its peak."""
    return sorted(mbs, key=lambda m: -m.tokens)


def _packed_mb(layout: str, rows: list[list[Segment]], fills: list[int]) -> MicroBatch:
    idx = [i for row in rows for s in row for i in s.responses]
    width = max(fills)
    return MicroBatch(layout, torch.tensor(idx, dtype=torch.long), rows, width, len(rows) * width, sum(fills))


def _plan_padded(p: list[int], r: list[int], budget: int | None) -> list[MicroBatch]:
    order = sorted(range(len(p)), key=lambda i: (-(p[i] + r[i]), i))
    out, cur, P, L = [], [], 0, 0

    def close():
        out.append(MicroBatch("padded", torch.tensor(cur, dtype=torch.long), [], P + L, len(cur) * (P + L),
                              sum(p[i] + r[i] for i in cur)))

    for i in order:
        P2, L2 = max(P, p[i]), max(L, r[i])
        if cur and budget is not None and (len(cur) + 1) * (P2 + L2) > int(budget):
            close()
            cur, P2, L2 = [], p[i], r[i]
        cur.append(i)
        P, L = P2, L2
    if cur:
        close()
    return out


def trim(prompt_ids, prompt_mask, response_ids, response_mask):
    """The same rows without the columns no row uses: leading prompt padding and trailing response positions past
    every row's last kept token (at least one column each)."""
    keep_p = int(prompt_mask.long().sum(-1).max()) if prompt_mask.numel() else 0
    _, r = lengths(prompt_mask, response_mask)
    keep_r = max(1, int(r.max())) if r.numel() else 1
    P = prompt_ids.shape[1]
    return (prompt_ids[:, P - max(keep_p, 1):], prompt_mask[:, P - max(keep_p, 1):], response_ids[:, :keep_r],
            response_mask[:, :keep_r])


@dataclass
class PackedInputs:
    """Decoder inputs of a packed or tree micro-batch, and where each response token's predicting position is.

    Attributes:
        input_ids, position_ids: (R, W).
        attention_mask: (R, 1, W, W) additive float mask (``tree``), or None (``packed``: the model derives the
            block-diagonal causal mask from ``position_ids``).
        src_row, src_col: (N,) the decoder position whose output predicts each response token.
        dst_row, dst_col: (N,) that token's place in the micro-batch's (b, L) output (b = len(rows)).
        targets: (N,) the response token ids.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    src_row: torch.Tensor
    src_col: torch.Tensor
    dst_row: torch.Tensor
    dst_col: torch.Tensor
    targets: torch.Tensor


def packed_inputs(mb: MicroBatch, prompt_ids, prompt_mask, response_ids, response_mask, pad_id: int = 0,
                  mask_dtype: torch.dtype = torch.float32) -> PackedInputs:
    """Build the decoder inputs of a ``packed`` or ``tree`` micro-batch (see :class:`PackedInputs`).

    In a ``tree`` row a prompt token attends to the earlier tokens of its prompt; a response token to its prompt and
    to its own earlier tokens; padding to itself (a row with nothing to attend to would give NaN). Positions count
    from 0 at each prompt, and a response's from its prompt's length, as in the padded layout.
    """
    device = response_ids.device
    p_len, r_len = lengths(prompt_mask, response_mask)
    P = prompt_ids.shape[1]
    out_index = {int(i): k for k, i in enumerate(mb.rows.tolist())}
    R, W = len(mb.packed_rows), mb.width
    ids = torch.full((R, W), int(pad_id), dtype=torch.long, device=device)
    pos = torch.zeros((R, W), dtype=torch.long, device=device)
    seg = torch.full((R, W), -1, dtype=torch.long, device=device)    # segment of each position (-1: padding)
    resp = torch.full((R, W), -1, dtype=torch.long, device=device)   # response of each position (-1: its prompt)
    src_row, src_col, dst_row, dst_col, targets = [], [], [], [], []
    n_seg = 0
    for j, row in enumerate(mb.packed_rows):
        c = 0
        for s in row:
            pi = s.prompt_row
            pl = int(p_len[pi])
            ids[j, c:c + pl] = prompt_ids[pi, P - pl:]
            pos[j, c:c + pl] = torch.arange(pl, device=device)
            seg[j, c:c + pl] = n_seg
            start = c + pl
            c = start
            for i in s.responses:
                rl = int(r_len[i])
                ids[j, c:c + rl] = response_ids[i, :rl]
                pos[j, c:c + rl] = torch.arange(pl, pl + rl, device=device)
                seg[j, c:c + rl] = n_seg
                resp[j, c:c + rl] = i
                # token t of the response is predicted by the position before it: the prompt's last for t = 0
                before = torch.arange(c - 1, c + rl - 1, device=device)
                before[0] = start - 1
                src_row.append(torch.full((rl,), j, dtype=torch.long, device=device))
                src_col.append(before)
                dst_row.append(torch.full((rl,), out_index[int(i)], dtype=torch.long, device=device))
                dst_col.append(torch.arange(rl, device=device))
                targets.append(response_ids[i, :rl])
                c += rl
                if mb.layout == "packed":
                    break
            n_seg += 1
        if c < W:  # the row's tail: padding, numbered on from 0 (a sequence of its own for the packed layout)
            pos[j, c:] = torch.arange(W - c, device=device)
    cat = (lambda xs: torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long, device=device))
    mask = None
    if mb.layout == "tree":
        q = torch.arange(W, device=device)
        causal = q.unsqueeze(0) <= q.unsqueeze(1)                                   # [query, key]: key <= query
        same_seg = seg.unsqueeze(2) == seg.unsqueeze(1)
        visible = (resp.unsqueeze(1) == -1) | (resp.unsqueeze(2) == resp.unsqueeze(1))
        pad = seg == -1
        allowed = causal & same_seg & visible & ~pad.unsqueeze(2) & ~pad.unsqueeze(1)
        allowed = allowed | (torch.eye(W, dtype=torch.bool, device=device) & pad.unsqueeze(2))
        mask = torch.zeros((R, 1, W, W), dtype=mask_dtype, device=device)
        mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(mask_dtype).min)
    return PackedInputs(ids, pos, mask, cat(src_row), cat(src_col), cat(dst_row), cat(dst_col),
                        cat(targets) if targets else torch.zeros(0, dtype=torch.long, device=device))
