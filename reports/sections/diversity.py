"""Diversity among correct answers: UCC@k and UCR (the registered ``ucc`` table), the mean pairwise similarity among
each prompt's correct responses (``similarity``), and its spread over prompts (one box per run and metric)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    import matplotlib.pyplot as plt

    ucc = data.metric_table(ctx.shown, "ucc")
    if ucc.empty:
        page.note("No UCC@k metrics were logged.")
    else:
        page.table(ucc, "ucc", fmt="best")
    similarity = data.metric_table(ctx.shown, "similarity")
    if len(similarity):
        page.markdown("Mean pairwise similarity among each prompt's correct responses, per benchmark:")
        page.table(similarity, "similarity", fmt=".4f")
    samples = ctx.samples  # runs whose samples could not be read are named once, in the summary
    sim = data.prompt_similarities(samples)
    if sim.empty:
        page.note("No similarity among correct answers: no prompt has two correct responses.")
        return
    metrics = ["rouge_l", "jaccard", "tfidf_cosine", "edit"]
    labels = list(sim["run"].unique())
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.4), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        ax.boxplot([sim.loc[sim["run"] == lab, metric].to_numpy() for lab in labels], tick_labels=labels)
        ax.set_title(f"{metric} (per prompt)")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    page.figure(fig, "similarity")
    page.markdown("Mean pairwise similarity among each prompt's correct responses, one point per prompt "
                  "with at least two correct responses (lower: more diverse solutions).")


register_section("diversity", "Diversity among correct answers", order=110, show=_show, tables=("ucc", "similarity"))
