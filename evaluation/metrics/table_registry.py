"""What a metric table is: a registry entry (:class:`MetricTable`) naming its function of the samples table, the config
keys it reads, its report section and the column families it produces; and the one mapping from an MLflow metric name
back to its table (:meth:`MetricTable.parse`, :func:`find_table`).

The built-in tables are the modules of the :mod:`evaluation.tables` package, one per table (or closely related pair),
found by the registry's folder scan like tasks, algorithms, engines and samplers (:data:`TABLES` names the package);
:data:`TABLES` and :func:`register_table` are re-exported there. A plug-in table is one module that calls
:func:`register_table` once (docs/extending.md has an example); naming the module in
the ``plugins`` config key makes :func:`evaluation.tables.compute_tables` compute it, log its metrics and the report
show it in a section of its own.

Metric names: a table's row with index ``r`` and column ``c`` is logged as ``eval/<rows filled with r>/<c'>`` where
``c'`` is ``c`` with ``@`` written ``_at_`` (MLflow rejects ``@``): ``pass@8`` of benchmark ``aime`` is
``eval/aime/pass_at_8``; evaluations at an extra temperature log under ``eval_T<t>/`` instead of ``eval/``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from core.config_keys import Spec, setting
from core.plugins import Registry

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PREFIX = re.compile(r"^eval(?:_T(?P<t>[0-9.eE+-]+))?/(?P<rest>.+)$")


def metric_key(name: str) -> str:
    """MLflow-safe metric name: ``pass@8`` -> ``pass_at_8`` (MLflow rejects '@')."""
    return name.replace("@", "_at_")


def _column_regex(template: str, key_form: bool) -> re.Pattern:
    """A column template (``pass@{k}``) as a regex; its fields match non-negative integers."""
    out, pos = [], 0
    for m in _FIELD.finditer(template):
        lit = template[pos:m.start()]
        out.append(re.escape(metric_key(lit) if key_form else lit))
        out.append(rf"(?P<{m.group(1)}>\d+)")
        pos = m.end()
    lit = template[pos:]
    out.append(re.escape(metric_key(lit) if key_form else lit))
    return re.compile("^" + "".join(out) + "$")


def _segments(rows: str) -> list[tuple[str, bool]]:
    """``"{benchmark}/flip/{bucket}"`` -> [("benchmark", True), ("flip", False), ("bucket", True)]."""
    out = []
    for seg in rows.split("/"):
        m = _FIELD.fullmatch(seg)
        if m:
            out.append((m.group(1), True))
        elif _FIELD.search(seg) or not seg:
            raise ValueError(f"rows={rows!r}: each '/'-separated segment is either one {{field}} or a literal")
        else:
            out.append((seg, False))
    return out


@dataclass(frozen=True)
class TableSettings:
    """Everything a table's ``compute`` may read besides the samples.

    Attributes:
        ks: the pass@k values of the benchmarks being tabled (each <= ``n``; for tables computed on every benchmark
            at once, the union of every group's ks).
        n: the smallest number of samples of any prompt in the samples given.
        knobs: {dotted config key: value} for every registered table's knobs (the config's value, else the
            :class:`~core.config_keys.Spec` default); ``settings["eval.ucc_threshold"]`` reads one.
        base_samples: the base model's samples on the same prompts (flip rates), or None.
        kinds: {benchmark: task kind}, or None.
        same_answer: {benchmark: same(a, b)}, the tasks' answer equivalences, or None.
        tables: the tables computed before this one, by name (registration order; tables computed on every
            benchmark at once see the joined per-group tables, e.g. ``kinds`` reads ``passk``).
    """
    ks: tuple[int, ...]
    n: int
    knobs: Mapping[str, Any] = field(default_factory=dict)
    base_samples: pd.DataFrame | None = None
    kinds: Mapping[str, str] | None = None
    same_answer: Mapping[str, Callable] | None = None
    tables: Mapping[str, pd.DataFrame] = field(default_factory=dict)

    def __getitem__(self, key: str):
        """The value of knob ``key`` (a full dotted key such as ``"eval.ucc_ks"``).

        Raises:
            KeyError: ``key`` is no registered table's knob.
        """
        try:
            return self.knobs[key]
        except KeyError:
            raise KeyError(f"{key!r} is no registered metric table's knob; knobs: {sorted(self.knobs)}") from None

    def get(self, key: str, default=None):
        """The value of knob ``key``, or ``default`` when no table declares it."""
        return self.knobs.get(key, default)


@dataclass(frozen=True)
class MetricName:
    """A parsed MLflow metric name (:meth:`MetricTable.parse`): ``eval_T1.5/aime/pass_at_8`` ->
    table ``passk``, row ``{"benchmark": "aime"}``, column ``pass@8`` (the display name), template ``pass@{k}``,
    fields ``{"k": 8}``, temperature ``1.5`` (None for the main evaluation, ``eval/``)."""
    table: str
    row: dict
    column: str
    template: str
    fields: dict
    temperature: float | None = None


@dataclass(frozen=True)
class MetricTable:
    """One metric table: a registry entry of :data:`TABLES`.

    Attributes:
        name: the table's name (its key in ``compute_tables``' tables and its CSV file name, ``<name>.csv``).
        compute: ``compute(samples, settings) -> DataFrame | {name: DataFrame} | None``: the table of the samples
            table (:data:`evaluation.pipeline.SAMPLE_COLUMNS`) under :class:`TableSettings`; indexed by benchmark (a
            ``mean`` row for the unweighted mean over benchmarks, when the table has one) or as ``rows`` says; a dict
            for several tables (e.g. ``verifier`` and its sample listing); None (or an empty dict) when the samples
            carry nothing for it (no table, no metrics).
        section: the title of the report section that shows the table (tables may share a section).
        columns: the column families the table produces, as templates: ``"pass@{k}"`` (a field matches an integer),
            ``"ucr"`` (a literal). The only place that maps a metric name to its table (:meth:`owns`, :meth:`parse`).
        rows: how a row's index becomes the metric name's middle part: ``"{benchmark}"`` (default),
            ``"{benchmark}/{subset}"`` (an index ``kk/3_people``), ``"kind/{kind}"``, ``"{benchmark}/flip/{bucket}"``
            (a (benchmark, bucket) MultiIndex). Segments are one ``{field}`` or a literal.
        knobs: {full dotted config key: :class:`~core.config_keys.Spec`} of the keys it reads (with ``default=`` and
            ``doc=``); the config schema collects them.
        checks: optional ``checks(eval_cfg, n) -> None`` raising ValueError for rules across keys (see :meth:`validate`).
        per_group: True: computed on each group of benchmarks sharing ks and n and the groups' tables joined (every
            ``mean`` row recomputed); False: computed once on every benchmark, after the per-group tables.
        listings: names (keys of ``compute``'s dict) of sample listings: no metrics, stacked across groups, written
            even when empty.
        summary: the columns the report's cross-table summaries show (the temperature table): templates of
            ``columns`` (every column of the family) or single columns (``"pass@1"``).
        doc: one line for the report and the docs.
    """
    name: str
    compute: Callable[[pd.DataFrame, TableSettings], Any]
    section: str
    columns: tuple[str, ...]
    rows: str = "{benchmark}"
    knobs: Mapping[str, Spec] = field(default_factory=dict)
    checks: Callable[[Any, int], None] | None = None
    per_group: bool = True
    listings: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    doc: str = ""

    def __post_init__(self):
        if not self.columns:
            raise ValueError(f"metric table {self.name!r}: declare the columns it produces")
        object.__setattr__(self, "_segs", _segments(self.rows))
        object.__setattr__(self, "_col_rx", [(t, _column_regex(t, False), _column_regex(t, True)) for t in self.columns])
        for t in self.summary:
            if t not in self.columns and not self.owns(t):
                raise ValueError(f"metric table {self.name!r}: summary column {t!r} is not one of columns {self.columns}")

    # ------------------------------------------------------------------ config
    def validate(self, eval_cfg, n: int) -> None:
        """Check the rules across keys (the ``eval`` config node ``eval_cfg``, ``n`` samples per prompt; the smallest
        n when benchmarks have their own).

        Raises:
            ValueError: naming the key whose value breaks a rule.
        """
        if self.checks is not None:
            self.checks(eval_cfg, n)

    # ------------------------------------------------------------------ names
    def parse_column(self, column: str) -> tuple[str, dict] | None:
        """(template, fields) of ``column`` (display form ``pass@8`` or MLflow form ``pass_at_8``), or None when no
        column family of this table has it: ``parse_column("pass_at_8") == ("pass@{k}", {"k": 8})``."""
        for template, display, key in self._col_rx:
            m = display.match(column) or key.match(column)
            if m:
                return template, {k: int(v) for k, v in m.groupdict().items()}
        return None

    def owns(self, column: str) -> bool:
        """Whether ``column`` (display or MLflow form) belongs to one of this table's column families."""
        return self.parse_column(column) is not None

    def in_summary(self, column: str) -> bool:
        """Whether ``column`` (display or MLflow form) is one the cross-table summaries show (``summary``)."""
        got = self.parse_column(column)
        return got is not None and (got[0] in self.summary or self.display(*got) in self.summary)

    def display(self, template: str, fields: dict) -> str:
        """The display name of a column: ``display("pass@{k}", {"k": 8}) == "pass@8"``."""
        return template.format(**fields)

    def parse(self, metric: str) -> MetricName | None:
        """The :class:`MetricName` of an MLflow metric name this table logs (``eval/<row>/<column>`` or
        ``eval_T<t>/<row>/<column>``), or None. A row field never takes a value that another registered table
        uses as a literal segment at that place (``eval/kind/math/pass_at_1`` is the ``kinds`` table's, not a
        subset ``math`` of a benchmark ``kind``)."""
        m = _PREFIX.match(metric)
        if not m:
            return None
        parts = m.group("rest").split("/")
        segs = self._segs
        if len(parts) != len(segs) + 1:
            return None
        row = {}
        reserved = _reserved(len(segs))
        for i, ((seg, is_field), value) in enumerate(zip(segs, parts)):
            if is_field:
                if value in reserved.get(i, ()):
                    return None
                row[seg] = value
            elif value != seg:
                return None
        got = self.parse_column(parts[-1])
        if got is None:
            return None
        template, fields = got
        t = m.group("t")
        return MetricName(self.name, row, self.display(template, fields), template, fields,
                          float(t) if t is not None else None)

    def owns_metric(self, metric: str) -> bool:
        """Whether MLflow metric name ``metric`` is one this table logs."""
        return self.parse(metric) is not None

    def row_prefix(self, index) -> str:
        """The metric name's middle part for row ``index`` (a value, or a tuple for a MultiIndex)."""
        fields = [s for s, f in self._segs if f]
        values = list(index) if isinstance(index, tuple) else str(index).split("/", max(len(fields) - 1, 0))
        if len(values) != len(fields):
            raise ValueError(f"metric table {self.name!r}: row {index!r} does not fill rows={self.rows!r}")
        it = iter(values)
        return "/".join(str(next(it)) if f else s for s, f in self._segs)

    # ------------------------------------------------------------------ results
    def as_dict(self, result) -> dict[str, pd.DataFrame]:
        """``compute``'s result as {table name: DataFrame} (a DataFrame is the table ``name``; None is empty)."""
        if result is None:
            return {}
        if isinstance(result, pd.DataFrame):
            return {self.name: result}
        return dict(result)

    def flatten(self, tables: Mapping[str, pd.DataFrame], prefix: str = "eval") -> dict[str, float]:
        """The MLflow metrics of this table's results (``tables``: {name: DataFrame}, as :meth:`as_dict` gives):
        ``<prefix>/<row prefix>/<column, @ as _at_>`` for every non-missing value; listings give none.

        Raises:
            ValueError: a value is not a number.
        """
        metrics = {}
        for name, table in tables.items():
            if name in self.listings:
                continue
            for idx, row in table.iterrows():
                head = f"{prefix}/{self.row_prefix(idx)}"
                for col, v in row.items():
                    if pd.notna(v):
                        metrics[f"{head}/{metric_key(str(col))}"] = float(v)
        return metrics


TABLES: Registry[MetricTable] = Registry("metric table", packages=("evaluation.tables",))
"""Every metric table, by name, in registration order (the built-ins, then plug-ins). The built-ins are the modules of
:mod:`evaluation.tables`, found by the registry's folder scan on the first look-up (importing that package registers
them too, in their order)."""


def register_table(spec: "MetricTable | str", compute: Callable | None = None, *, replace: bool = False,
                   **fields) -> MetricTable:
    """Register a metric table and return its entry: ``register_table(MetricTable(name=..., compute=..., section=...,
    columns=...))``, the typed declaration every plug-in kind uses (a frozen record, like a task's or a sampler's).

    Shim (the call the docs showed before issue 57, kept working): ``register_table(name, compute, section=...,
    columns=..., rows=..., knobs=..., checks=..., per_group=..., listings=..., summary=..., doc=...)`` builds the same
    record from its arguments.

    Raises:
        ValueError: no columns, a summary column not among them, a bad ``rows`` template, a knob that is not a
            full dotted key, or ``name`` already registered by another module (unless ``replace``).
        TypeError: a record given with ``compute`` or fields beside it, or a field :class:`MetricTable` does not have.
    """
    if isinstance(spec, MetricTable):
        if compute is not None or fields:
            raise TypeError(f"register_table({spec.name!r}): a MetricTable record takes no other arguments")
        entry = spec
    else:
        for key in ("columns", "listings", "summary"):
            if key in fields:
                fields[key] = tuple(fields[key])
        fields["knobs"] = dict(fields.get("knobs") or {})
        entry = MetricTable(name=spec, compute=compute, **fields)
    for key, knob in entry.knobs.items():
        if "." not in key or not isinstance(knob, Spec):
            raise ValueError(f"metric table {entry.name!r}: knob {key!r}: expected a full dotted key (eval.x) and a Spec")
    name = entry.name
    object.__setattr__(entry, "__module__", getattr(entry.compute, "__module__", __name__))
    object.__setattr__(entry, "__qualname__", f"MetricTable[{name}]")
    return TABLES.register(name, entry, replace=replace)


def _reserved(n_segments: int) -> dict[int, set[str]]:
    """{segment position: the literal segments registered tables with ``n_segments`` row segments use there}."""
    out: dict[int, set[str]] = {}
    for entry in TABLES.values():
        if len(entry._segs) == n_segments:
            for i, (seg, is_field) in enumerate(entry._segs):
                if not is_field:
                    out.setdefault(i, set()).add(seg)
    return out


def find_table(metric: str) -> MetricName | None:
    """The :class:`MetricName` of MLflow metric name ``metric`` from the registered table that logs it (the first in
    registration order), or None when no registered table does."""
    for entry in TABLES.values():
        got = entry.parse(metric)
        if got is not None:
            return got
    return None


def knob_values(eval_cfg=None) -> dict[str, Any]:
    """{dotted key: value} for every registered table's knobs: the ``eval`` config node ``eval_cfg`` (a DictConfig
    or dict, keys relative to it: ``ucc_ks`` for ``eval.ucc_ks``), else the knob's default.

    Raises:
        core.config_keys.BadValue: a knob absent from the config whose Spec has no default.
    """
    root = {"eval": eval_cfg if eval_cfg is not None else {}}
    return {key: setting(root, key, spec) for entry in TABLES.values() for key, spec in entry.knobs.items()}
