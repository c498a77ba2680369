"""Report sections: the sixth plug-in kind. Every part of the report (the run table, the paper's tables, the cost,
the training curves, each metric table, the study...) is a :class:`ReportSection` registered by name in
:data:`SECTIONS`, one file of this folder per topic (found by the registry's folder scan, like tasks, algorithms,
engines, samplers and metric tables); a plug-in module (``plugins`` config key) adds one with one
:func:`register_section` call (docs/extending.md has an example).

A section declares what it needs and how it builds what it shows:

- ``build(ctx) -> DataFrame``: its table. A section with one can be named in ``report.sections`` (a paper's table:
  the report shows it first, under ``title``, in the paper's layout; an empty frame names ``needs``, the key to
  sweep).
- ``figure(ctx, table) -> matplotlib Figure | None``: its figure, drawn from its table.
- ``order``: its place in the report body, where it shows its ``build`` table and ``figure``, or, given ``show(ctx,
  page)``, whatever that writes to a :class:`reports.render.Page` (several tables, figures, notes).
- ``tables``: the registered metric tables (:data:`evaluation.tables.TABLES`) it shows; its heading is then the
  first one's ``section``, and the closing section shows every table no section claims.

The report notebook (reports/templates/report.py) makes a :class:`Context` and loops over :func:`body`. Every
builder reads only :mod:`reports.data`, :mod:`reports.seed_groups` and :mod:`reports.load`, so a paper table's numbers
are the ones the body shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from core.plugins import Registry

from .. import data, load


@dataclass
class Context:
    """What a section reads: the runs (:func:`reports.load.load_runs`, labelled), the evaluated runs (``shown``:
    base model first), the finished trained runs (``done``), the store, the baseline, the paper sections the sweep
    names (``paper``) and the report's folder (``work_dir``: samples are downloaded under it). Training histories
    and samples are fetched once, on first use; ``sample_problems`` lists the runs whose samples could not be read."""
    runs: pd.DataFrame
    shown: pd.DataFrame
    done: pd.DataFrame
    tracking_uri: str
    work_dir: Path | None = None
    baseline: str | None = None
    paper: list = field(default_factory=list)
    colors: dict = field(default_factory=dict)
    sample_problems: list = field(default_factory=list)
    experiment: str = ""  # the MLflow experiment's name (the summary names it)
    _hist: dict | None = None
    _histories: dict = field(default_factory=dict)
    _samples: dict | None = None

    @property
    def samples(self) -> dict:
        """{run label: samples DataFrame} of the evaluated runs (:func:`reports.load.download_samples`)."""
        if self._samples is None:
            self._samples = (load.download_samples(self.tracking_uri, self.shown, Path(self.work_dir) / "samples",
                                                self.sample_problems) if len(self.shown) and self.work_dir else {})
        return self._samples

    def hist(self) -> dict:
        """The trained runs' histories of the training panels, the cost keys and the sequence ratios (the paper
        tables' per-step metrics), fetched once."""
        if self._hist is None:
            keys = list(dict.fromkeys(data.train_panels() + data.COST_KEYS + ["train/seq_ratio_mean", "train/seq_ratio_max"]))
            self._hist = load.histories(self.tracking_uri, self.done, keys=keys) if len(self.done) else {}
        return self._hist

    def history(self, keys) -> dict:
        """:func:`reports.load.histories` of the trained runs for ``keys``, fetched once per key list."""
        keys = tuple(keys)
        if keys not in self._histories:
            self._histories[keys] = load.histories(self.tracking_uri, self.done, keys=list(keys)) if len(self.done) else {}
        return self._histories[keys]

    def color(self, label):
        """The run's colour, the same in every figure."""
        return self.colors.get(label)

    def baseline_spec(self) -> str | None:
        """What the baseline names (``report.baseline``: a run label or an algorithm), else the base model's run
        label; None without either. :func:`reports.pairing.pair_runs` resolves it run by run."""
        return self.baseline or load.base_label(self.runs)

    def baseline_label(self) -> str | None:
        """One run standing for the baseline, for what has room for one name only: the baseline itself when it is
        a label, an algorithm's first finished run, else the base model's run (:meth:`baseline_spec`)."""
        label = self.baseline_spec()
        if label is not None and label not in set(self.shown["label"]) and label in set(self.done["algo"]):
            label = self.done[self.done["algo"] == label]["label"].iloc[0]
        return label


