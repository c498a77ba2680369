"""Answer checking: math-verify's reading of a response, with its known misreadings fixed, in a process pool with timeouts.

``is_correct(response, gold)`` and :class:`Verifier.check_many` score model outputs against gold
answers. Every check returns two verdicts: this project's (``correct``) and plain math-verify's
(``reference``: ``verify(parse(G), parse(tail))`` with ``G`` the gold as written, or ``$gold$`` when it
has no math delimiters), so an evaluation can report how often the grader choice moves a number (the
disagreement audit, :mod:`evaluation.tables`). The pipeline per response:

1. only the last ``MAX_RESPONSE_CHARS`` characters are kept (a 1 MB output costs nothing more); a tail
   nested deeper than ``MAX_BRACE_DEPTH`` braces is adversarial and scores incorrect unparsed;
2. the gold is parsed the way it is written: ``$gold$`` first (or as written when it has ``$``,
   ``\\(``, ``\\[`` or ``\\boxed``), then ``\\boxed{gold}``, then the bare text. ``\\boxed{...}`` around a
   gold such as ``\\frac{1}{3}E_1+\\frac{2}{3}E_2`` parses to the fragment ``2/3``, and ``\\boxed{28\\%}``
   to a string;
3. the response is read by math-verify's own extraction (boxed answers first, then "final answer is",
   then the last expression), after two rewrites: ``\\fbox{`` is read as ``\\boxed{`` and a brace-less
   ``\\boxed 5`` as ``\\boxed{5}`` (math-verify skips both and reads a later expression instead);
4. several boxed answers: math-verify reads every box of a response as one set. That reading is kept when
   the gold is itself a set or a list of tuples (``(2,1),(1,2)`` against ``\\boxed{(1, 2)}, \\boxed{(2, 1)}``);
   otherwise only the last box is the answer (a response that boxes an intermediate value and then its
   final answer is judged by the final one);
5. where math-verify accepts and both sides are exact numbers (integers, rationals, factorials, radicals),
   equality is checked exactly, because math-verify's float tolerance accepts ``1/2004!`` for ``1/2006!``:
   equal objects (infinities included) are equal at once, two rationals compare exactly, anything else by
   a 60-digit evaluation of the difference and, when that vanishes, its minimal polynomial, all under a
   1 s alarm; a check that runs out of time keeps math-verify's verdict. No unbounded ``simplify()`` runs.
   Numerals written in a base (``52_8``) must name the same base digits as the gold: math-verify reads
   ``52_9`` as 52 and accepts it; a final box and the gold that both state the power of their unit must state
   the same (math-verify drops units: ``864 \\mbox{ inches}^3`` would pass for ``^2``, :func:`_unit_power`). A gold that math-verify reads
   as one of its numbers because its LaTeX reading failed (:func:`_is_fragment`) passes only answers whose final
   box (else last line) writes the same numbers in the same order (math-verify's verdict on ``...\\omega^{3}`` for ``...\\omega^{2}`` is 2 = 2), and
   a gold's sentence period (``...\\{1\\}$.``) is dropped before reading (inside the math it stops the reading);
6. (tail, gold) pairs are deduplicated and cached; math-verify runs in worker *processes* (its timeouts
   use ``signal.alarm``, which does not work in threads), each item with a wall-clock bound; a worker stuck
   in C code (``9^{9^{9^{9}}}``) is killed and replaced, the item scoring incorrect.

A malformed, adversarial or timed-out response scores incorrect; nothing here raises on model output.
Source: math-verify (Hugging Face, https://github.com/huggingface/Math-Verify) for parsing and equality;
the rewrites, the box reading and the exact check are this project's (README, "Answer verification").
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import re
from typing import Iterable, NamedTuple

MAX_RESPONSE_CHARS = 4000      # only the tail of a response can hold its final answer
MAX_BRACE_DEPTH = 50           # deeper nesting is adversarial: incorrect without parsing
PARSE_TIMEOUT_S = 2
VERIFY_TIMEOUT_S = 2
EXACT_TIMEOUT_S = 1            # the exact comparison's budget; past it, math-verify's verdict stands
EXACT_DIGITS = 60              # digits of the numerical check of two non-rational exact numbers
ITEM_TIMEOUT_S = 10.0          # wall-clock bound per item (two parses and verifies at most), by killing the worker

logging.getLogger("math_verify").setLevel(logging.CRITICAL)

_BOX_TAG = re.compile(r"\\(?:boxed|fbox)\b")
_FBOX = re.compile(r"\\fbox(?=\s*\{)")
_BARE_BOXED = re.compile(r"\\boxed[ \t]+(-?[0-9A-Za-z]+(?:\.[0-9]+)?)")
_PERCENT = re.compile(r"\\?%\s*$")
_BASE_NUMBER = re.compile(r"(\d+)_\{?(\d+)\}?")   # 52_8, 4210_{5}: a numeral in a base


class Check(NamedTuple):
    """One verdict: ``correct`` (this project's), ``extracted`` (the answer read, for the samples table and
    answer modes; None when none), ``reference`` (plain math-verify's verdict; None when not computed)."""

    correct: bool
    extracted: str | None
    reference: bool | None = None


INCORRECT = Check(False, None, False)
NO_ANSWER = "\x00no answer"  # Verifier.check_many's answer for a response with no answer in the asked form


def _box_spans(text: str) -> list[tuple[int, int, str, bool]]:
    """(start, end, content, braced) of every ``\\boxed{...}``/``\\fbox{...}`` (brace right after the tag, nested braces
    kept) and brace-less ``\\boxed 5`` in ``text``, in order."""
    spans, pos = [], 0
    while True:
        m = _BOX_TAG.search(text, pos)
        if m is None:
            return spans
        j = m.end()
        while j < len(text) and text[j] in " \t":
            j += 1
        if j < len(text) and text[j] == "{":
            depth = 0
            for k in range(j, len(text)):
                if text[k] == "{":
                    depth += 1
                elif text[k] == "}":
                    depth -= 1
                    if depth == 0:
                        spans.append((m.start(), k + 1, text[j + 1:k], True))
                        break
            else:
                return spans          # unclosed box: nothing after it is a box either
            pos = spans[-1][1]
        else:
            bare = _BARE_BOXED.match(text, m.start())
            if bare:
                spans.append((m.start(), bare.end(), bare.group(1), False))
            pos = m.end()


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (or brace-less ``\\boxed 5``) in ``text``, nested braces
    kept, or None. The brace must follow the tag: ``\\boxed 5. Then $\\frac{1}{2}$`` is ``5``, not ``1``."""
    spans = _box_spans(text)
    return spans[-1][2] if spans else None


def box_contents(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}``/``\\fbox{...}`` (and brace-less ``\\boxed 5``) in ``text``, in order, as
    :func:`last_boxed` reads them: the boxes a checker may take as the final answer (:mod:`core.tasks.answer_forms`)."""
    return [content for _, _, content, _ in _box_spans(str(text or ""))]


def _max_brace_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch == "{":
            depth += 1
            best = max(best, depth)
        elif ch == "}":
            depth = max(0, depth - 1)
    return best


def response_tail(response) -> str | None:
    """The part of ``response`` that is checked (its last ``MAX_RESPONSE_CHARS`` characters), or None when there
    is nothing to check: not a string, blank, or nested deeper than ``MAX_BRACE_DEPTH`` braces."""
    if not isinstance(response, str) or not response.strip():
        return None
    tail = response[-MAX_RESPONSE_CHARS:]
    if _max_brace_depth(tail) > MAX_BRACE_DEPTH:
        return None
    return tail


_DELIMITED = re.compile(r"^\s*(?:\$|\\\(|\\\[)|\\boxed")
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}'?[a-z]*[.,;:]?\s+[A-Za-z]{2,}\s+[A-Za-z]{2,}")  # three words in a row


