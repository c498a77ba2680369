"""The run table: every run of the report with its swept settings, status, steps, wall time and where the time
went (:func:`reports.data.run_table`)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    if ctx.runs.empty:
        page.note("No runs.")
        return
    table = data.run_table(ctx.runs)
    page.table(table, "runs")


register_section("runs", "Runs", order=10, show=_show)
