"""A plug-in metric table: the example of docs/extending.md. One module, one :func:`register_table` call; a sweep
imports it with ``plugins=[tests.plugins.toy_metric]``, and then ``compute_tables`` logs ``eval/<benchmark>/
response_length`` (and ``eval/mean/response_length``, the unweighted mean over benchmarks), ``evaluate`` writes
``response_length.csv`` and the report shows the table in a section of its own. No other file changes."""
import pandas as pd

from core.config_keys import S
from evaluation.tables import register_table


def response_length(samples: pd.DataFrame, settings) -> pd.DataFrame:
    """Mean response length per benchmark, in characters or words (``eval.length_unit``), over all samples; with an
    unweighted ``mean`` row over benchmarks."""
    unit = settings["eval.length_unit"]
    lengths = samples["response"].astype(str).map(len if unit == "chars" else lambda r: len(r.split()))
    table = lengths.groupby(samples["benchmark"]).mean().astype(float).to_frame("response_length")
    table.loc["mean"] = table["response_length"].mean()
    table.index.name = "benchmark"
    return table


register_table("response_length", response_length, section="Response length", columns=("response_length",),
               knobs={"eval.length_unit": S(("chars", "words"), default="chars", doc="the unit of response_length")},
               doc="Mean response length per benchmark (characters or words, eval.length_unit).")
