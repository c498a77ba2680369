"""What each run cost, as ExPPO's Table 7 and TR-GRPO's Table 8 report it (:func:`reports.data.cost_table`): a
paper table (``report.sections``: ``cost``) and the body's Cost section."""
import pandas as pd

from .. import data
from . import register_section


def _table(ctx) -> pd.DataFrame:
    return data.cost_table(ctx.done, ctx.history(data.COST_KEYS)) if len(ctx.done) else pd.DataFrame()


def _show(ctx, page) -> None:
    cost = _table(ctx)
    if cost.empty:
        page.note("No trained run: no cost to show.")
    else:
        page.table(cost, "cost")


register_section(
    "cost", "ExPPO Table 7 and TR-GRPO Table 8: cost (wall time, GPU-hours, throughput, memory)", needs="a trained run",
    build=_table, show=_show, order=30, heading="Cost",
    doc="What each run cost, as ExPPO's Table 7 and TR-GRPO's Table 8 report it: wall time, GPU-hours (GPUs x hours), "
        "training steps/s and samples/s over all steps, peak allocated and reserved memory (on the CPU: the process's "
        "peak resident memory, no reserved figure).")
