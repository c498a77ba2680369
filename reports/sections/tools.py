"""Question answering with a search tool (TR-GRPO's Table 3, after Search-R1): the registered ``tools`` table and the
tool use over training."""
from .. import data
from . import register_section

_KEYS = ["train/tool_calls_mean", "train/no_answer_share"]


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .. import render

    tool_table = data.metric_table(ctx.shown, "tools")
    if tool_table.empty:
        page.note("No run called tools.")
        return
    page.table(tool_table, "tools", fmt=".4f")
    tool_hist = ctx.history(_KEYS)
    if tool_hist:
        fig, axs = plt.subplots(1, len(tool_hist), figsize=(4.2 * len(tool_hist), 3), squeeze=False)
        for ax, (key, by_run) in zip(axs[0], tool_hist.items()):
            for label, (steps, values) in by_run.items():
                ax.plot(steps, values, marker="o", label=label, color=ctx.color(label))
            ax.set_title(key.split("/", 1)[1])
            ax.set_xlabel("step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        render.legend(axs[0][0], fig=fig)
        page.figure(fig, "tool_use")


register_section("tools", "Search tools", order=100, show=_show, tables=("tools",),
                 doc="Question answering with a search tool (TR-GRPO's Table 3, after Search-R1): exact match per "
                     "benchmark (general and multi-hop means in the task-kind table above), search calls per episode, "
                     "and the share of episodes that ended without an answer; below, the same during training, step by "
                     "step.")
