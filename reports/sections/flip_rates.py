"""Flip rates by difficulty under the base model (the registered ``flip_rates`` table; the QUATRO paper's Fig. IV):
per bucket of the base model's pass rate, the share of prompts flipped to solved, improved and regressed."""
from .. import data
from . import register_section

_MEASURES = [("solved_from_unsolved", "flipped to solved"), ("improved", "pass rate improved"),
             ("regressed", "regressed to unsolved")]


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt

    from .. import render

    flips = data.flip_table(ctx.done)
    if flips.empty:
        page.note("No flip rates: the runs were evaluated without a base model (eval.base=false), or its evaluation "
                  "failed.")
        return
    rules = data.flip_rules(ctx.done)
    page.markdown("Rule: " + "; ".join(rules) + ". All benchmarks pooled:" if rules else "All benchmarks pooled:")
    page.table(flips, "flip_rates", fmt=".3f")
    buckets = [b for b in ("very_hard", "hard", "medium", "easy") if b in flips.index.get_level_values("bucket")]
    run_order = list(dict.fromkeys(flips.index.get_level_values("run")))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, (col, title) in zip(axes, _MEASURES):
        flips[col].unstack("run").reindex(index=buckets, columns=run_order).plot.bar(
            ax=ax, rot=0, legend=False, color=[ctx.color(r) for r in run_order])
        ax.set_title(f"share {title}")
        ax.set_xlabel("difficulty under the base model")
    axes[0].set_ylim(0, max(0.05, float(flips[[c for c, _ in _MEASURES]].max().max()) * 1.15))
    axes[0].set_ylabel("share of the bucket's prompts")
    render.legend(axes[0], fig=fig)
    page.figure(fig, "flip_rates")
    per_bench = data.flip_table(ctx.done, benchmark=None)
    benches = [b for b in per_bench.index.get_level_values("benchmark").unique() if b != "all"]
    if len(benches) > 1:
        page.markdown("By benchmark:")
        page.table(per_bench.drop(index="all", level="benchmark"), fmt=".3f")


register_section("flip_rates", "Flip rates", order=130, show=_show, tables=("flip_rates",),
                 doc="Prompts bucketed by the base model's pass rate over all its samples (edges 8/32/128 of 256, scaled "
                     "to n); per bucket, the share of prompts the base left unsolved and the trained policy solved, the "
                     "share whose pass rate improved, and the share that regressed to unsolved.")
