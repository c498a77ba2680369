"""Answer forms: which part of a response is its final answer, in the form the prompt asks for.

A checker pays for the answer the prompt asks for, never for restating the prompt. math-verify alone reads the last
expression it can find, so "To solve 0 + 8," was correct for gold 8 and "5 + 4 = 11. This is the only integer answer
to 5 + 4." for gold 9 (issue 55). Grading is therefore two layers, kept apart:

1. the task's **answer form** (this module) reads the final answer out of the response, in the form the template in
   effect asks for, and says what it found (:class:`Answer`: the text, a status, and what the verifier reads);
2. the verifier (:mod:`core.verify`) judges that answer against the gold, exactly as before.

Two forms are registered (:data:`ANSWER_FORMS`); a task names its own (``Task.answer_form``) and a template that asks
for ``\\boxed{}`` always means ``boxed`` (:func:`form_of`):

``boxed`` (the math benchmarks and the MATH-style training sets, whose templates ask for ``\\boxed{}``)
    The final answer is the content of the last ``\\boxed{}`` (or ``\\fbox{}``; every box when several are given and the
    gold is a list, as the verifier reads them). Without a box, the documented fallback is the text after the last
    "answer is" or "answer:" up to the end of its sentence or line ("The final answer is $\\frac{1}{2}$."); without
    either the response has no answer in the asked form (``missing``: no credit).
``number`` (``arithmetic``, whose template says "Answer with just the number")
    The final answer is a number stated as a value: the last ``\\boxed{}`` when there is one (it must hold a number
    literal, optionally after ``... =``), else the last number literal of the response that is not an operand of an
    arithmetic operator. A literal is an operand when nothing but operators stands between it and the number before or
    after it: the symbols + - * / ^ x (and their LaTeX and Unicode forms: ``\\times``, ``\\cdot``, ``\\oplus``, ×, ∗,
    ⋅, •, ＋, ...) and the words plus, minus, times, by, over, and, to, from, of, with, than, more, less, add,
    multiplied, divided, added, subtracted ("3 + 5", "add 5 to 4", "the sum of 2 and 3"); spaces, LaTeX spacing,
    ``\\text{}``, ``$``, ``&``, commas, periods, brackets and Markdown's ``**`` are ignored, and a line break is never
    an operator. The value is then judged alone (not the response around it). "5 + 4 = 9" states 9 (after "="); "The
    answer is -3" states -3 (a sign, not an operator, after a word); "9 (5 + 4)" states 9; "To solve 0 + 8," states
    nothing.

Both forms then refuse, with no credit, an answer that

- **restates the prompt** (``restated``): an expression (it applies an operator, ``|x|``, ``\\lfloor``, ``\\gcd``,
  ``\\binom``, ``\\max``, ``\\mod`` included; a leading sign does not count) whose numbers, letters and operators,
  in any order and in any of their spellings (``6/3``, ``6 \\div 3`` and ``\\frac{6}{3}`` are one), are those of a
  stretch of the prompt's math between two words ("0 + 8", "8 + 0", "$2^3 + 1$", "1 + 2^3" for "What is $2^3 + 1$?"),
  unless it is the gold as written, in any order (a problem whose answer is one of its own expressions); or
- **is an expression where a value is asked** (``not_a_value``): it applies an arithmetic operation (+, binary -, x,
  ^, !) directly to two bare numbers (or a number's factorial) where the gold as written does not ("3 + 5" for 8,
  "2^{10}" for 1024, "6 \\cdot 2" for 12; "2^{10}" stays right for the gold "2^{10}"); a number is not bare when it
  is a root's, a power's or a fraction's argument, a term's coefficient or a unit's power ("\\sqrt{2}+1", "-4+5i",
  "25\\text{ cm}^2" are values). Fractions and radicals are values ("\\frac{1}{2}" for 0.5, "\\sqrt{12}" for
  "2\\sqrt{3}").

A statement "expression = value" is read by its right-hand side ("\\boxed{3 + 5 = 8}" states 8). The statuses are kept
per sample (``answer_status`` in ``samples.parquet``), counted as the ``format_miss`` share and the echoes the grader
refused, in the evaluation metrics and the grader audit (:mod:`evaluation.tables.verifier`), and in training
(``train/format_miss``, ``train/echo_share``).

Source: this suite (issue 55). Peers' readings, for comparison: Qwen2.5-Math's evaluation takes the last box, else
the last number (which pays "To solve 0 + 8," for 8); verl's math reward takes the last box and nothing else;
lighteval and math-verify take the last expression (which pays any restatement).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from core.plugins import Registry

STATED, MISSING, RESTATED, NOT_A_VALUE = "stated", "missing", "restated", "not_a_value"
#: every status; ``stated`` is the only one the verifier judges (the others score 0)
STATUSES = (STATED, MISSING, RESTATED, NOT_A_VALUE)
#: statuses of an answer that was refused because it echoes the prompt or is an unevaluated expression
ECHOES = (RESTATED, NOT_A_VALUE)


@dataclass(frozen=True)
class Answer:
    """What an answer form read in one response: ``text`` (the final answer as written; None when there is none in
    the asked form), ``status`` (one of :data:`STATUSES`) and ``verify`` (the text the verifier judges against the gold
    for this suite's verdict; None: no credit)."""

    text: str | None
    status: str
    verify: str | None = None


class AnswerForm:
    """Base class of a registered answer form: ``name`` and :meth:`read`."""

    name: str = ""

    def read(self, response: str, prompt: str, gold: str) -> Answer:
        """The final answer of ``response`` to ``prompt`` (whose gold is ``gold``). Never raises on model output."""
        raise NotImplementedError


ANSWER_FORMS: Registry[AnswerForm] = Registry("answer form")


def register_form(form: AnswerForm) -> AnswerForm:
    """Register an :class:`AnswerForm` instance under its ``name`` (a plug-in task may add its own)."""
    return ANSWER_FORMS.register(form.name, form)


# ----------------------------------------------------------------------------- reading math text

_NUMBER_RAW = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,]*\d)|\d+(?:\.\d+)?")
#: what makes two number literals one expression when it is all that stands between them (after :data:`_NORMALISE`)
_OPERATOR_GAP = re.compile(
    r"(?:[+\-*/^x]|\\pm|\\oplus|plus|minus|times|by|over|and|to|from|of|with|than|more|less|add|multiplied|divided"
    r"|added|subtracted)+")
