"""Answer checking with math-verify.

``is_correct(response, gold)`` parses the response (math-verify finds the final expression, a
``\\boxed{}`` answer first) and compares it with the gold answer. Anything that goes wrong (an
unparsable or adversarial response, a parser timeout) scores incorrect, never raises.

math-verify times out with ``signal.alarm``, which works only in the main thread; call this from
the main thread of a process (training and evaluation do).
"""
from __future__ import annotations

import functools
import logging

MAX_RESPONSE_CHARS = 4000  # only the tail of a response can hold its final answer
PARSE_TIMEOUT_S = 3
VERIFY_TIMEOUT_S = 3

logging.getLogger("math_verify").setLevel(logging.CRITICAL)


@functools.lru_cache(maxsize=65536)
def _parse_gold(gold: str):
    from math_verify import parse

    for text in (f"\\boxed{{{gold}}}", f"${gold}$", gold):
        try:
            parsed = parse(text, parsing_timeout=PARSE_TIMEOUT_S)
        except Exception:
            parsed = []
        if parsed:
            return parsed
    return []


@functools.lru_cache(maxsize=262144)
def _check(response_tail: str, gold: str) -> tuple[bool, str | None]:
    from math_verify import parse, verify

    try:
        pred = parse(response_tail, parsing_timeout=PARSE_TIMEOUT_S)
    except Exception:
        return False, None
    extracted = str(pred[-1]) if pred else None
    gold_parsed = _parse_gold(gold)
    if not gold_parsed or not pred:
        return False, extracted
    try:
        return bool(verify(gold_parsed, pred, timeout_seconds=VERIFY_TIMEOUT_S)), extracted
    except Exception:
        return False, extracted


def check_answer(response: str, gold: str) -> tuple[bool, str | None]:
    """(correct, extracted answer string or None) for one response; see :func:`is_correct`."""
    if not isinstance(response, str) or not response.strip() or gold is None:
        return False, None
    return _check(response[-MAX_RESPONSE_CHARS:], str(gold))


def is_correct(response: str, gold: str) -> bool:
    """True when ``response``'s final answer equals ``gold`` (math-verify, symbolic equality).

    Args:
        response: model output (any string; only its last ``MAX_RESPONSE_CHARS`` characters are parsed).
        gold: the reference answer as a string (``"7"``, ``"\\frac{1}{2}"``).
    Returns:
        bool; False for empty, unparsable or timed-out inputs (never raises).
    """
    return check_answer(response, gold)[0]