@dataclass(frozen=True)
class ReportSection:
    """One part of the report (see the module's docstring), the record :func:`register_section` registers.

    Attributes:
        name: its registered name (``report.sections`` names a paper table by it).
        title: a paper table's title (the paper's table or figure number) or, for a body-only section, its heading.
        build: ``build(ctx) -> DataFrame``, its table (a section with one is a paper table).
        show: ``show(ctx, page)``, what it writes to the report body instead of its table and figure.
        needs: what to sweep when the sweep lacks the data.
        order: its place in the report body (None: a paper table only).
        heading: the body's heading when it differs from ``title``.
        doc: Markdown under the heading.
        tables: the registered metric tables it shows.
        figure: ``figure(ctx, table) -> Figure | None``, its figure, drawn from its table.
        collapsible: with nothing to show (only notes), folded into one line at the end of the report; False: shown in
            its place even then, as the summary is.
    """
    name: str
    title: str
    build: Callable[[Context], pd.DataFrame] | None = None
    show: Callable | None = None
    needs: str = ""
    order: float | None = None
    heading: str | None = None
    doc: str = ""
    tables: tuple = ()
    figure: Callable | None = None
    collapsible: bool = True  # with nothing to show (only notes), folded into one line at the end of the report

    @property
    def paper(self) -> bool:
        """True when ``report.sections`` may name it (it builds a table)."""
        return self.build is not None

    def body_heading(self) -> str:
        """Its heading in the report body: its first metric table's section, else ``heading``, else ``title``
        (empty: the section writes its own headings)."""
        if self.tables:
            return data.table_entry(self.tables[0]).section
        return self.title if self.heading is None else self.heading


SECTIONS: Registry[ReportSection] = Registry("report section", packages=(__name__,))


def register_section(name: str | ReportSection, title: str | None = None, **fields) -> ReportSection:
    """Register a report section and return it: ``register_section(ReportSection(name, title, build=..., ...))``, the
    frozen record (:class:`ReportSection`: what each field declares).

    The keyword call (the one the built-in sections, the plug-ins and docs/extending.md write, kept working):
    ``register_section(name, title, build=..., show=..., needs=..., order=..., heading=..., doc=..., tables=...,
    figure=..., collapsible=...)`` builds the same record from its arguments (``tables`` made a tuple).

    Raises:
        ValueError: the name is taken, or the section has neither ``build`` nor ``show``, ``show`` without an
            ``order`` (a body section needs its place), or ``figure`` without ``build``.
        TypeError: a record given with other arguments, a name without its title, or a field :class:`ReportSection`
            does not have.
    """
    sec = _section_record(name, title, fields)
    if sec.build is None and sec.show is None:
        raise ValueError(f"report section {sec.name!r} needs build (its table) or show (its body)")
    if sec.show is not None and sec.order is None:
        raise ValueError(f"report section {sec.name!r} has show= but no order= (its place in the report)")
    if sec.name in SECTIONS:
        raise ValueError(f"report section {sec.name!r} is already registered")
    if sec.figure is not None and sec.build is None:
        raise ValueError(f"report section {sec.name!r} has figure= but no build= (the table it draws)")
    return SECTIONS.register(sec.name, sec)


def _section_record(name: str | ReportSection, title: str | None, fields: dict) -> ReportSection:
    """The :class:`ReportSection` of :func:`register_section`'s arguments: the record itself, or the one its name,
    title and keyword fields make (``tables`` made a tuple)."""
    if isinstance(name, ReportSection):
        if title is not None or fields:
            raise TypeError(f"register_section({name.name!r}): a ReportSection record takes no other arguments")
        return name
    if title is None:
        raise TypeError("register_section() missing 1 required positional argument: 'title'")
    return ReportSection(name, title, **{**fields, "tables": tuple(fields.get("tables", ()))})


def paper_table(name: str, title: str, needs: str):
    """Decorator: register ``build`` as the paper table ``name`` (a ``report.sections`` entry only)."""
    def deco(build):
        register_section(name, title, build=build, needs=needs)
        return build
    return deco


def body() -> list[ReportSection]:
    """The sections of the report body, by ``order`` (ties: registration order)."""
    return sorted((s for s in SECTIONS.values() if s.order is not None), key=lambda s: s.order)


def claimed_tables() -> set:
    """The metric tables some body section shows (the closing section shows the others)."""
    return {t for s in body() for t in s.tables}


class _Recorder:
    """Stands in for a :class:`reports.render.Page` while a section writes: its calls are kept (files are exported at
    once) and :meth:`replay` writes them to the page; ``shown`` says whether the section wrote a table, a figure or
    HTML, i.e. has something to show beyond its heading, text and notes."""

    def __init__(self, page):
        self.page, self.calls, self.shown, self.notes = page, [], False, []

    def __getattr__(self, name):
        attr = getattr(self.page, name)
        if not callable(attr) or name == "export":
            return attr

        def call(*args, **kwargs):
            if name in ("table", "figure", "html"):
                self.shown = True
            if name == "note":
                self.notes.append(str(args[0]) if args else "")
            self.calls.append((name, args, kwargs))
        return call

    def replay(self) -> None:
        for name, args, kwargs in self.calls:
            getattr(self.page, name)(*args, **kwargs)


