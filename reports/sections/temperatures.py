"""The tables' summary columns at each evaluation temperature (:func:`reports.data.temperature_table`; QUATRO's
Table 2 at T = 1.0 and 1.5)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    temps = data.temperature_table(ctx.shown)
    if temps.empty:
        page.note("No run was evaluated at extra temperatures (eval.extra_temperatures).")
    else:
        page.table(temps, "temperatures", fmt="best")


register_section("temperatures", "Temperature variation (the tables' summary columns at each evaluation temperature)",
                 order=180, show=_show,
                 doc="pass@1, UCR, UCC@k and ROUGE-L similarity (each registered table's `summary` columns) of the mean "
                     "over benchmarks, at the main evaluation temperature and every extra one.")