_IGNORED_IN_GAP = re.compile(r"\\left|\\right|[\s$(){}\[\]&,.]")
_NORMALISE = [
    (re.compile(r"\\(?:text|mbox|mathrm|textbf|textit|operatorname|mathbin|mathrm)\s*\{([^{}]*)\}"), r" \1 "),
    (re.compile(r"\\(?:left|right|displaystyle|bigl?|bigr?|Bigl?|Bigr?)\b"), " "),
    (re.compile(r"\\(?:q?quad)\b|\\[!,;: ]|~|\$|\\\(|\\\)|\\\[|\\\]"), " "),
    (re.compile(r"\\[dt]frac\b"), r"\\frac"),
    (re.compile(r"\\[dt]binom\b"), r"\\binom"),
    (re.compile(r"\\(?:lvert|rvert|vert|mid)\b|\\\||∣"), "|"),
    (re.compile(r"\*\*(?=\s*\d)"), "^"),            # 2**3 (Python's power); Markdown's **bold** is dropped below
    (re.compile(r"\*\*"), " "),
    (re.compile(r"\\times\b|\\cdot\b|\\ast\b|[×·∙∗⋅•✕✖]"), "*"),
    (re.compile(r"\\div\b|÷"), "/"),
    (re.compile(r"\\oplus\b|[＋➕]"), "+"),
    (re.compile(r"[−–]"), "-"),
]
_TOKEN = re.compile(r"\d+(?:\.\d+)?|\\[A-Za-z]+|[A-Za-z]+|[+\-*/^!=<>,|]|[.?;:]")
#: tokens that make a text an expression (an operation), not an atom
OPERATORS = frozenset({"+", "-", "*", "/", "^", "!", "|", "\\sqrt", "\\binom", "\\pm", "\\sum", "\\prod", "\\log",
                       "\\ln", "\\sin", "\\cos", "\\tan", "\\lfloor", "\\lceil", "\\gcd", "\\max", "\\min", "\\mod",
                       "\\bmod", "\\pmod", "\\lcm", "\\exp"})