def show_section(sec: ReportSection, ctx: Context, page) -> tuple[str, list[str]] | None:
    """Write ``sec`` into ``page``: its heading and ``doc``, then its ``show``, or else its ``build`` table and its
    ``figure`` (a note naming ``needs`` when the sweep lacks the data). A section with nothing to show (only notes:
    no table, figure or HTML) writes nothing and returns (its heading, its notes) for :func:`show_empty`'s line at the
    end, unless it is not ``collapsible``. A plug-in section (one defined outside this package) that raises leaves a
    one-line note and the report goes on; a built-in one's error stops the report."""
    rec = _Recorder(page)
    if not plugin_section(sec):
        _show_section(sec, ctx, rec)
    else:
        try:
            _show_section(sec, ctx, rec)
        except Exception as e:  # noqa: BLE001 -- a plug-in's bug costs its own section, not the report
            first = str(e).splitlines()[0] if str(e) else ""
            rec.shown = True
            rec.note(f"The plug-in section {sec.name!r} failed, so it is not shown: {type(e).__name__}: {first}")
    if rec.shown or not sec.collapsible:
        rec.replay()
        return None
    if not rec.notes:  # wrote nothing but its heading (the plug-in tables' section with no plug-in table)
        return None
    return sec.body_heading() or sec.title or sec.name, rec.notes


def show_empty(page, empty: list) -> None:
    """The sections that had nothing to show (:func:`show_section`'s returns), as one line at the end of the report,
    each one's reason folded under it."""
    import html

    empty = [e for e in empty if e]
    if not empty:
        return
    reasons = "".join(f"<li><b>{html.escape(h)}</b>: {html.escape(' '.join(n) or 'no data')}</li>" for h, n in empty)
    page.html(f'<p class="rlvr-empty"><em>Nothing to show in this sweep for: '
              f'{html.escape("; ".join(h for h, _ in empty))}.</em></p>'
              f"<details><summary>why, and what to sweep for each</summary><ul>{reasons}</ul></details>")


def plugin_section(sec: ReportSection) -> bool:
    """True when ``sec`` was registered by a module outside :mod:`reports.sections` (a plug-in)."""
    fn = sec.show or sec.build
    return not str(getattr(fn, "__module__", "")).startswith(__name__ + ".")


def _show_section(sec: ReportSection, ctx: Context, page) -> None:
    heading = sec.body_heading()
    if heading:
        page.heading(heading)
    if sec.doc:
        page.markdown(sec.doc)
    if sec.show is not None:
        sec.show(ctx, page)
        return
    table = sec.build(ctx)
    if is_empty(table):
        page.note(f"This sweep has no data for it: sweep {sec.needs}.")
        return
    page.table(table, sec.name)
    fig = sec.figure(ctx, table) if sec.figure is not None else None
    if fig is not None:
        page.figure(fig, sec.name)


def sections_of(runs: pd.DataFrame, given=None) -> list[str]:
    """The sweep's ``report.sections``: ``given`` when not None, else read back from the trained runs' logged
    config (the most common value). Returns names in order; [] when none."""
    import ast

    if given is not None:
        return [str(s) for s in given]
    if runs.empty:
        return []
    values = [p.get("report.sections") for p, k in zip(runs["params"], runs["kind"]) if k == "trained"]
    values = [v for v in values if v not in (None, "", "None", "[]")]
    if not values:
        return []
    try:
        return [str(s) for s in ast.literal_eval(max(set(values), key=values.count))]
    except (ValueError, SyntaxError):
        return []


def build_section(name: str, ctx: Context) -> tuple[ReportSection | None, pd.DataFrame]:
    """(the section, its table) for ``name``; (None, empty) for a name no paper section has. Never raises on missing
    data: an empty table means the sweep lacks it."""
    sec = SECTIONS[name] if name in SECTIONS else None
    if sec is None or sec.build is None:
        return None, pd.DataFrame()
    table = sec.build(ctx)
    return sec, (table if isinstance(table, pd.DataFrame) else pd.DataFrame())


def paper_names() -> list[str]:
    """The names ``report.sections`` may hold (sections with a table), sorted."""
    return sorted(n for n, s in SECTIONS.items() if s.paper)


def is_empty(df: pd.DataFrame) -> bool:
    """True when ``df`` has no cell with a value (the section's data is missing)."""
    return df is None or df.empty or not bool(np.asarray(df.notna()).any())
