"""Rendering of the report: HTML (best values in bold, dashes for missing cells, embedded figures with alt text),
LaTeX and CSV export for a paper, one colour per run and legends clear of the data; and :class:`Page`, where a report
section (:mod:`reports.sections`) writes its headings, notes, tables and figures.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .load import BASE_LABEL

_COUNT = re.compile(r"^(n|n_.*|.*_count|count|prompts|samples|.*_prompts|tokens|steps)$")


def counts_as_integers(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its count columns (named ``n``, ``n_*``, ``*count``, ``prompts``, ``*_prompts``, ``samples``,
    ``tokens``, ``steps``) shown as integers where every value is a whole number (MLflow stores every metric as a
    float: a flip-rate table's prompt counts read "2.000" otherwise)."""
    out = None
    for col in df.columns:
        name = col[-1] if isinstance(col, tuple) else col
        if not _COUNT.match(str(name)) or not pd.api.types.is_float_dtype(df[col]):
            continue
        vals = df[col].dropna()
        if len(vals) and (vals == vals.round()).all():
            out = df.copy() if out is None else out
            out[col] = df[col].round().astype("Int64")
    return df if out is None else out


def scroll_box(html: str, html_id: str | None = None) -> str:
    """``html`` (a table) in a box as wide as the page that scrolls sideways when the table is wider: a wide table is
    read by scrolling, never cut at the page's edge."""
    ident = f' id="{html_id}"' if html_id else ""
    return f'<div class="rlvr-table"{ident} style="overflow-x:auto;max-width:100%">{html}</div>'


def bold_best_html(df: pd.DataFrame, digits: int = 4) -> str:
    """HTML of ``df`` with the best (largest) value of each column in bold, values to ``digits`` places."""
    fmt = df.copy().astype(object)
    for col in df.columns:
        vals = pd.to_numeric(df[col], errors="coerce")
        best = vals.max() if vals.nunique() > 1 else None  # nothing to single out when all are equal
        fmt[col] = [("" if pd.isna(v) else (f"<b>{v:.{digits}f}</b>" if v == best else f"{v:.{digits}f}")) for v in vals]
    return fmt.to_html(escape=False, na_rep="-")



def run_colors(labels) -> dict:
    """{run label: colour}, one colour per run for every figure of the report (the base model grey, the
    others in the order given from matplotlib's tab10 up to 10 runs, tab20 up to 20, and tab20, tab20b and tab20c
    together up to 60; beyond that they repeat), so a run keeps its colour across figures."""
    import matplotlib

    labels = list(dict.fromkeys(labels))
    others = [lab for lab in labels if lab != BASE_LABEL]
    if len(others) <= 20:
        cmap = matplotlib.colormaps["tab10" if len(others) <= 10 else "tab20"]
        palette = [cmap(i) for i in range(cmap.N)]
    else:
        palette = [matplotlib.colormaps[m](i) for m in ("tab20", "tab20b", "tab20c") for i in range(20)]
    colors = {lab: palette[i % len(palette)] for i, lab in enumerate(others)}
    colors[BASE_LABEL] = (0.45, 0.45, 0.45, 1.0)
    return colors



LEGEND_INSIDE = 6  # entries a legend may have inside the axes; more go outside, clear of the data



def legend(ax, handles=None, labels=None, fig=None):
    """Draw ``ax``'s legend where it covers no data: inside (matplotlib's best place) with up to
    :data:`LEGEND_INSIDE` entries; with more, outside: to the right of ``ax`` in columns of up to 16 entries, or,
    given the multi-panel ``fig``, below the whole figure. Figures are saved with ``bbox_inches="tight"`` so an
    outside legend is kept. Returns the legend (None without entries)."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    n = len(handles)
    if not n:
        return None
    if n <= LEGEND_INSIDE:
        return ax.legend(handles, labels, fontsize=7)
    if fig is not None:
        return fig.legend(handles, labels, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                          ncol=min(4, -(-n // 8)), frameon=False)
    return ax.legend(handles, labels, fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                     ncol=-(-n // 16), frameon=False, borderaxespad=0.0)



def paper_number(v: float) -> str:
    """A number of a paper table: four decimals, or three significant digits in scientific notation when it is
    nonzero and below 0.001 in size (a probability of 2e-5 is not shown as 0.0000)."""
    return f"{v:.2e}" if v != 0 and abs(v) < 1e-3 else f"{v:.4f}"



def export_table(df: pd.DataFrame, directory, name: str, digits: int = 4) -> list[Path]:
    """Write ``df`` as ``<directory>/<name>.csv`` and ``<name>.tex`` (a LaTeX ``tabular`` with booktabs rules,
    special characters escaped, floats to ``digits`` places), for a paper; returns the two paths. An empty frame
    writes nothing. Raises OSError when the directory cannot be written."""
    if df is None or df.empty:
        return []
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    csv, tex = d / f"{name}.csv", d / f"{name}.tex"
    df.to_csv(csv)
    tex.write_text(df.to_latex(escape=True, float_format=f"%.{digits}f", na_rep="-"), encoding="utf-8")
    return [csv, tex]



def figure_alt(fig, name: str) -> str:
    """Alt text for a report figure: its title (``suptitle``), else its axes' titles, else its file name in words,
    with the axes' labels (what is plotted against what)."""
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
    axes = [ax for ax in fig.axes if ax.get_visible()]
    title = title or "; ".join(t for t in (ax.get_title() for ax in axes) if t) or name.replace("_", " ")
    pairs = list(dict.fromkeys(f"{ax.get_ylabel()} against {ax.get_xlabel()}" for ax in axes
                               if ax.get_xlabel() and ax.get_ylabel()))
    return f"Figure: {title}" + (f" ({'; '.join(pairs[:4])})" if pairs else "")



