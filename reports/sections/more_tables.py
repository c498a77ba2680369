"""The closing section: every registered metric table no other section shows (a plug-in's table, registered with
:func:`evaluation.tables.register_table`), one heading per table ``section``, titled by the table's entry."""
from .. import data
from . import claimed_tables, register_section


def _show(ctx, page) -> None:
    claimed = claimed_tables()
    titles = {data.table_entry(n).section for n in claimed}
    for section, entries in data.metric_sections(exclude=claimed).items():
        page.heading(section + (" (more tables)" if section in titles else ""))
        for entry in entries:
            table = data.metric_table(ctx.shown, entry)
            if entry.doc:
                page.markdown(entry.doc)
            if table.empty:
                page.note(f"No {entry.name} metrics were logged.")
            else:
                page.table(table, entry.name, fmt="best")


register_section("more_tables", "", order=1000, show=_show)
