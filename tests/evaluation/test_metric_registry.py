"""Metric tables as registry entries (evaluation.tables.TABLES): compute_tables loops over the registry with the
built-ins' tables and metric names unchanged, a plug-in table (tests/plugins/toy_metric.py) is computed, logged and
reported with no other file touched, and the entries' column templates are the one map from a metric name to its
table (the report's data layer asks them)."""
import sys
from math import comb

import numpy as np
import pandas as pd
import pytest

from core.config_keys import NO_DEFAULT, BadValue, Spec, check_value
from evaluation.metrics.difficulty import flip_rates
from evaluation.tables import TABLES, MetricTable, compute_tables, find_table, flip_metrics, register_table, ucc_table
from reports import data as R
from reports import load as L

BUILT_INS = ["passk", "ucc", "similarity", "entropy", "modes", "subsets", "verifier", "tools", "kinds", "flip_rates"]


def _hand_samples() -> pd.DataFrame:
    """a: prompts with correct [1,0,0,0] and [1,1,0,0] (entropy 0.5 when correct, 1.0 when wrong; responses
    "one two" and "three"); b: one prompt with none correct, tool calls 1, 2, 0, 1 and two responses without an
    answer (response "no"); plain math-verify disagrees with one verdict of a."""
    rows = []
    for p, cs in enumerate([[1, 0, 0, 0], [1, 1, 0, 0]]):
        for j, c in enumerate(cs):
            rows.append({"benchmark": "a", "prompt_id": str(p), "sample_idx": j, "response": ["one two", "three"][p],
                         "correct": bool(c), "extracted_answer": str(j % 2), "mean_token_entropy": 0.5 if c else 1.0,
                         "reference_correct": bool(c) != (p == 1 and j == 3), "tool_calls": None})
    for j, calls in enumerate([1, 2, 0, 1]):
        rows.append({"benchmark": "b", "prompt_id": "0", "sample_idx": j, "response": "no", "correct": False,
                     "extracted_answer": None if j < 2 else "7", "mean_token_entropy": 1.0, "reference_correct": None,
                     "tool_calls": float(calls)})
    df = pd.DataFrame(rows)
    df["reference_correct"] = df["reference_correct"].astype("boolean")
    return df


def _rich_samples() -> pd.DataFrame:
    """Three benchmarks exercising every built-in table: subsets (kk), tool calls (b), reference verdicts (a, b)."""
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "the answer is", "so", "x", "42"]
    rows = []
    for bench, n_prompts, n in (("a", 3, 8), ("b", 2, 8), ("kk", 3, 4)):
        for p in range(n_prompts):
            for j in range(n):
                c = bool(rng.random() < 0.5)
                rows.append({"benchmark": bench, "prompt_id": str(p), "sample_idx": j,
                             "response": " ".join(rng.choice(words, size=int(rng.integers(3, 9)))),
                             "extracted_answer": str(int(rng.integers(0, 3))) if rng.random() < 0.9 else None,
                             "correct": c, "reference_correct": (c if rng.random() < 0.8 else not c) if bench != "kk" else None,
                             "mean_token_entropy": float(rng.random()), "subset": f"{p + 2}_people" if bench == "kk" else None,
                             "tool_calls": float(rng.integers(0, 3)) if bench == "b" else None})
    df = pd.DataFrame(rows)
    df["reference_correct"] = df["reference_correct"].astype("boolean")
    return df


@pytest.fixture
def toy_metric():
    """tests/plugins/toy_metric.py imported as the ``plugins`` config key imports it; unregistered afterwards, so
    the other tests of this process see the built-ins only."""
    from core.plugins import load_plugins

    sys.modules.pop("tests.plugins.toy_metric", None)
    load_plugins(["tests.plugins.toy_metric"])
    yield TABLES["response_length"]
    TABLES._items.pop("response_length", None)  # no public unregister: plug-ins live for the process
    sys.modules.pop("tests.plugins.toy_metric", None)


