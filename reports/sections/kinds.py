"""pass@k averaged over the benchmarks of each task kind (the registered ``kinds`` table)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    kinds = data.kind_table(ctx.shown)
    if kinds.empty or kinds.index.get_level_values("kind").nunique() < 2:
        page.note("One task kind only: the pass@k tables above are the whole story.")
        return
    for kind in kinds.index.get_level_values("kind").unique():
        page.markdown(f"**{kind}**")
        page.table(kinds.xs(kind, level="kind"), f"passk_kind_{kind}", fmt="best")


register_section("kinds", "pass@k by task kind", order=90, show=_show, tables=("kinds",),
                 doc="pass@k averaged over the benchmarks of each kind (math, multiple choice, code, logic), unweighted, "
                     "as the papers report a suite's mean: code's pass@k (all unit tests passing) beside math's.")
