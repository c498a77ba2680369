"""Qualitative examples (the QUATRO paper's C.6): for a few prompts, each run's distinct correct answers with the end
of a response that gives each (:func:`reports.data.qualitative_examples`)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    examples = data.qualitative_examples(ctx.samples)
    if examples.empty:
        page.note("No run has a correct sample.")
    else:
        page.table(examples.set_index(["prompt", "run"]))


register_section("examples", "Qualitative examples", order=200, show=_show,
                 doc="For a few prompts, each run's distinct correct answers (most frequent first) with the end of a "
                     "response that gives it (the QUATRO paper's C.6).")