def test_built_in_tables_and_metrics_by_hand():
    samples = _hand_samples()
    base = samples.assign(correct=False)
    tables, metrics = compute_tables(samples, [1, 2, 4], base_samples=base, kinds={"a": "math", "b": "math"})
    assert list(tables) == ["passk", "ucc", "similarity", "entropy", "modes", "verifier", "verifier_disagreements",
                            "tools", "kinds", "flip_rates"]
    # pass@k: unbiased per prompt, mean over prompts, unweighted mean over benchmarks
    pass2_a = np.mean([1 - comb(3, 2) / comb(4, 2), 1 - comb(2, 2) / comb(4, 2)])
    assert metrics["eval/a/pass_at_1"] == pytest.approx(0.375) and metrics["eval/a/avg_at_4"] == pytest.approx(0.375)
    assert metrics["eval/a/pass_at_2"] == pytest.approx(pass2_a) and metrics["eval/a/pass_at_4"] == 1.0
    assert metrics["eval/b/pass_at_4"] == 0.0 and metrics["eval/mean/pass_at_2"] == pytest.approx(pass2_a / 2)
    assert metrics["eval/kind/math/pass_at_2"] == pytest.approx(pass2_a / 2) and metrics["eval/kind/math/benchmarks"] == 2
    # entropy: all samples, correct ones, wrong ones
    assert metrics["eval/a/entropy"] == pytest.approx((3 * 0.5 + 5 * 1.0) / 8)
    assert (metrics["eval/a/entropy_correct"], metrics["eval/a/entropy_wrong"]) == (0.5, 1.0)
    # tool use: b only (a has no tool-call counts); its mean row is b's
    assert metrics["eval/b/tool_calls"] == 1.0 and metrics["eval/b/no_answer_share"] == 0.5
    assert metrics["eval/b/exact_match"] == 0.0 and metrics["eval/mean/tool_calls"] == 1.0 and "eval/a/tool_calls" not in metrics
    # modes: coverage@2 from the first two samples; verifier: one of a's 8 verdicts differs; no listing metrics
    assert metrics["eval/a/coverage_at_2"] == 1.0 and metrics["eval/a/accuracy"] == pytest.approx(0.375)
    assert metrics["eval/a/verifier_disagreement"] == pytest.approx(1 / 8) and len(tables["verifier_disagreements"]) == 1
    assert not any("verifier_disagreements" in k for k in metrics)
    # flip rates: the same table and metric names as flip_metrics / flip_rates give on their own
    table, flips = flip_metrics(base, samples)
    pd.testing.assert_frame_equal(tables["flip_rates"], flip_rates(base, samples))
    assert flips and all(metrics[k] == v for k, v in flips.items())
    assert {k for k in metrics if "/flip/" in k} == set(flips)
    # every metric comes from one table's rows and columns, and nothing else is logged
    assert set(metrics) == {k for name, t in tables.items() if name != "verifier_disagreements"
                            for k in _keys(TABLES[_owner(name)], t)}


def _owner(table_name: str) -> str:
    return "verifier" if table_name == "verifier_disagreements" else table_name


def _keys(entry: MetricTable, table: pd.DataFrame) -> set:
    return set(entry.flatten({entry.name: table}))


def test_knobs_flow_from_the_eval_config_one_way():
    """Knobs arrive one way (issue 57): the ``eval`` config's keys; the result equals the tables computed with the
    same knobs called directly, and a knob left out takes its default."""
    samples = _rich_samples()
    _, from_cfg = compute_tables(samples, [1, 2, 4], eval_cfg={"ucc_ks": [2, 4], "ucc_threshold": 0.3,
                                                               "similarity_metric": "jaccard"})
    _, defaults = compute_tables(samples, [1, 2, 4])
    direct = ucc_table(samples, [2, 4], "jaccard", 0.3)
    assert "eval/a/ucc_at_2" in from_cfg and "eval/a/ucc_at_2" not in defaults
    assert from_cfg["eval/a/ucc_at_2"] == pytest.approx(float(direct.loc["a", "ucc@2"]))
    assert from_cfg["eval/a/ucr"] != defaults["eval/a/ucr"]
    with pytest.raises(TypeError):  # the old second way is gone, not silently ignored
        compute_tables(samples, [1, 2, 4], ucc_threshold=0.3)
    base = samples.assign(correct=samples["correct"].to_numpy()[::-1])
    _, k2 = compute_tables(samples, [1], base_samples=base, eval_cfg={"flip_k": 2})
    assert {k: v for k, v in k2.items() if "/flip/" in k} == flip_metrics(base, samples, 2)[1]