_SEPARATOR = "§"


def _is_number(tok: str) -> bool:
    return bool(tok) and tok[0].isdigit()


def math_tokens(text: str) -> list[str]:
    """The tokens of math in ``text``: numbers, letters (variables), LaTeX commands and operators, in order, with
    brackets and braces dropped (grouping) and one spelling per operation (``\\times``, ``\\cdot``, ``×``, ``∗``: ``*``;
    ``\\div``, ``÷`` and ``\\frac``: ``/``, so ``6/3`` and ``\\frac{6}{3}`` are one restatement; ``\\dbinom``:
    ``\\binom``; ``\\lvert``: ``|``); each word of two or more letters and each sentence mark (. ? ; :) becomes a
    separator ``§`` (the stretches of math between words: "Compute 0 + 8. Answer ..." -> ``0 + 8 §`` ...)."""
    t = str(text or "")
    for pattern, repl in _NORMALISE:
        t = pattern.sub(repl, t)
    out = []
    for tok in _TOKEN.findall(t):
        if tok in ".?;:" or (tok[0].isalpha() and len(tok) > 1):
            tok = _SEPARATOR
        elif tok == "\\frac":
            tok = "/"
        if tok == _SEPARATOR and out and out[-1] == _SEPARATOR:
            continue
        out.append(tok)
    return out


def _atoms(tokens: list[str]) -> list[str]:
    return [t for t in tokens if t != _SEPARATOR]


def right_hand_side(text: str) -> str:
    """The part of ``text`` after its last ``=`` (a statement "expression = value" states the value), else ``text``."""
    s = str(text or "")
    return s.rsplit("=", 1)[1] if "=" in s and s.rsplit("=", 1)[1].strip() else s


def is_expression(text: str) -> bool:
    """True when ``text`` applies an operator (a leading sign alone does not count: "-3" is a value)."""
    toks = _atoms(math_tokens(text))
    return any(t in OPERATORS and not (i == 0 and t in "+-") for i, t in enumerate(toks))


def restates(answer: str, prompt: str, gold: str = "") -> bool:
    """True when ``answer`` (its right-hand side) is an expression whose numbers, letters and operators, in any order,
    are those of one stretch of ``prompt``'s math between two words or sentence marks (:func:`math_tokens`), and is
    not ``gold`` as written. "0 + 8", "8 + 0" and "To solve 0 + 8" restate "Compute 0 + 8."; "8" never restates."""
    ans = right_hand_side(answer)
    if not is_expression(ans):
        return False
    a = _atoms(math_tokens(ans))
    want, n = Counter(a), len(a)
    if gold and want == Counter(_atoms(math_tokens(gold))):
        return False  # the gold as written, in any order
    seg: list[str] = []
    for tok in math_tokens(prompt) + [_SEPARATOR]:
        if tok != _SEPARATOR:
            seg.append(tok)
            continue
        for i in range(len(seg) - n + 1):
            if Counter(seg[i:i + n]) == want:
                return True
        seg = []
    return False


_OPEN = frozenset({None, "+", "-", "*", "=", ",", "<", ">", _SEPARATOR})  # what may stand beside a bare number