def gold_texts(gold: str) -> list[str]:
    """The gold's readings in the order they are tried: as written when it is delimited LaTeX (starts with
    ``$``, ``\\(`` or ``\\[``, or holds ``\\boxed``) or prose with math inside (``The answer is $5$``),
    else ``$gold$`` with the gold's own stray ``$`` removed (OlympiadBench writes lists as ``69$,$84``, and
    some golds end in ``$.``); then ``\\boxed{gold}``; then the bare text. The first is plain math-verify's
    reading (the reference verdict); this project's reading tries one before it (:func:`_own_gold_texts`)."""
    g = str(gold).strip()
    first = g if _as_written(g) else "$" + re.sub(r"(?<!\\)\$", "", g) + "$"
    return list(dict.fromkeys([first, f"\\boxed{{{g}}}", g]))


def _as_written(g: str) -> bool:
    return bool(_DELIMITED.search(g) or (re.search(r"(?<!\\)\$", g) and _PROSE.search(g)))


def _own_gold_texts(gold: str) -> list[str]:
    """This project's readings of a gold: :func:`gold_texts`, after, for a gold ending in ``$.`` (a sentence's
    period: ``(-\\infty, 0) \\cup\\{1\\}$.``), the math without that period, which inside the math stops the
    reading (math-verify then falls back to the number 0)."""
    g = str(gold).strip()
    texts = gold_texts(g)
    if g.endswith("$.") and not _as_written(g):
        texts.insert(0, "$" + re.sub(r"(?<!\\)\$", "", g[:-2]) + "$")
    return list(dict.fromkeys(texts))


