"""Answer checking: extraction, math-verify in a process pool with timeouts, exact comparison, caching.

``is_correct(response, gold)`` and :class:`Verifier.check_many` score model outputs against gold
answers. The pipeline per response:

1. only the last ``MAX_RESPONSE_CHARS`` characters are kept (a 1 MB output costs nothing more);
2. the candidate answer is the content of the last ``\\boxed{}``/``\\fbox{}`` (nested braces kept),
   or, without one, the whitespace-normalised tail, from which math-verify extracts the final
   expression itself;
3. (candidate, gold) pairs are deduplicated and cached, so 256 samples with few distinct answers
   cost few verifications;
4. math-verify runs in worker *processes* (it times out with ``signal.alarm``, which does not work in
   threads): each item has its own timeout, and a worker stuck in C code (``9^{9^{9^{9}}}``) is
   killed and replaced, the item scoring incorrect;
5. where both sides parse to exact numbers (integers, rationals, factorials...), equality is exact:
   math-verify's float tolerance would accept 1/2004! for 1/2006!.

A malformed, adversarial or timed-out response scores incorrect; nothing here raises on model output.
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import re
from typing import Iterable

MAX_RESPONSE_CHARS = 4000      # only the tail of a response can hold its final answer
MAX_CANDIDATE_CHARS = 1000     # a boxed answer longer than this is not an answer
MAX_BRACE_DEPTH = 50           # deeper nesting is adversarial: incorrect without parsing
PARSE_TIMEOUT_S = 2
VERIFY_TIMEOUT_S = 2
ITEM_TIMEOUT_S = 6.0           # wall-clock bound per item, enforced by killing the worker

logging.getLogger("math_verify").setLevel(logging.CRITICAL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` with nested braces kept, or None."""
    starts = [text.rfind(tag) for tag in ("\\boxed", "\\fbox")]
    i = max(starts)
    if i < 0:
        return None
    j = text.find("{", i)
    if j < 0:
        return None
    depth = 0
    for pos in range(j, len(text)):
        ch = text[pos]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[j + 1:pos]
    return None


def _max_brace_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch == "{":
            depth += 1
            best = max(best, depth)
        elif ch == "}":
            depth = max(0, depth - 1)
    return best


def candidate_answer(response) -> tuple[str | None, bool]:
    """(candidate text, boxed?) for a response; (None, False) when there is nothing to check."""
    if not isinstance(response, str) or not response.strip():
        return None, False
    tail = response[-MAX_RESPONSE_CHARS:]
    boxed = last_boxed(tail)
    if boxed is not None:
        boxed = boxed.strip()
        if not boxed or len(boxed) > MAX_CANDIDATE_CHARS or _max_brace_depth(boxed) > MAX_BRACE_DEPTH:
            return None, True
        return boxed, True
    if _max_brace_depth(tail) > MAX_BRACE_DEPTH:
        return None, False
    return re.sub(r"\s+", " ", tail).strip(), False


# ----------------------------------------------------------------------------- worker side

def _exact_value(obj):
    """A sympy number without floats (exactly comparable), else None."""
    try:
        import sympy

        if isinstance(obj, sympy.Basic) and obj.is_number and not obj.atoms(sympy.Float):
            return obj
    except Exception:
        pass
    return None


def _check_one(item: tuple[str, bool, str]) -> tuple[bool, str | None]:
    """Worker: (candidate, boxed, gold) -> (correct, extracted answer)."""
    from math_verify import parse, verify

    candidate, boxed, gold = item
    try:
        pred = parse(f"\\boxed{{{candidate}}}" if boxed else candidate, parsing_timeout=PARSE_TIMEOUT_S)
    except BaseException:
        return False, None
    extracted = str(pred[-1]) if pred else None
    if not pred:
        return False, extracted
    gold_parsed = []
    for text in (f"\\boxed{{{gold}}}", f"${gold}$", gold):
        try:
            gold_parsed = parse(text, parsing_timeout=PARSE_TIMEOUT_S)
        except BaseException:
            gold_parsed = []
        if gold_parsed:
            break
    if not gold_parsed:
        return False, extracted
    try:
        ok = bool(verify(gold_parsed, pred, timeout_seconds=VERIFY_TIMEOUT_S))
    except BaseException:
        return False, extracted
    if ok:  # exact numbers on both sides: no float tolerance
        g, p = _exact_value(gold_parsed[0]), _exact_value(pred[0])
        if g is not None and p is not None:
            try:
                ok = bool((g - p).simplify() == 0)
            except BaseException:
                ok = False
    return ok, extracted


