"""Mean next-token entropy of the evaluated policies (the registered ``entropy`` table), with how it was computed."""
from core import tags

from .. import data
from . import register_section


def _show(ctx, page) -> None:
    ent = data.metric_table(ctx.shown, "entropy")
    if ent.empty:
        page.note("No entropy metrics were logged.")
        return
    methods = sorted({r["tags"].get(tags.ENTROPY_METHOD) for _, r in ctx.shown.iterrows()} - {None, "None"})
    page.table(ent, "entropy", fmt=".4f")
    if methods:
        page.markdown("Mean next-token entropy in nats; method: " + "; ".join(methods) + ".")


register_section("entropy", "Entropy", order=120, show=_show, tables=("entropy",))
