"""The grader audit (the registered ``verifier`` table): per benchmark, the share of samples whose verdict differs
between this suite's verifier and plain math-verify, the share with no answer in the form the prompt asks for, the
echoes of the prompt refused (and those plain math-verify would have paid), and any echo accepted (a leak)."""
from .. import data
from . import register_section


def _show(ctx, page) -> None:
    verifier = data.metric_table(ctx.shown, "verifier")
    if verifier.empty:
        page.note("No math benchmark was graded in these runs (or they were evaluated before the audit existed).")
        return
    from evaluation.tables.verifier import AUDIT_COLUMNS

    verifier = verifier[[c for c in AUDIT_COLUMNS if c in verifier.columns]]
    if "verifier_disagreement" in verifier and (verifier["verifier_disagreement"].fillna(0) == 0).all():
        page.note("The two graders agree on every sample of every run.")
    if "accepted_restatement" in verifier and (verifier["accepted_restatement"].fillna(0) > 0).any():
        page.note("A leak: some samples scored correct although their answer restates the prompt "
                  "(accepted_restatement > 0); their task does not read its answers through an answer form.")
    page.table(verifier, "verifier", fmt=".4f")


register_section("verifier", "Verifier audit", order=210, show=_show, tables=("verifier",),
                 doc="Per benchmark, shares of the samples: *verifier_disagreement*, whose verdict differs between "
                     "this suite's grader and plain math-verify (`verify(parse(gold), parse(response))`; *only suite*: "
                     "correct here and wrong there, *only math-verify* the reverse); *format_miss*, with no answer in "
                     "the form the prompt asks for (no credit); *echo_refused*, whose answer restates the prompt or is "
                     "an expression where a value is asked (no credit), and of those *echo_paid_by_math_verify*, the "
                     "ones plain math-verify would have paid; *accepted_restatement*, scored correct although the "
                     "answer restates the prompt (a leak: 0 for every task that reads its answer form). When a share "
                     "is not small, a grader choice moves the numbers above; the disagreeing samples are in each run's "
                     "`verifier_disagreements.csv` artifact (docs/verification.md says where the graders differ).")