def _worker_init():
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (import once per worker)


# ----------------------------------------------------------------------------- parent side

class Verifier:
    """Checks (response, gold) pairs with math-verify in a pool of worker processes.

    Args:
        workers: worker processes (default 1: verification is cheap next to sampling).
        item_timeout_s: wall-clock bound per distinct (candidate, gold) pair.
    """

    def __init__(self, workers: int = 1, item_timeout_s: float = ITEM_TIMEOUT_S):
        self.workers, self.item_timeout_s = workers, item_timeout_s
        self._pool = None
        self.cache: dict[tuple, tuple[bool, str | None]] = {}
        self.timeouts = 0

    def _get_pool(self):
        if self._pool is None:
            # fork: no re-import of __main__ (spawn fails from notebooks and stdin); workers run only
            # math-verify and sympy, never torch, so forking a process that holds torch threads is safe
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._pool = mp.get_context(method).Pool(self.workers, initializer=_worker_init)
        return self._pool

    def close(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def check_many(self, responses: Iterable, golds: Iterable) -> list[tuple[bool, str | None]]:
        """[(correct, extracted answer)] for each (response, gold) pair, in order. Never raises on model output."""
        pairs = list(zip(responses, golds))
        keys, todo = [], {}
        for response, gold in pairs:
            cand, boxed = candidate_answer(response)
            key = None if cand is None or gold is None else (cand, boxed, str(gold))
            keys.append(key)
            if key is not None and key not in self.cache:
                todo[key] = None
        remaining = list(todo)
        while remaining:
            pool = self._get_pool()
            pending = [(key, pool.apply_async(_check_one, (key,))) for key in remaining]
            remaining = []
            for i, (key, res) in enumerate(pending):
                try:
                    # tasks start in submission order, so item i is running (or done) by now
                    self.cache[key] = res.get(timeout=self.item_timeout_s)
                except mp.TimeoutError:
                    # a worker is stuck (math-verify's own alarms cannot interrupt C code such as a
                    # huge power): incorrect; kill the pool and resubmit what had not finished
                    self.cache[key] = (False, None)
                    self.timeouts += 1
                    for other, r in pending[i + 1:]:
                        if r.ready() and r.successful():
                            self.cache[other] = r.get()
                        else:
                            remaining.append(other)
                    self.close()
                    break
                except Exception:
                    self.cache[key] = (False, None)
        return [(False, None) if key is None else self.cache[key] for key in keys]


_DEFAULT: Verifier | None = None


def default_verifier() -> Verifier:
    """The process-wide :class:`Verifier` (created on first use, closed at exit)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Verifier()
        atexit.register(_DEFAULT.close)
    return _DEFAULT


def check_answer(response: str, gold: str) -> tuple[bool, str | None]:
    """(correct, extracted answer or None) for one response; see :func:`is_correct`."""
    return default_verifier().check_many([response], [gold])[0]


def is_correct(response: str, gold: str) -> bool:
    """True when ``response``'s final answer equals ``gold``.

    Args:
        response: model output, any string (only its tail is read).
        gold: the reference answer (``"7"``, ``"\\frac{1}{2}"``, ``"1331 and 1728"``).
    Returns:
        bool; False for empty, unparsable, adversarial or timed-out output (never raises).
    Source: math-verify (Hugging Face) for parsing and symbolic equality; exact comparison of exact numbers.
    """
    return check_answer(response, gold)[0]
