"""The verifier audit (the registered ``verifier`` table): the share of samples whose verdict differs between this
suite's verifier and plain math-verify, per benchmark."""
from .. import data as R
from . import register_section


def _show(ctx, page) -> None:
    verifier = R.metric_table(ctx.shown, "verifier")
    if verifier.empty:
        page.note("No math benchmark was graded in these runs (or they were evaluated before the audit existed).")
        return
    if "verifier_disagreement" in verifier and (verifier["verifier_disagreement"].fillna(0) == 0).all():
        page.note("The two graders agree on every sample of every run.")
    page.table(verifier, "verifier", fmt=".4f")


register_section("verifier", "Verifier audit", order=210, show=_show, tables=("verifier",),
                 doc="Share of samples whose verdict differs between this suite's verifier and plain math-verify "
                     "(`verify(parse(gold), parse(response))`), per benchmark: *only suite* counts samples scored "
                     "correct here and wrong by plain math-verify, *only math-verify* the reverse. When the share is not "
                     "small, a grader choice moves the numbers above; the samples themselves are in each run's "
                     "`verifier_disagreements.csv` artifact (docs/verification.md says where the graders differ).")