# ----------------------------------------------------------------------------- worker side

_GOLD_CACHE: dict[str, tuple[list, list]] = {}


def _parse(text: str) -> list:
    from math_verify import parse

    try:
        return parse(text, parsing_timeout=PARSE_TIMEOUT_S)
    except BaseException:
        return []


def _verify(gold: list, pred: list) -> bool:
    from math_verify import verify

    if not gold or not pred:
        return False
    try:
        return bool(verify(gold, pred, timeout_seconds=VERIFY_TIMEOUT_S))
    except BaseException:
        return False


def _golds(gold: str) -> tuple[list, list, list | None]:
    """(this project's parse, plain math-verify's parse, the numbers the gold writes when math-verify read it as
    one of them (:func:`_is_fragment`), else None) of a gold, cached per worker."""
    if gold not in _GOLD_CACHE:
        plain_text, texts = gold_texts(gold)[0], _own_gold_texts(gold)
        plain = _parse(plain_text)
        ours, read = [], None
        for text in texts:
            ours, read = (plain if text == plain_text else _parse(text)), text
            if ours:
                break
        fragment = _is_fragment(ours, read)
        if len(_GOLD_CACHE) > 10_000:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[gold] = (ours, plain, _NUMBER.findall(read) if fragment else None)
    return _GOLD_CACHE[gold]


