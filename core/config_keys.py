"""Config keys declared by the components that own them: a :class:`Spec` (type, range, choices, default note) per
dotted key, and :func:`check_value`, which refuses a value that does not fit with one line naming the key.

Every registered component (an engine, a sampler, a task, a metric table) declares the keys it reads next to its
code, as ``{dotted key: Spec}``; :mod:`orchestrator.checks.schema` only collects the declarations and walks the composed
config. The constructors ``I``, ``F``, ``B``, ``S``, ``L`` keep declarations one line each.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from omegaconf import DictConfig, ListConfig


class BadValue(ValueError):
    """A value that does not fit its key's :class:`Spec` (a ValueError: the message names the key and the value)."""


NO_DEFAULT = object()  # a key whose default lives in the YAML preset, not in its declaration


@dataclass(frozen=True)
class Spec:
    """``kind``: int, float, bool, str, list, map or any; ``lo``/``hi``: inclusive bounds (``lo_open``: lo
    excluded); ``choices``: allowed strings; ``pattern``: a regex strings must match in full; ``null``: None
    allowed; ``item``: the Spec of each list element; ``min_len``/``max_len``: list length or string length;
    ``default``: the value a component uses when the key is absent from the config (:data:`NO_DEFAULT`: the key
    must be in the composed config); ``doc``: one line for the config reference."""
    kind: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple = ()
    pattern: str | None = None
    null: bool = False
    item: "Spec | None" = None
    min_len: int | None = None
    max_len: int | None = None
    default: object = field(default=NO_DEFAULT, compare=False)
    doc: str = field(default="", compare=False)


def I(lo=None, hi=None, null=False, default=NO_DEFAULT, doc=""):  # noqa: E743
    """An integer key in [lo, hi] (either bound None: open). Returns the :class:`Spec`; ``null``: None allowed."""
    return Spec("int", lo, hi, null=null, default=default, doc=doc)


def F(lo=None, hi=None, lo_open=False, null=False, default=NO_DEFAULT, doc=""):
    """A finite number in [lo, hi] (``lo_open``: lo excluded). Returns the :class:`Spec`; ``null``: None allowed."""
    return Spec("float", lo, hi, lo_open=lo_open, null=null, default=default, doc=doc)


def B(null=False, default=NO_DEFAULT, doc=""):
    """A true/false key. Returns the :class:`Spec`; ``null``: None allowed."""
    return Spec("bool", null=null, default=default, doc=doc)


def S(choices=(), null=False, pattern=None, max_len=None, min_len=None, default=NO_DEFAULT, doc=""):
    """A string key: one of ``choices``, matching ``pattern``, of length within ``min_len``/``max_len``. Returns the :class:`Spec`; ``null``: None allowed."""
    return Spec("str", choices=tuple(choices), null=null, pattern=pattern, max_len=max_len, min_len=min_len,
                default=default, doc=doc)


def L(item=None, null=False, min_len=None, max_len=None, default=NO_DEFAULT, doc=""):
    """A list key whose items fit ``item``, of length within ``min_len``/``max_len``. Returns the :class:`Spec`; ``null``: None allowed."""
    return Spec("list", item=item, null=null, min_len=min_len, max_len=max_len, default=default, doc=doc)


def setting(cfg, key: str, spec: Spec):
    """The value of dotted ``key`` in ``cfg`` (a DictConfig or dict; ``key`` relative to it), else ``spec.default``.

    Raises:
        BadValue: the key is absent and its spec has no default.
    """
    node = cfg
    for part in key.split("."):
        try:
            node = node[part] if part in node else NO_DEFAULT
        except TypeError:
            node = NO_DEFAULT
        if node is NO_DEFAULT:
            break
    if node is NO_DEFAULT:
        if spec.default is NO_DEFAULT:
            raise BadValue(f"{key}: missing, and it has no default")
        return spec.default
    return node


ANY = Spec("any")
MAP = Spec("map")
DEVICE = r"auto|cpu|cuda(:\d+)?"


def _type_name(v) -> str:
    return "null" if v is None else type(v).__name__


def check_value(key: str, value, spec: Spec) -> None:
    """Raise :class:`BadValue` naming ``key`` unless ``value`` fits ``spec``."""
    def bad(why: str):
        raise BadValue(f"{key}={value!r}: {why}")

    if value is None:
        if not spec.null and spec.kind != "any":
            bad("must not be null")
        return
    if spec.kind == "any":
        return
    if spec.kind == "bool":
        if not isinstance(value, bool):
            bad("expected true or false")
    elif spec.kind in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (spec.kind == "int" and not isinstance(value, int)):
            bad(f"expected {'an integer' if spec.kind == 'int' else 'a number'}, got {_type_name(value)}")
        if not math.isfinite(float(value)):
            bad("expected a finite number")
        lo_ok = spec.lo is None or (value > spec.lo if spec.lo_open else value >= spec.lo)
        if not lo_ok or (spec.hi is not None and value > spec.hi):
            lo = "" if spec.lo is None else f"{'(' if spec.lo_open else '['}{spec.lo:g}"
            hi = "" if spec.hi is None else f"{spec.hi:g}]"
            bad(f"out of range: expected a value in {lo or '(-inf'}, {hi or 'inf)'}")
    elif spec.kind == "str":
        if not isinstance(value, str):
            bad(f"expected a string, got {_type_name(value)}")
        if spec.choices and value not in spec.choices:
            bad(f"expected one of {list(spec.choices)}")
        if spec.pattern and not re.fullmatch(spec.pattern, value):
            bad(f"does not match {spec.pattern}")
        if spec.max_len is not None and len(value) > spec.max_len:
            bad(f"{len(value)} characters; at most {spec.max_len}")
        if spec.min_len is not None and len(value) < spec.min_len:
            bad("must not be empty")
    elif spec.kind == "list":
        if not isinstance(value, (list, tuple, ListConfig)):
            bad(f"expected a list, e.g. {key}=[{value}]")
        if spec.min_len is not None and len(value) < spec.min_len or spec.max_len is not None and len(value) > spec.max_len:
            bad(f"expected a list of {spec.min_len if spec.min_len == spec.max_len else f'at least {spec.min_len}'} item(s)")
        if spec.item is not None:
            for i, v in enumerate(value):
                try:
                    check_value(f"{key}[{i}]", v, spec.item)
                except BadValue as e:
                    raise BadValue(f"{key}={list(value)!r}: item {i}: {str(e).split(': ', 1)[1]}") from None
    elif spec.kind == "map":
        if not isinstance(value, (dict, DictConfig)):
            bad("expected a mapping")