def test_every_entry_declares_knobs_checks_and_owns_exactly_the_columns_it_produces():
    assert TABLES.keys()[:len(BUILT_INS)] == BUILT_INS
    for entry in TABLES.values():
        assert entry.section and entry.columns and entry.doc
        for key, spec in entry.knobs.items():
            assert key.startswith("eval.") and isinstance(spec, Spec) and spec.default is not NO_DEFAULT and spec.doc
            check_value(key, spec.default, spec)
        entry.validate({}, 4)  # no knob set: nothing to refuse
    assert set(TABLES["ucc"].knobs) == {"eval.ucc_ks", "eval.ucc_threshold", "eval.similarity_metric"}
    assert TABLES["flip_rates"].knobs["eval.flip_k"] == Spec("int", 1, null=True)  # as orchestrator/checks/schema.py had it
    with pytest.raises(BadValue, match="ucc_threshold"):
        check_value("eval.ucc_threshold", 1.5, TABLES["ucc"].knobs["eval.ucc_threshold"])
    with pytest.raises(ValueError, match="eval.flip_k=9: larger than eval.n=8"):
        TABLES["flip_rates"].validate({"flip_k": 9}, 8)
    TABLES["ucc"].validate({"ucc_ks": [16, 32]}, 8)  # k > n are left out of the table, as before: no rule
    TABLES["ucc"].validate({"ucc_ks": [4, 16]}, 8)

    samples = _rich_samples()
    base = samples.assign(correct=samples["correct"].to_numpy()[::-1])
    for ks in ([1, 2, 4], {"a": [1, 2, 8], "b": [1, 4], "kk": [1, 2]}):
        tables, metrics = compute_tables(samples, ks, base_samples=base, kinds={"a": "math", "b": "qa", "kk": "logic"})
        assert {_owner(n) for n in tables} == set(BUILT_INS)
        for name, table in tables.items():
            entry = TABLES[_owner(name)]
            if name in entry.listings:
                continue
            for col in table.columns:
                owners = [e.name for e in TABLES.values() if e.owns(col)]
                assert entry.name in owners, (name, col)
        for key in metrics:  # a metric name belongs to exactly one table: the one that logged it
            owners = [e.name for e in TABLES.values() if e.owns_metric(key)]
            assert len(owners) == 1 and any(key in _keys(TABLES[owners[0]], t) for n, t in tables.items()
                                            if _owner(n) == owners[0]), (key, owners)


def test_metric_names_parse_to_their_table_row_and_column():
    m = find_table("eval_T1.5/mean/pass_at_8")
    assert (m.table, m.row, m.column, m.template, m.fields, m.temperature) == (
        "passk", {"benchmark": "mean"}, "pass@8", "pass@{k}", {"k": 8}, 1.5)
    assert find_table("eval/kind/math/pass_at_1").table == "kinds"
    assert find_table("eval/kk/3_people/accuracy").row == {"benchmark": "kk", "subset": "3_people"}
    assert find_table("eval/all/flip/easy/improved").row == {"benchmark": "all", "bucket": "easy"}
    assert find_table("eval/a/ucc_at_16").table == "ucc" and find_table("eval/a/rouge_l_mean").table == "similarity"
    for other in ("eval/a/pass_at_budget", "train/entropy", "eval/a/b/c/d/e", "time/eval_s"):
        assert find_table(other) is None
    assert TABLES["passk"].owns("pass@8") and TABLES["passk"].owns("avg_at_16") and not TABLES["passk"].owns("ucr")
    assert TABLES["passk"].in_summary("pass@1") and not TABLES["passk"].in_summary("pass@2")


def test_a_plug_in_table_is_computed_and_logged_with_no_other_file(toy_metric):
    samples = _hand_samples()
    tables, metrics = compute_tables(samples, [1, 2])
    assert "response_length" in tables
    # a: "one two" x4 (7 characters), "three" x4 (5); b: "no" (2); mean unweighted over a and b
    assert metrics["eval/a/response_length"] == 6.0 and metrics["eval/b/response_length"] == 2.0
    assert metrics["eval/mean/response_length"] == 4.0
    _, words = compute_tables(samples, [1, 2], eval_cfg={"length_unit": "words"})
    assert words["eval/a/response_length"] == 1.5 and words["eval/mean/response_length"] == 1.25
    # per-benchmark budgets: the groups' tables are joined and the mean recomputed
    _, grouped = compute_tables(samples, {"a": [1, 2], "b": [1]})
    assert grouped["eval/a/response_length"] == 6.0 and grouped["eval/mean/response_length"] == 4.0
    assert toy_metric.knobs["eval.length_unit"].choices == ("chars", "words")
    # the built-ins are untouched by the plug-in
    _, plain = compute_tables(samples, [1, 2])
    assert {k: v for k, v in plain.items() if "response_length" not in k} == \
        {k: v for k, v in metrics.items() if "response_length" not in k}


