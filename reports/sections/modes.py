"""ExPPO's answer modes (the registered ``modes`` table: observed and effective yield, disagreement) and its
Table 2B, the disagreement D on the Shared set with Delta-D against the baseline."""
from .. import data
from . import _tables, register_section


def _show(ctx, page) -> None:
    modes = data.metric_table(ctx.shown, "modes")
    if modes.empty:
        page.note("No answer-mode metrics were logged.")
    else:
        page.table(modes, "modes", fmt="best")
    label = ctx.baseline_spec()
    shared = _tables.shared_d(ctx)
    if shared.empty:
        page.note("The Shared set is empty: no baseline run with samples, or no prompt has two or more correct "
                  "samples in every run compared.")
        return
    page.markdown(f"Disagreement D on the Shared set ({int(shared['n_shared'].iloc[0])} prompts), Delta-D against "
                  f"`{label}` (column `against`: the run each block is compared with) with a paired prompt-bootstrap "
                  "95% CI (ExPPO's Table 2B):")
    page.table(shared, "shared_set_disagreement", fmt=".4f")


register_section("modes", "Answer modes", order=190, show=_show, tables=("modes",))