_UNITS = re.compile(r"\\(?:mbox|text|textrm|mathrm)\s*\{([^{}]*[A-Za-z][^{}]*)\}(?:\s*\^\s*\{?\s*(-?\d+)\s*\}?)?")
_PLAIN_NUMBER = re.compile(r"-?\d*\.?\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_NOT_NUMBER = re.compile(r"\\[%!,;: ]|\\(?:left|right|displaystyle)\b|[$%\s{}]|\.$")


def _is_fragment(parsed: list, text: str) -> bool:
    """True when math-verify read a gold's expression as one of its numbers: its LaTeX reading failed
    (``E_{0}^{2}`` in ``\\hbar\\omega(v+1/2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}`` stops it) and its fallback
    took a number from the text (2), so that any expression holding that number would be accepted. A gold that
    is just a number (``10\\%``, ``$100%$``, ``5 \\text{ cm}``) is not a fragment."""
    import sympy

    if not parsed or not isinstance(parsed[0], sympy.Basic) or not parsed[0].is_number:
        return False
    if _PLAIN_NUMBER.fullmatch(_NOT_NUMBER.sub("", _UNITS.sub("", text.replace("\\boxed", "")))):
        return False
    from math_verify import LatexExtractionConfig, parse

    try:
        return not any(isinstance(x, sympy.Basic) for x in parse(text, extraction_config=[LatexExtractionConfig()],
                                                                  parsing_timeout=PARSE_TIMEOUT_S))
    except BaseException:
        return False


def _unit_power(text: str | None) -> int | None:
    """The power an answer states for its one unit (``\\mbox{ inches}^2``, ``\\text{cm^{3}}``: 2 and 3; ``\\text{square
    feet}``: 2; ``\\text{cubic m}``: 3), None when it states none (``\\text{ cm}``, ``\\text{ cc}``), names no unit, or
    writes several or a compound one (``\\mathrm{~kg} \\mathrm{~m}^{-2}``, ``\\text{kg/m}^2``): only two stated powers are
    compared. math-verify drops units, so ``864 \\mbox{ inches}^3`` reads as 864 and would pass for
    ``864 \\mbox{ inches}^2``: an area is not a volume."""
    found = list(_UNITS.finditer(text or ""))
    if len(found) != 1:
        return None
    word, outside = found[0].group(1).strip(), found[0].group(2)
    inside = re.fullmatch(r"(.*?)\^\s*\{?\s*(-?\d+)\s*\}?", word)
    if inside:
        word, outside = inside.group(1).strip(), outside or inside.group(2)
    if "/" in word or (outside and outside.startswith("-")):
        return None
    if outside:
        return int(outside)
    lower = word.lower()
    return 2 if lower.startswith(("square ", "sq ", "sq. ")) else 3 if lower.startswith("cubic ") else None


def _is_set_answer(parsed: list) -> bool:
    """True when a parsed gold is a set of several elements (``1, 2``; ``(2,1),(1,2)``)."""
    import sympy

    return bool(parsed) and isinstance(parsed[0], sympy.FiniteSet) and len(parsed[0].args) > 1


def _exact_value(obj):
    """A sympy number without floats (exactly comparable), else None."""
    try:
        import sympy

        if isinstance(obj, sympy.Basic) and obj.is_number and not obj.atoms(sympy.Float):
            return obj
    except Exception:
        pass
    return None


class _Alarm(Exception):
    pass


def _exactly_equal(g, p) -> bool | None:
    """Exact equality of two exact sympy numbers: True/False, or None when it cannot be decided within
    ``EXACT_TIMEOUT_S`` (the caller keeps math-verify's verdict). Never calls ``simplify()``.

    Order: equal objects (infinities included: ``oo - oo`` is nan) are equal; two rationals compare exactly
    (``1/2004!`` and ``1/2006!`` differ); otherwise the difference is evaluated to ``EXACT_DIGITS`` digits
    (a relative difference above ``10^(10 - EXACT_DIGITS)`` is a difference), and a difference that vanishes
    to that precision is proved zero by its minimal polynomial when the numbers are algebraic (radicals);
    a transcendental difference that vanishes numerically counts as equal.
    """
    import signal

    import sympy

    try:
        if g == p:
            return True
        if g.is_Rational and p.is_Rational:
            return False
    except Exception:
        return None

    def on_alarm(signum, frame):
        raise _Alarm

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, EXACT_TIMEOUT_S)
            diff = sympy.N(g - p, EXACT_DIGITS)
            scale = max(abs(sympy.N(g, EXACT_DIGITS)), abs(sympy.N(p, EXACT_DIGITS)))
            if not (diff.is_number and scale.is_number) or diff.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
                return None
            if abs(diff) > scale * sympy.Float(10) ** (10 - EXACT_DIGITS):
                return False
            x = sympy.Dummy("x")
            try:
                return sympy.minimal_polynomial(g - p, x) == x
            except (sympy.polys.polyerrors.NotAlgebraic, NotImplementedError):
                return True
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException:   # out of time (_Alarm) or sympy failed: undecided
        return None
    finally:
        signal.signal(signal.SIGALRM, old)


def _check_one(item: tuple) -> Check:
    """Worker: (response tail, gold[, answer]) -> :class:`Check`. ``answer``: the text this project's verdict reads (the
    final answer a task's answer form took from the response, :mod:`core.tasks.answer_forms`), the tail itself when
    absent; ``NO_ANSWER``: no answer in the asked form, incorrect (the reference verdict still reads the tail)."""
    tail, gold = item[0], item[1]
    answer = item[2] if len(item) > 2 else tail
    gold_ours, gold_plain, gold_numbers = _golds(gold)
    pred_plain = _parse(tail)
    reference = _verify(gold_plain, pred_plain)
    if answer == NO_ANSWER:
        return Check(False, None, bool(reference))
    whole = answer == tail  # this project's verdict reads the whole response (else only the answer a form read)
    if not whole:
        tail, pred_plain = answer, _parse(answer)

    text = _FBOX.sub(r"\\boxed", tail)
    spans = _box_spans(text)
    if len(spans) > 1 and _is_set_answer(gold_ours):
        # a set gold: every box is read, as math-verify reads them (one set)
        text = _BARE_BOXED.sub(lambda m: f"\\boxed{{{m.group(1)}}}", text)
    elif spans:
        _, end, content, braced = spans[-1]
        percent = _PERCENT.search(content) is not None
        stray = re.search(r"(?<!\\)\$", content) is not None
        if stray:  # a box closing over a math delimiter (\boxed{x$.}): the box is the math, its $ stray
            content = re.sub(r"(?<!\\)\$", "", re.sub(r"(?<!\\)\$\.\s*$", "", content))
        if len(spans) > 1 or not braced or percent or stray:
            # the last box alone, with what follows it; a percentage as inline math (math-verify 0.9 reads
            # \boxed{28\%} as a string, $28\%$ as the number 28)
            text = (f"${content}$" if percent else f"\\boxed{{{content}}}") + text[end:]
    pred = pred_plain if text == tail else _parse(text)
    extracted = str(pred[-1]) if pred else None
    ok = reference if (whole and pred is pred_plain and gold_ours is gold_plain) else _verify(gold_ours, pred)
    if ok and extracted is not None:
        # math-verify drops a base subscript (52_8 reads as 52): numerals in bases must name the same bases
        gold_bases, pred_bases = _BASE_NUMBER.findall(gold), _BASE_NUMBER.findall(extracted)
        if gold_bases and pred_bases and gold_bases != pred_bases:
            ok = False
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    answer = spans[-1][2] if spans else (lines[-1] if lines else "")  # the final box as written, else the last line
    if ok and gold_numbers is not None and _NUMBER.findall(answer) != gold_numbers:
        ok = False  # math-verify read the gold as one of its numbers: an answer writing other numbers is not it
    if ok and spans:  # a final box and the gold stating different powers of their unit (an area against a volume)
        gold_power = _unit_power(gold)
        pred_power = _unit_power(answer)
        if gold_power is not None and pred_power is not None and gold_power != pred_power:
            ok = False
    if ok:  # exact numbers on both sides: no float tolerance
        g, p = _exact_value(gold_ours[0]), _exact_value(pred[0])
        if g is not None and p is not None:
            exact = _exactly_equal(g, p)
            if exact is not None:
                ok = exact
    return Check(bool(ok), extracted, bool(reference))