def test_the_report_data_layer_finds_a_plug_in_table_through_the_registry(toy_metric):
    runs = pd.DataFrame([
        {"label": "grpo", "params": {"plugins": "['tests.plugins.toy_metric']", "eval.temperature": "1.0"},
         "metrics": {"eval/a/response_length": 6.0, "eval/mean/response_length": 4.0, "eval/a/pass_at_1": 0.375,
                     "eval_T1.5/a/response_length": 9.0, "eval/kind/math/pass_at_1": 0.5}},
        {"label": "base", "params": {"plugins": "[]"}, "metrics": {"eval/a/response_length": 7.0}},
    ])
    assert L.plugin_modules(runs) == ["tests.plugins.toy_metric"] and L.load_plugins(runs) == []
    table = R.metric_table(runs, "response_length")
    assert list(table.index) == [("base", "a"), ("grpo", "a"), ("grpo", "mean")]
    assert table.loc[("grpo", "a"), "response_length"] == 6.0  # the main temperature's value, not eval_T1.5's
    assert list(R.passk_table(runs).columns) == ["pass@1"] and list(R.kind_table(runs).index) == [("grpo", "math")]
    sections = R.metric_sections(exclude=BUILT_INS)
    assert list(sections) == ["Response length"] and sections["Response length"] == [toy_metric]
    with pytest.raises(ValueError, match="not one of metric table 'response_length'"):
        R.metric_table(runs, "response_length", columns=("pass@{k}",))
    bad = pd.DataFrame([{"label": "x", "params": {"plugins": "['no_such_module_xyz']"}, "metrics": {}}])
    assert "no_such_module_xyz" in L.load_plugins(bad)[0]


@pytest.mark.slow
def test_the_report_shows_a_plug_in_tables_section(tmp_path):
    """A run whose config named the plug-in: the report's notebook imports it and gives its table a section."""
    import mlflow

    from reports.build import build
    from tests.e2e.test_sweep import _assert_clean_notebook

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    exp = mlflow.create_experiment("plug", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=exp, run_name="algo=grpo", tags={"rlvr.kind": "trained"}):
        mlflow.log_params({"algo.name": "grpo", "plugins": "['tests.plugins.toy_metric']", "train.steps": 1})
        mlflow.log_metrics({"eval/a/response_length": 6.125, "eval/mean/response_length": 6.125,
                            "eval/a/pass_at_1": 0.375, "eval/mean/pass_at_1": 0.375})
    res = build("plug", f"sqlite:///{tmp_path}/mlflow.db", out_dir=tmp_path / "out", log_to_mlflow=False)
    _assert_clean_notebook(res["notebook"])
    html = res["html"].read_text()
    start = html.index('id="pass@k"')
    assert "0.3750" in html[start:html.find("<h2", start) % (len(html) + 1)]  # to the next section
    section = html[html.index('id="Response-length"'):]
    assert "6.1250" in section and "Mean response length per benchmark" in section


def test_a_table_declared_as_a_record_and_through_the_old_call_registers_the_same_entry():
    """register_table takes the typed record (issue 57) and keeps the call documented before it working (the shim):
    both give equal entries; a record with extra arguments is refused."""
    fn = lambda samples, s: None  # noqa: E731
    try:
        old = register_table("toy_same_way", fn, section="Toy", columns=["x@{k}"], summary=["x@{k}"], replace=True)
        new = register_table(MetricTable("toy_same_way", fn, section="Toy", columns=("x@{k}",), summary=("x@{k}",)),
                             replace=True)
        assert old == new and new.columns == ("x@{k}",) and TABLES.get("toy_same_way") is new
        with pytest.raises(TypeError, match="takes no other arguments"):
            register_table(new, section="Other", replace=True)
    finally:
        TABLES._items.pop("toy_same_way", None)  # the registry has no public removal: a test leaves no table behind