def img_tag(png: Path, alt: str) -> str:
    """An <img> of ``png`` embedded as a data URI, with ``alt`` text (escaped): a page that opens offline and says
    what each figure shows to a screen reader or where the image does not load."""
    import base64
    import html

    data = base64.b64encode(Path(png).read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt, quote=True)}" style="max-width:100%">'



def dashes(html: str) -> str:
    """``html`` with every table cell that holds only None, NaN, nan or null (values a run does not have, as pandas or
    MLflow's string parameters print them) shown as a dash."""
    return re.sub(r"<td>\s*(None|NaN|nan|null|<NA>)\s*</td>", "<td>-</td>", html)


class Page:
    """Where a report section writes (:mod:`reports.sections`): in the notebook, each call displays its output; every
    figure is saved as ``figures/<name>.png`` (shown, embedded, with alt text) and as PDF and SVG under ``paper/``,
    every named table exported to ``paper/<name>.csv`` and ``.tex`` (:func:`export_table`).

    Args:
        figures_dir: the PNG figures' folder; paper_dir: the folder of the paper's files (both created).
    """

    def __init__(self, figures_dir, paper_dir):
        self.figures = Path(figures_dir)
        self.paper = Path(paper_dir)
        self.figures.mkdir(parents=True, exist_ok=True)
        self.paper.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _display(obj) -> None:
        from IPython.display import display

        display(obj)

    def html(self, text: str) -> None:
        """Show HTML; table cells that hold no value (None, NaN) read as a dash (:func:`dashes`)."""
        from IPython.display import HTML

        self._display(HTML(dashes(text)))

    def markdown(self, text: str) -> None:
        """Show Markdown."""
        from IPython.display import Markdown

        self._display(Markdown(text))

    def heading(self, text: str, level: int = 2) -> None:
        """A section heading (``##`` by default)."""
        self.markdown(f"{'#' * level} {text}")

    def note(self, text: str) -> None:
        """A note in italics (why a part is empty, what to sweep)."""
        self.markdown(f"*{text}*")

    def table(self, df: pd.DataFrame, name: str | None = None, fmt=None, html_id: str | None = None) -> None:
        """Show ``df`` (in a box that scrolls sideways when the table is wider than the page; ``html_id``: the box's
        id) and, given ``name``, export it. ``fmt``: None (values as pandas prints them), ``"best"`` (each column's
        best value in bold, :func:`bold_best_html`), or a format spec for floats (``".4f"``); count columns print as
        integers (:func:`counts_as_integers`)."""
        df = counts_as_integers(df)
        if fmt == "best":
            text = bold_best_html(df)
        elif fmt is None:
            text = df.to_html(na_rep="-")
        else:
            text = df.to_html(na_rep="-", float_format=lambda v: format(v, fmt))
        self.html(scroll_box(text, html_id))
        if name:
            self.export(df, name)

    def export(self, df: pd.DataFrame, name: str) -> None:
        """Export ``df`` to ``paper/<name>.csv`` and ``.tex`` without showing it."""
        export_table(df, self.paper, name)

    def figure(self, fig, name: str) -> None:
        """Save ``fig`` (PNG shown with alt text; PDF and SVG for the paper) and close it."""
        import matplotlib.pyplot as plt

        fig.tight_layout()
        fig.savefig(self.figures / f"{name}.png", dpi=110, bbox_inches="tight")  # tight: a legend outside is kept
        for ext in ("pdf", "svg"):
            fig.savefig(self.paper / f"{name}.{ext}", bbox_inches="tight")
        alt = figure_alt(fig, name)
        plt.close(fig)
        self.html(img_tag(self.figures / f"{name}.png", alt))