def _die_with_parent() -> None:
    """Linux: deliver SIGTERM to this worker when its parent dies (kill -9 of a sweep leaves no verifier behind)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _exit_on_sigterm(signum, frame):
    """A pool worker's SIGTERM: release any cross-process lock of the pool's queues this worker holds, then exit at
    once. An idle worker blocks in the task queue's get() holding its read lock, and a signal can land in the instant
    after it acquired the lock but before the ``with`` block that would release it on an exception: exiting by
    raising then still left the lock held about one time in three, and Pool.terminate() waited on it
    for ever. So the handler finds the queues in multiprocessing's ``worker`` frame and releases what is its own."""
    import os

    f = frame
    while f is not None and not (f.f_code.co_name == "worker" and f.f_code.co_filename.endswith("pool.py")):
        f = f.f_back
    if f is not None:
        for queue in (f.f_locals.get("inqueue"), f.f_locals.get("outqueue")):
            for name in ("_rlock", "_wlock"):
                lock = getattr(queue, name, None)
                sem = getattr(lock, "_semlock", None)
                try:
                    if sem is not None and sem._is_mine():
                        lock.release()
                except (OSError, ValueError, AttributeError):
                    pass
    os._exit(0)


def _worker_init():
    import signal

    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the sweep's stop handler is inherited by fork: not here. SIGTERM (from the pool's terminate(), the parent's
    # death, or a signal to the whole process group: pkill -f, scancel) releases the queue locks this worker holds
    # and exits: killed with the default action, a worker blocked in the task queue's get() kept that queue's lock,
    # and the parent's Pool.terminate() then waited on it for ever (a stopped sweep that never exited)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # nor SLURM's preemption signal, sent to every process of the job
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (import once per worker)

    # build math-verify's readers (the LaTeX grammar, sympy's caches: 0.45 s on an idle 2-core EPYC) here, not inside
    # the first item's alarm, which on a loaded machine they could use up (the item then reads as nothing)
    _verify(_parse("$\\frac{1}{2} \\in [-2, 7]$"), _parse("\\boxed{x \\in [-2, 7]}"))


# ----------------------------------------------------------------------------- parent side