def numeric_operations(text: str) -> set[str]:
    """The arithmetic operations ``text`` applies directly to two bare numbers (``+``, ``-``, ``*``, ``^``) or to one
    (``!``, a factorial): "2^3+1" -> {"^"} (the + adds to a power), "3 + 5" -> {"+"}; "\\frac{1}{2}", "2\\sqrt{3}",
    "-5", "\\sqrt{2}+1" (the 2 is the root's), "4+5i" (5i is a term), "25\\text{ cm}^2" (a unit's power) -> {}. A number is bare when what stands on its other
    side is nothing, an operator of the same or a looser binding, or a word."""
    toks = math_tokens(text)

    def at(j):
        return toks[j] if 0 <= j < len(toks) else None

    ops = set()
    for i, t in enumerate(toks):
        left = _is_number(at(i - 1)) and at(i - 2) in _OPEN
        if t in ("+", "-", "*", "^") and left and _is_number(at(i + 1)) and at(i + 2) in _OPEN:
            ops.add(t)
        elif t == "!" and left:
            ops.add("!")
    return ops


def refusal(answer: str, prompt: str, gold: str) -> str | None:
    """Why ``answer`` earns nothing whatever its value: :data:`RESTATED` (it restates the prompt, :func:`restates`),
    :data:`NOT_A_VALUE` (it applies an arithmetic operation to numbers that the gold as written does not,
    :func:`numeric_operations`), or None (it may be judged)."""
    if restates(answer, prompt, gold):
        return RESTATED
    if numeric_operations(right_hand_side(answer)) - numeric_operations(str(gold)):
        return NOT_A_VALUE
    return None


def _literals(text: str) -> list[tuple[int, int, str]]:
    """(start, end, value) of every number literal in ``text``, a sign included where it is not an operator."""
    out = []
    for m in _NUMBER_RAW.finditer(text):
        start, end = m.start(), m.end()
        if start and (text[start - 1].isalpha() or text[start - 1] in "_\\"):
            out.append((start, end, None))  # x2, a_1, \frac12: part of a name, not a stated number
            continue
        if end < len(text) and text[end].isalpha():
            out.append((start, end, None))  # 2x, 3rd: a term or an ordinal
            continue
        out.append((start, end, m.group().replace(",", "")))
    return out


def _operator_gap(gap: str) -> bool:
    """True when nothing but operators stand in ``gap`` (the text between two number literals). A line break is never
    an operator (a list, a Markdown rule): "9\\n\\n---\\n*5 + 4*" states 9."""
    if "\n" in gap:
        return False
    if gap.strip() == "**":
        return True  # 2**3: Python's power (** around a number elsewhere is Markdown's bold)
    g = gap
    for pattern, repl in _NORMALISE:
        g = pattern.sub(repl, g)
    g = _IGNORED_IN_GAP.sub("", g.lower())
    return bool(g) and _OPERATOR_GAP.fullmatch(g) is not None


def stated_number(response: str) -> tuple[str | None, bool]:
    """(the last number literal of ``response`` that is not an operand of an arithmetic operator, or None; whether the
    response holds an operand, i.e. an expression of numbers). See the module docstring for the rule."""
    text = re.sub(r"(?<=\d)\\,(?=\d{3}(?!\d))", "", str(response or ""))  # 1\,024: LaTeX's thousands separator
    lits = _literals(text)
    found, expression = None, False
    for i, (start, end, value) in enumerate(lits):
        before = text[lits[i - 1][1]:start] if i else None
        after = text[end:lits[i + 1][0]] if i + 1 < len(lits) else None
        sign = ""
        if before is not None and before.rstrip().endswith(("-", "−")) and not _operator_gap(before):
            # "= -3", "is -3": a sign; "5 - 3": an operator (nothing but it between the two numbers)
            sign = "-"
        elif before is not None and _operator_gap(before):
            expression = True
            continue
        elif before is None and text[:start].rstrip().endswith(("-", "−")):
            sign = "-"
        if after is not None and _operator_gap(after):
            expression = True
            continue
        if value is not None:
            found = sign + value
    return found, expression


_NUMBER_LITERAL = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def number_literal(text: str) -> str | None:
    """``text`` as a number literal (spaces, ``$``, a trailing period and ``\\text{...}`` units removed; thousands
    separators dropped), or None when it is anything else."""
    t = re.sub(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}", "", str(text or ""))
    t = re.sub(r"[\s$]|\\[,!;: ]", "", t).rstrip(".").replace("−", "-")
    return t.replace(",", "") if _NUMBER_LITERAL.fullmatch(t) else None


