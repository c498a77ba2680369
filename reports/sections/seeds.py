"""Mean ± std over seeds: runs that differ only by the training ``seed``, and runs that differ only by the decoding
seed ``eval.seed`` (:func:`reports.seed_groups.seed_aggregate`), for pass@k and ExPPO's answer-mode metrics."""
from .. import data
from ..seed_groups import seed_aggregate
from . import register_section


def _show(ctx, page) -> None:
    seed_tables = {"pass@k": data.passk_table(ctx.shown),
                   "answer modes": data.metric_table(ctx.shown, "modes",
                                                  columns=("observed_yield", "effective_yield", "disagreement"))}
    for key, what in (("seed", "training seeds"), ("eval.seed", "decoding seeds")):
        aggregated = {name: seed_aggregate(t, key=key) for name, t in seed_tables.items()}
        if all(t.empty for t in aggregated.values()):
            page.note(f"No runs differ only by `{key}`: nothing to aggregate over {what}.")
            continue
        for name, t in aggregated.items():
            if not t.empty:
                page.markdown(f"**{name}, mean ± std over {what}**")
                page.table(t.rename(columns={"seeds": what}),
                           f"{name.replace(' ', '_').replace('@', '_at_')}_over_{key.replace('.', '_')}")


register_section(
    "seeds", "Mean ± std over seeds", order=80, show=_show,
    doc="Runs that differ only by the training `seed` (add `seed=0,1,2` to a sweep), as the papers report their "
        "results, and runs that differ only by the decoding seed `eval.seed` (one checkpoint evaluated with several "
        "seeds: `eval.seed=0,1,2` trains once, ExPPO's Table 3): pass@k and ExPPO's answer-mode metrics, mean ± sample "
        "standard deviation.")