class Verifier:
    """Checks (response, gold) pairs with math-verify in a pool of worker processes.

    Args:
        workers: worker processes (default 1: verification is cheap next to sampling).
        item_timeout_s: wall-clock bound per distinct (response tail, gold) pair.
    Attributes:
        cache: {(tail, gold): Check}; ``lookups`` and ``hits`` count :meth:`check_many`'s pairs and those
            answered from the cache (or by another identical pair of the same call); ``timeouts`` the items
            whose worker was killed.
    """

    def __init__(self, workers: int = 1, item_timeout_s: float = ITEM_TIMEOUT_S):
        self.workers, self.item_timeout_s = workers, item_timeout_s
        self._pool = None
        self.cache: dict[tuple[str, str], Check] = {}
        self.timeouts = self.lookups = self.hits = 0

    def _get_pool(self):
        if self._pool is None:
            # fork: no re-import of __main__ (spawn fails from notebooks and stdin); workers run only
            # math-verify and sympy, never torch, so forking a process that holds torch threads is safe
            method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
            self._pool = mp.get_context(method).Pool(self.workers, initializer=_worker_init)
        return self._pool

    def close(self, grace_s: float = 2.0):
        """Stop the workers with Pool.terminate() (SIGTERM: each releases the queue locks it holds and exits,
        :func:`_exit_on_sigterm`), while a reaper thread SIGKILLs any worker still alive every ``grace_s`` once the
        pool's worker handler has stopped: a worker stuck in C code (an item that timed out, such as a huge power)
        runs no Python signal handler until that code returns, and terminate() joined it for ever (a 600 s test
        time-out on a loaded 2-core machine). Nothing is killed before the handler stops: it would start
        new workers behind our back (forked from a threaded process, they hung)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        import os
        import signal
        import threading

        done = threading.Event()

        def reap():
            while not done.wait(grace_s):
                handler = getattr(pool, "_worker_handler", None)
                if handler is not None and handler.is_alive():
                    continue
                for p in list(getattr(pool, "_pool", []) or []):
                    if p.exitcode is None:
                        try:
                            os.kill(p.pid, signal.SIGKILL)
                        except (ProcessLookupError, TypeError):
                            pass

        reaper = threading.Thread(target=reap, name="verifier-reaper", daemon=True)
        reaper.start()
        try:
            pool.terminate()
            pool.join()
        finally:
            done.set()

    def check_many(self, responses: Iterable, golds: Iterable, answers: Iterable | None = None) -> list[Check]:
        """A :class:`Check` for each (response, gold) pair, in order. Never raises on model output: a response
        that is not a string, is blank, adversarially nested or times out gets ``Check(False, None, False)``.

        ``answers`` (optional, one per pair): the text this project's verdict judges instead of the response (the final
        answer a task's answer form read, :mod:`core.tasks.answer_forms`), None for no answer in the asked form
        (incorrect); the reference verdict (plain math-verify's) always reads the response. Without ``answers`` every
        response is judged whole, as math-verify's own test suite is run through this class."""
        keys, todo = [], {}
        responses, golds = list(responses), list(golds)
        answers = list(answers) if answers is not None else list(responses)
        for response, gold, answer in zip(responses, golds, answers):
            tail = response_tail(response)
            answer = NO_ANSWER if answer is None else (response_tail(answer) or NO_ANSWER)
            key = None if tail is None or gold is None else (
                (tail, str(gold)) if answer == tail else (tail, str(gold), answer))
            keys.append(key)
            if key is None:
                continue
            self.lookups += 1
            if key in self.cache or key in todo:
                self.hits += 1
            else:
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
                    self.cache[key] = INCORRECT
                    self.timeouts += 1
                    for other, r in pending[i + 1:]:
                        if r.ready() and r.successful():
                            self.cache[other] = r.get()
                        else:
                            remaining.append(other)
                    self.close()
                    break
                except Exception:
                    self.cache[key] = INCORRECT
        return [INCORRECT if key is None else self.cache[key] for key in keys]


_DEFAULT: Verifier | None = None


def default_verifier() -> Verifier:
    """The process-wide :class:`Verifier` (created on first use, closed at exit)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Verifier()
        atexit.register(_DEFAULT.close)
    return _DEFAULT


def check_answer(response: str, gold: str) -> Check:
    """The :class:`Check` of one response (correct, extracted answer, plain math-verify's verdict); see
    :func:`is_correct`."""
    return default_verifier().check_many([response], [gold])[0]


def is_correct(response: str, gold: str) -> bool:
    """True when ``response``'s final answer equals ``gold``.

    Args:
        response: model output, any string (only its tail is read).
        gold: the reference answer (``"7"``, ``"\\frac{1}{2}"``, ``"1331 and 1728"``, ``"$x=5$"``).
    Returns:
        bool; False for empty, unparsable, adversarial or timed-out output (never raises).
    Source: math-verify (Hugging Face) for parsing and symbolic equality; the module docstring lists where
    this differs from plain math-verify.
    """
    return check_answer(response, gold).correct