# ----------------------------------------------------------------------------- the forms

def _boxes(response: str) -> list[str]:
    from core.verify import box_contents

    return box_contents(response)


def _set_like(gold: str) -> bool:
    """True when ``gold`` lists several answers at its top level (``1, 2``; ``(2,1),(1,2)``)."""
    depth = 0
    for ch in str(gold):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return True
    return False


_ANSWER_PHRASE = re.compile(r"answer\s*(?:is|:)\s*:?\s*(.+?)(?=\.\s|\.$|\n|$)", re.I)


class BoxedForm(AnswerForm):
    """``boxed``: the last ``\\boxed{}`` (every box for a list gold), else the text after the last "answer is" /
    "answer:" (module docstring)."""

    name = "boxed"

    def read(self, response: str, prompt: str, gold: str) -> Answer:
        text = str(response or "")
        boxes = _boxes(text)
        if boxes:
            read = boxes if len(boxes) > 1 and _set_like(gold) else boxes[-1:]
            for box in read:
                why = refusal(box, prompt, gold)
                if why:
                    return Answer(box.strip(), why)
            return Answer(boxes[-1].strip(), STATED, text)  # the verifier reads the box(es) itself, as before
        phrases = _ANSWER_PHRASE.findall(text[-4000:])
        if phrases:
            ans = re.sub(r"^\s*(?:\$|\\\(|\\\[)|(?:\$|\\\)|\\\])\s*$", "", phrases[-1].strip()).strip().rstrip(".,;")
            if ans:
                why = refusal(ans, prompt, gold)
                return Answer(ans, why) if why else Answer(ans, STATED, f"\\boxed{{{ans}}}")
        return Answer(None, MISSING)


class NumberForm(AnswerForm):
    """``number``: a number stated as a value (module docstring)."""

    name = "number"

    def read(self, response: str, prompt: str, gold: str) -> Answer:
        text = str(response or "")
        boxes = _boxes(text)
        if boxes:
            box = boxes[-1].strip()
            value = number_literal(right_hand_side(box))
            if value is not None:
                return Answer(value, STATED, f"\\boxed{{{value}}}")
            if not is_expression(right_hand_side(box)):
                return Answer(box, MISSING)  # a box without a number ("\\boxed{eight}")
            return Answer(box, RESTATED if restates(box, prompt, gold) else NOT_A_VALUE)
        value, expression = stated_number(text)
        if value is not None:
            return Answer(value, STATED, f"\\boxed{{{value}}}")
        if expression:
            found = _EXPRESSION.findall(text)
            echo = any(restates(e, prompt, gold) for e in found)
            return Answer(found[-1].strip() if found else None, RESTATED if echo else NOT_A_VALUE)
        return Answer(None, MISSING)


_EXPRESSION = re.compile(r"-?\d+(?:[.,]\d+)*(?:\s*(?:[+\-−*×·/÷^x]|\\times|\\cdot|\\div)\s*\(?-?\d+(?:[.,]\d+)*\)?)+")


register_form(BoxedForm())
register_form(NumberForm())

_ASKS_FOR_BOX = re.compile(r"\\boxed|\\fbox|boxed\{")


def form_of(row: dict, default: str) -> AnswerForm:
    """The answer form of ``row``: ``row["answer_form"]`` when set; ``boxed`` when the template in effect asks for a
    box (the rendered ``prompt`` outside the ``problem`` text names ``\\boxed``); else the task's ``default``.

    Raises:
        KeyError: an unregistered form name.
    """
    if row.get("answer_form"):
        return ANSWER_FORMS[str(row["answer_form"])]
    prompt, problem = str(row.get("prompt", "")), row.get("problem")
    outside = prompt.replace(str(problem), "") if problem else prompt
    return ANSWER_FORMS["boxed" if _ASKS_FOR_BOX.search(outside) else default]
