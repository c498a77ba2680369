"""Reports for empty or failed experiments (the report built at the end of the e2e sweep is tested in
tests/e2e/test_sweep.py, on that module's sweep)."""

import numpy as np
import pandas as pd
import pytest

from reports import data as R
from reports import load as L
from reports import render as V
from reports.build import ReportOptions, build
from reports.seed_groups import seed_aggregate
from tests.e2e.test_sweep import _assert_clean_notebook  # noqa: F401  (also used here)


@pytest.mark.slow
def test_empty_experiment_gives_a_short_report(tmp_path):
    res = build("nothing-here", f"sqlite:///{tmp_path}/mlflow.db", out_dir=tmp_path / "out", log_to_mlflow=False)
    html = res["html"].read_text()
    assert "has no runs yet" in html
    _assert_clean_notebook(res["notebook"])


@pytest.mark.slow
def test_all_failed_experiment_says_so(tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    exp = mlflow.create_experiment("broken", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=exp, run_name="algo=quatro", tags={"rlvr.kind": "trained"}):
        mlflow.log_param("algo.name", "quatro")
        mlflow.log_metric("train/reward_mean", 0.5, step=0)
    run = mlflow.search_runs([exp]).iloc[0]
    mlflow.tracking.MlflowClient().set_terminated(run.run_id, status="FAILED")
    res = build("broken", f"sqlite:///{tmp_path}/mlflow.db", out_dir=tmp_path / "out", log_to_mlflow=False)
    html = res["html"].read_text()
    assert "No run of this experiment finished training" in html and "FAILED" in html


def test_bold_best_and_labels():
    import pandas as pd

    html = V.bold_best_html(pd.DataFrame({"pass@1": [0.25, 0.5], "pass@2": [1.0, 1.0]}, index=["a", "b"]))
    assert "<b>0.5000</b>" in html and "<b>0.2500</b>" not in html and "<b>1.0000</b>" not in html
    assert R.display_name("pass_at_8") == "pass@8" and R.display_name("ucc_at_64") == "ucc@64"


@pytest.mark.parametrize("metric", ["accuracy", "pass@2"])
def test_baseline_differences_pair_prompts(metric):
    import pandas as pd

    def samples(c):
        return pd.DataFrame([{"benchmark": "b", "prompt_id": str(p), "correct": bool(x), "sample_idx": j}
                             for p, row in enumerate(c) for j, x in enumerate(row)])

    base = samples([[0, 0], [1, 0], [1, 1]])
    better = samples([[1, 0], [1, 1], [1, 1]])
    from reports.pairing import Pair, differences

    d = differences({"base": base, "better": better}, [Pair("better", "base")], metric, n_boot=500)
    expect = {"accuracy": (0.5 + 0.5 + 0) / 3, "pass@2": (1 + 0 + 0) / 3}[metric]
    assert d.loc["better", "difference"] == pytest.approx(expect)
    assert d.loc["better", "ci_low"] <= expect <= d.loc["better", "ci_high"]


def _runs_frame(rows):
    return pd.DataFrame([{"label": label, "params": params, "metrics": metrics} for label, params, metrics in rows])


def test_subset_temperature_and_training_summary_tables():
    from reports import data as R

    runs = _runs_frame([
        ("grpo", {"eval.temperature": "1.0"}, {"eval/kk/10_people/accuracy": 0.0, "eval/kk/3_people/accuracy": 0.5,
                                               "eval/mean/ucr": 0.2, "eval_T1.5/mean/ucr": 0.3,
                                               "eval_T1.5/mean/pass_at_1": 0.1, "eval/mean/pass_at_1": 0.4}),
        ("tr_grpo", {"eval.temperature": "1.0"}, {"eval/kk/3_people/accuracy": 0.75, "eval/flip/a/b/accuracy": 9.0}),
    ])
    sub = R.subset_table(runs)
    assert list(sub.columns) == ["kk/3_people", "kk/10_people"]  # by number of people, not alphabetically
    assert sub.loc["tr_grpo", "kk/3_people"] == 0.75 and np.isnan(sub.loc["tr_grpo", "kk/10_people"])
    temps = R.temperature_table(runs)
    assert list(temps.index) == [("grpo", 1.0), ("grpo", 1.5)]  # tr_grpo has no extra temperature
    assert temps.loc[("grpo", 1.5), "ucr"] == 0.3 and temps.loc[("grpo", 1.0), "pass@1"] == 0.4
    hist = {"train/clip_fraction": {"gspo": (np.array([0, 1]), np.array([0.2, 0.4]))},
            "train/entropy": {"gspo": (np.array([0, 1]), np.array([2.0, 1.0])),
                              "quatro": (np.array([0, 1]), np.array([2.0, 3.0]))}}
    summ = R.train_summary(hist)
    assert summ.loc["gspo", "clip_fraction"] == pytest.approx(0.3) and summ.loc["quatro", "entropy"] == 2.5
    assert np.isnan(summ.loc["quatro", "clip_fraction"])


def test_report_colours_seeds_and_quatro_advantages_by_hand():
    colors = V.run_colors(["Initialization", "a", "b", "a"])
    assert set(colors) == {"Initialization", "a", "b"} and colors["a"] != colors["b"]
    table = pd.DataFrame({"pass@1": [0.5, 0.7, 0.2]}, index=pd.Index(["grpo seed=0", "grpo seed=1", "quatro seed=0"], name="run"))
    agg = seed_aggregate(table)
    assert agg.loc["grpo", "pass@1"] == "0.6000 ± 0.1414" and agg.loc["grpo", "seeds"] == 2   # std of 0.5, 0.7 (n - 1)
    assert agg.loc["quatro", "pass@1"] == "0.2000" and seed_aggregate(table.iloc[[0, 2]]).empty
    # training seeds and decoding seeds (eval.seed) are told apart: each aggregates over its own axis only
    both = pd.DataFrame({"pass@1": [0.1, 0.3, 0.6, 0.8]}, index=pd.Index(
        ["grpo seed=0 eval.seed=0", "grpo seed=0 eval.seed=1", "grpo seed=1 eval.seed=0", "grpo seed=1 eval.seed=1"], name="run"))
    dec = seed_aggregate(both, key="eval.seed")
    assert list(dec.index) == ["grpo seed=0", "grpo seed=1"] and dec.loc["grpo seed=0", "pass@1"] == "0.2000 ± 0.1414"
    train = seed_aggregate(both)
    assert list(train.index) == ["grpo eval.seed=0", "grpo eval.seed=1"] and train.loc["grpo eval.seed=1", "pass@1"] == "0.5500 ± 0.3536"
    runs = pd.DataFrame({"params": [{"algo.advantage.name": "quatro", "algo.advantage.delta": "0.1", "train.group_size": "8"},
                                    {"algo.advantage.name": "grpo", "train.group_size": "8"}]})
    curves = R.quatro_advantage_curves(runs).set_index("correct")
    # ALGORITHMS.md's check values (G = 8, delta = 0.1): one, four and seven correct answers
    for c, a_correct, a_wrong in [(1, 0.8555, -0.2147), (4, 0.3644, -0.5791), (7, 0.1246, -2.6436)]:
        assert curves.loc[c, "A_correct"] == pytest.approx(a_correct, abs=1e-4)
        assert curves.loc[c, "A_wrong"] == pytest.approx(a_wrong, abs=1e-4)


@pytest.mark.slow
def test_staleness_sweep_report_has_the_faceted_figure_and_seed_means(tmp_path):
    """A synthetic staleness sweep (GSPO and QUATRO x inner epochs 1, 2 x lr 1e-6, 2e-6, two seeds of one point)
    logged to a real MLflow store: the report draws the faceted staleness figure and the seed table cleanly."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    exp = mlflow.create_experiment("stale", artifact_location=(tmp_path / "art").as_uri())
    points = [(a, e, lr, 0) for a in ("gspo", "quatro") for e in (1, 2) for lr in (1e-6, 2e-6)] + [("gspo", 1, 1e-6, 1)]
    for algo, epochs, lr, seed in points:
        with mlflow.start_run(experiment_id=exp, run_name=f"algo={algo}", tags={"rlvr.kind": "trained"}):
            mlflow.log_params({"algo.name": algo, "train.ppo_epochs": epochs, "train.lr": lr, "seed": seed,
                               "train.steps": 2, "delta": 0.1, "train.group_size": 8,
                               **({"algo.advantage.name": "quatro", "algo.advantage.delta": 0.1} if algo == "quatro" else {})})
            for step in (0, 1):
                mlflow.log_metrics({"train/clip_fraction": 0.1 * epochs + step * lr * 1e5, "train/entropy": 1.0 - 0.1 * step,
                                    "train/reward_mean": 0.5 + 0.1 * step}, step=step)
            mlflow.log_metrics({"eval/a/pass_at_1": 0.4 + 0.1 * seed, "eval/mean/pass_at_1": 0.4 + 0.1 * seed})
    res = build("stale", f"sqlite:///{tmp_path}/mlflow.db", out_dir=tmp_path / "out", log_to_mlflow=False)
    _assert_clean_notebook(res["notebook"])
    html = res["html"].read_text()
    assert (tmp_path / "out" / "figures" / "staleness.png").is_file()
    assert (tmp_path / "out" / "figures" / "quatro_advantage.png").is_file()
    start = html.index('id="Mean-')
    seeds = html[start:html.find("<h2", start) % (len(html) + 1)]  # to the next section
    assert "0.4500 ± 0.0707" in seeds   # the two seeds of gspo, 1 epoch, lr 1e-6: 0.4 and 0.5


@pytest.mark.slow
def test_staleness_grid_draws_with_one_learning_rate_and_every_figure_and_table_is_exported(tmp_path):
    """The CPU twin of the staleness study sweeps one learning rate (issue 33): the grid is drawn (one colour), and
    the report writes every figure as PDF and SVG and every table as CSV and booktabs LaTeX under paper/, logged to
    MLflow with the report."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("stale1", artifact_location=(tmp_path / "art").as_uri())
    for algo in ("gspo", "quatro"):
        for epochs in (1, 2, 4, 8):
            with mlflow.start_run(experiment_id=exp, run_name=f"algo={algo}", tags={"rlvr.kind": "trained"}):
                mlflow.log_params({"algo.name": algo, "train.ppo_epochs": epochs, "train.lr": 1e-5, "seed": 0,
                                   "train.steps": 2, "delta": 0.1, "train.group_size": 8})
                for step in (0, 1):
                    mlflow.log_metrics({"train/clip_fraction": 0.05 * epochs, "train/entropy": 1.0 - 0.1 * step,
                                        "train/reward_mean": 0.5}, step=step)
                mlflow.log_metrics({"eval/a/pass_at_1": 0.1 * epochs, "eval/mean/pass_at_1": 0.1 * epochs})
    assert R.staleness_axes(L.load_runs(uri, "stale1")) == ([1, 2, 4, 8], [1e-5])
    res = build("stale1", uri, out_dir=tmp_path / "out", log_to_mlflow=True, options=ReportOptions(
        sections=["quatro_staleness", "quatro_passk", "trgrpo_dynamics", "quatro_entropy", "no_such_table"]))
    _assert_clean_notebook(res["notebook"])
    html = res["html"].read_text()
    assert "does not vary train.ppo_epochs" not in html
    # the paper's tables first, titled with the paper's numbers: drawn from what the sweep has, or naming the key
    for name in ("quatro_staleness", "quatro_passk", "trgrpo_dynamics"):
        assert f'class="paper-table" data-section="{name}"' in html, name
    assert "QUATRO Fig. 1 and 4: clip fraction, entropy and reward" in html
    assert html.index('id="paper-quatro_staleness"') < html.index('id="Cost"')
    assert 'class="paper-missing" data-section="quatro_entropy"' in html and "sweep eval.entropy=true" in html
    assert "No paper section is called &#x27;no_such_table&#x27;" in html or "No paper section is called 'no_such_table'" in html
    stale = pd.read_csv(tmp_path / "out" / "paper" / "paper_quatro_staleness.csv", index_col=0)
    assert sorted(stale["clip_fraction"].round(6)) == sorted([0.05 * e for e in (1, 2, 4, 8)] * 2)  # as logged
    assert list(stale["ppo_epochs"]) == [1, 1, 2, 2, 4, 4, 8, 8]
    paper = tmp_path / "out" / "paper"
    for name in ("staleness", "training_curves", "passk_curves"):
        assert (paper / f"{name}.pdf").read_bytes().startswith(b"%PDF"), name
        assert "<svg" in (paper / f"{name}.svg").read_text()[:2000], name
    # the pass@k table for benchmark a: one row per run, the values logged above (0.1 x epochs), in booktabs
    passk = pd.read_csv(paper / "passk_a.csv", index_col=0)
    assert sorted(passk["pass@1"].round(4)) == sorted([0.1, 0.2, 0.4, 0.8] * 2)
    tex = (paper / "passk_a.tex").read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex and "0.8000" in tex
    assert {p.name for p in res["paper"]} >= {"staleness.pdf", "staleness.svg", "runs.csv", "runs.tex", "passk_a.tex"}
    logged = {f.path for f in MlflowClient(uri).list_artifacts(res["run_id"], "paper")}
    assert {"paper/staleness.pdf", "paper/staleness.svg", "paper/passk_a.csv", "paper/passk_a.tex"} <= logged


def test_the_configured_baseline_is_the_trained_runs_common_value():
    runs = pd.DataFrame({"kind": ["base", "trained", "trained", "trained", "duplicate"],
                         "params": [{}, {"report.baseline": "grpo"}, {"report.baseline": "grpo"}, {"report.baseline": "None"},
                                    {"report.baseline": "gspo"}]})
    assert L.configured_baseline(runs) == "grpo"
    assert L.configured_baseline(runs.iloc[[0, 3]]) is None


def test_export_table_writes_csv_and_escaped_booktabs(tmp_path):
    df = pd.DataFrame({"pass@1": [0.5, 0.25]}, index=pd.Index(["quatro delta=0.01", "tr_grpo"], name="run"))
    csv, tex = V.export_table(df, tmp_path / "paper", "t")
    assert pd.read_csv(csv, index_col=0).equals(df)
    lines = tex.read_text().splitlines()
    assert lines[0] == "\\begin{tabular}{lr}" and lines[1] == "\\toprule"
    assert "tr\\_grpo & 0.2500 \\\\" in lines   # the underscore escaped, four places
    assert V.export_table(pd.DataFrame(), tmp_path / "paper", "empty") == []


def test_cost_table_by_hand():
    """Wall time, GPU-hours, steps/s and samples/s over all steps, peak memory: one local GPU run with three steps,
    one verl run (GPUs from its engine settings), one run that evaluated another's checkpoint (no training figures)."""
    runs = pd.DataFrame({
        "label": ["a", "b", "c"], "kind": ["trained"] * 3, "wall_time_s": [7200.0, 3600.0, 90.0],
        "params": [{"engine.name": "local"}, {"engine.name": "verl", "engine.n_gpus_per_node": "8", "engine.nnodes": "2"},
                   {"engine.name": "local"}],
        "tags": [{}, {}, {"rlvr.trained_in": "0123456789abcdef"}]})
    hist = {"train/step_time_s": {"a": (np.arange(3), np.array([10.0, 20.0, 30.0])), "c": (np.arange(3), np.ones(3))},
            "train/samples_per_s": {"a": (np.arange(3), np.array([6.4, 3.2, 2.0]))},   # 64, 64, 60 responses
            "train/peak_memory_gb": {"a": (np.arange(3), np.array([10.0, 12.5, 11.0]))},
            "train/peak_reserved_gb": {"a": (np.arange(3), np.array([14.0, 15.0, 14.5]))},
            "train/gpus": {"a": (np.arange(3), np.ones(3))}}
    t = R.cost_table(runs, hist)
    assert t.loc["a", "GPU-hours"] == 2.0 and t.loc["a", "steps/s"] == round(3 / 60, 4)
    assert t.loc["a", "samples/s"] == round(188 / 60, 2)
    assert (t.loc["a", "peak allocated (GiB)"], t.loc["a", "peak reserved (GiB)"]) == (12.5, 15.0)
    assert t.loc["b", "GPUs"] == 16 and t.loc["b", "GPU-hours"] == 16.0 and np.isnan(t.loc["b", "steps/s"])
    assert t.loc["c", "trained in"] == "01234567" and np.isnan(t.loc["c", "steps/s"]) and np.isnan(t.loc["c", "GPUs"])


def test_token_probability_table_ranks_each_runs_most_frequent_tokens_by_mean_probability(tmp_path):
    """TR-GRPO's Fig. 1 section reads each trained run's token_probs.csv from a real store: the ``top`` most
    frequent tokens (by count), then ranked by mean probability; a run without the file is left out."""
    import mlflow

    from reports.sections import SECTIONS, Context

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("tok", artifact_location=(tmp_path / "art").as_uri())
    csv = tmp_path / "token_probs.csv"
    pd.DataFrame({"token_id": [10, 11, 12, 13], "token": [" the", "\n", "3", "nan"], "count": [9, 7, 5, 1],
                  "share": [0.41, 0.32, 0.23, 0.04], "mean_prob": [0.5, 0.9, 0.7, 0.99]}).to_csv(csv, index=False)
    for algo in ("grpo", "tr_grpo"):
        with mlflow.start_run(experiment_id=exp, run_name=f"algo={algo}", tags={"rlvr.kind": "trained"}):
            mlflow.log_params({"algo.name": algo, "seed": 0})
            mlflow.log_metric("train/reward_mean", 0.5, step=0)
            if algo == "tr_grpo":
                mlflow.log_artifact(str(csv))
    runs = L.load_runs(uri, "tok")
    t = L.token_prob_table(uri, runs, top=3)   # 13 ("nan", count 1) is not among the 3 most frequent
    assert t.index.get_level_values("run").nunique() == 1   # grpo logged no file
    assert list(t["token"]) == ["'\\n'", "'3'", "' the'"] and list(t["mean_prob"]) == [0.9, 0.7, 0.5]
    assert list(t.index.get_level_values("rank")) == [1, 2, 3]
    ctx = Context(runs=runs, shown=runs, done=L.finished(runs), tracking_uri=uri)
    section = SECTIONS["trgrpo_tokens"].build(ctx)   # the top 20: all four, the token "nan" kept as text
    assert list(section["token"]) == ["'nan'", "'\\n'", "'3'", "' the'"]


def test_at_32_runs_each_run_has_its_own_colour_and_legends_cover_no_data(tmp_path):
    """Readable at the full staleness preset's 32 runs: 32 distinct colours (and the same one for a run in every
    figure, as run_colors is computed once per report), and a legend of 32 entries drawn outside the axes (to the
    right of one axes, below a multi-panel figure), kept in the saved file by bbox_inches="tight"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.image import imread

    labels = [f"algo={a} train.ppo_epochs={e} train.lr={lr}" for a in ("gspo", "quatro") for e in (1, 2, 4, 8)
              for lr in (1e-6, 2e-6, 5e-6, 1e-5)]
    colors = V.run_colors(["Initialization", *labels])
    assert len({colors[lab] for lab in labels}) == 32 and colors["Initialization"] not in {colors[lab] for lab in labels}

    def overlaps(a, b):
        return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, lab in enumerate(labels):
        ax.plot([0, 1, 2], [i, i + 1, i], color=colors[lab], label=lab)
    leg = V.legend(ax)
    fig.canvas.draw()
    assert not overlaps(leg.get_window_extent(), ax.get_window_extent())
    fig.savefig(tmp_path / "one.png", bbox_inches="tight")
    assert imread(tmp_path / "one.png").shape[1] > fig.get_size_inches()[0] * fig.dpi  # widened to keep the legend
    plt.close(fig)
    fig, axs = plt.subplots(1, 3, figsize=(12, 3))
    for ax in axs:
        for i, lab in enumerate(labels):
            ax.plot([0, 1], [i, i], color=colors[lab], label=lab)
    leg = V.legend(axs[0], fig=fig)
    fig.canvas.draw()
    assert all(not overlaps(leg.get_window_extent(), ax.get_window_extent()) for ax in axs)
    assert len(leg.get_texts()) == 32
    plt.close(fig)
    fig, ax = plt.subplots()   # a handful of entries stay inside the axes
    for lab in labels[:3]:
        ax.plot([0, 1], [0, 1], label=lab)
    leg = V.legend(ax)
    fig.canvas.draw()
    assert overlaps(leg.get_window_extent(), ax.get_window_extent())
    plt.close(fig)


def test_paper_numbers_keep_small_values_visible():
    assert [V.paper_number(v) for v in (0.5, 0.0, 2.1e-5, -3e-4, 12.34567, 0.001)] == [
        "0.5000", "0.0000", "2.10e-05", "-3.00e-04", "12.3457", "0.0010"]


def _two_sweeps(tmp_path):
    """One experiment, two sweeps (each a parent run and its points, tagged as orchestrator.point.run tags them); the
    base model evaluated in the first, and the second's run compared against that same base run (the base
    model's evaluation is shared by identity)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("two", artifact_location=(tmp_path / "art").as_uri())
    client, parents, ids = MlflowClient(), {}, {}
    for sweep, algos in (("2026-12-05_10-00-00-000000", ("alpha_algo", "beta_algo")),
                         ("2026-12-05_11-00-00-000000", ("gamma_algo",))):
        sid = f"multirun/two/{sweep}"
        parents[sweep] = client.create_run(exp, run_name=f"sweep {sweep}",
                                           tags={"rlvr.kind": "sweep", "rlvr.sweep_id": sid}).info.run_id
        if "base" not in ids:
            with mlflow.start_run(experiment_id=exp, run_name="base model",
                                  tags={"rlvr.kind": "base", "rlvr.sweep_id": sid}) as r:
                mlflow.log_metrics({"eval/a/pass_at_1": 0.2, "eval/mean/pass_at_1": 0.2}, step=0)
            ids["base"] = r.info.run_id
        for i, algo in enumerate(algos):
            with mlflow.start_run(experiment_id=exp, run_name=f"algo={algo}", tags={
                    "rlvr.kind": "trained", "rlvr.sweep_id": sid, "rlvr.base_run_id": ids["base"],
                    "mlflow.parentRunId": parents[sweep]}) as r:
                mlflow.log_params({"algo.name": algo, "train.steps": 1, "seed": 0})
                mlflow.log_metric("train/reward_mean", 0.5, step=0)
                mlflow.log_metrics({"eval/a/pass_at_1": 0.3 + 0.1 * i, "eval/mean/pass_at_1": 0.3 + 0.1 * i})
            ids[algo] = r.info.run_id
    return uri, parents, ids


@pytest.mark.slow
def test_each_sweeps_report_shows_its_own_runs_and_both_stay(tmp_path, monkeypatch):
    """Issue 46: every sweep of an experiment wrote reports_out/<experiment>/report.html from every run of the
    experiment (a one-point sweep's report counted 8 runs of other sweeps). Now a sweep's report (built under its
    parent run, as the sweep's callback builds it) shows the sweep's own runs and the base run they compared
    against, in the sweep's own folder; ``latest`` links the newest; ``python -m reports`` still compares across
    sweeps."""
    uri, parents, ids = _two_sweeps(tmp_path)
    monkeypatch.chdir(tmp_path)
    first, second = sorted(parents)
    for sweep in (first, second):
        build("two", uri, parent_run_id=parents[sweep], log_to_mlflow=False)
    root = tmp_path / "reports_out" / "two"
    html = {s: (root / s / "report.html").read_text() for s in (first, second)}
    assert "alpha_algo" in html[first] and "beta_algo" in html[first] and "gamma_algo" not in html[first]
    assert "gamma_algo" in html[second] and "alpha_algo" not in html[second] and "beta_algo" not in html[second]
    assert all(L.BASE_LABEL in h for h in html.values())  # the second sweep's flip rates compared against it
    assert (root / "latest").resolve() == (root / second).resolve()
    runs = L.load_runs(uri, "two", sweeps=[second])
    assert sorted(runs["run_id"]) == sorted([ids["base"], ids["gamma_algo"]])
    assert len(L.load_runs(uri, "two")) == 4 and len(L.load_runs(uri, "two", sweeps=[first, second])) == 4
    from reports.build import main

    assert main(["--experiment", "two", "--tracking-uri", uri, "--no-mlflow"]) == 0  # across sweeps: its own folder
    every = (root / "all" / "report.html").read_text()
    assert all(a in every for a in ("alpha_algo", "beta_algo", "gamma_algo"))
    assert (root / first / "report.html").read_text() == html[first]  # nothing written over


@pytest.mark.parametrize("args,fragment", [
    (["--experiment", "tow"], "--experiment='tow': not in sqlite:///"),
    (["--experiment", "two", "--sweep", "2026-12-05_12-00"], "--sweep='2026-12-05_12-00': no run of experiment 'two'"),
    (["--experiment", "two", "--tracking-uri", "sqlite:///nowhere/mlflow.db"], "no such store"),
    # issue 56: a baseline that is none of the runs' names exited 0 with a report that compared against nothing
    (["--experiment", "two", "--baseline", "alpha_algx"],
     "--baseline=alpha_algx: not among these runs (did you mean alpha_algo?) (the base model's row, an algorithm or"),
    # issue 70: a folder that cannot hold files ended in a 23-line traceback
    (["--experiment", "two", "--out", "/proc/x"], "--out=/proc/x: /proc cannot hold files"),
])
@pytest.mark.slow
def test_the_reports_command_refuses_bad_arguments_in_one_line(tmp_path, monkeypatch, capsys, args, fragment):
    """Issue 46: ``--experiment`` with a typo built an empty report and created an empty store. One line, exit 2,
    nothing built or created."""
    from reports.build import main

    uri, _, _ = _two_sweeps(tmp_path)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*args, *([] if "--tracking-uri" in args else ["--tracking-uri", uri])])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "reports_out").exists() and not (tmp_path / "nowhere").exists()


def test_the_section_registry_orders_the_body_checks_its_entries_and_contains_a_failing_plug_in(tmp_path):
    """The report body is the registered sections by ``order`` (the built-ins' order, each topic once); a section
    needs a table or a body, a body needs a place, a figure needs a table, a name is registered once; a plug-in
    section that raises leaves one note and the next section still shows, while a built-in one's error is raised."""
    import types

    import pandas as pd
    import pytest

    from reports import sections as S

    body = [s.name for s in S.body()]
    assert body[:4] == ["summary", "runs", "paper_tables", "cost"] and body[-1] == "more_tables"
    assert body.index("training_curves") < body.index("quatro_staleness") < body.index("passk") < body.index("study")
    assert len(body) == len(set(body)) and all(not S.plugin_section(S.SECTIONS[n]) for n in body)
    # a paper topic with a figure is one entry: its paper table and its body part
    for name in ("quatro_staleness", "quatro_advantage", "exppo_coverage", "cost"):
        assert S.SECTIONS[name].paper and S.SECTIONS[name].order is not None, name
    assert "paper_tables" not in S.paper_names() and "quatro_passk" in S.paper_names()
    # the closing section shows what no section claims: the built-ins claim every built-in table but none of a plug-in's
    assert {"passk", "ucc", "similarity", "modes", "verifier"} <= S.claimed_tables()

    for kwargs, fragment in (({}, "needs build"), ({"show": print}, "no order"),
                             ({"show": print, "order": 1, "figure": print}, "no build")):
        with pytest.raises(ValueError, match=fragment):
            S.register_section("toy_bad_entry", "t", **kwargs)
    with pytest.raises(ValueError, match="already registered"):
        S.register_section("passk", "again", build=lambda ctx: pd.DataFrame())

    class Page:  # records what a section writes
        def __init__(self):
            self.out = []

        def __getattr__(self, kind):
            return lambda *a, **k: self.out.append((kind, a[0] if a else None))

    def broken(ctx):
        raise RuntimeError("no such column\nsecond line")

    module = types.ModuleType("toy_plugin_module")
    broken.__module__ = module.__name__
    sec = S.ReportSection("toy_broken", "Broken", build=broken, order=999)
    page = Page()
    ctx = S.Context(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), "sqlite:///x")
    S.show_section(sec, ctx, page)
    assert page.out == [("heading", "Broken"), ("note", "The plug-in section 'toy_broken' failed, so it is not "
                                                        "shown: RuntimeError: no such column")]

    def broken_builtin(ctx, page):
        raise RuntimeError("a bug in a built-in section")

    broken_builtin.__module__ = "reports.sections.cost"   # as if defined in the suite's own folder
    with pytest.raises(RuntimeError, match="a bug in a built-in section"):
        S.show_section(S.ReportSection("toy_builtin", "Built in", show=broken_builtin, order=1), ctx, Page())


def test_rows_are_named_by_the_factors_that_vary_beside_them():
    """Issue 70: a point that ran at one level of a factor crossed with the algorithms is named by it (``gspo
    correction=token_tis`` beside QUATRO at two corrections); a top-level knob an algorithm ignores (GRPO's
    ``delta``) does not label it; the base model is ``Initialization``."""
    import pandas as pd

    def run(algo, corr, delta="0.1"):
        return {"algo": algo, "kind": "trained", "params": {"algo.name": algo, "train.rollout.correction": corr,
                                                           "delta": delta}}

    runs = pd.DataFrame([run("quatro", "none", "0.01"), run("quatro", "token_tis", "0.01"), run("quatro", "none"),
                         run("gspo", "token_tis"), run("grpo", "none"),
                         {"algo": "base model", "kind": "base", "params": {}}])
    assert list(R.short_labels(runs)["label"]) == [
        "quatro delta=0.01 correction=none", "quatro delta=0.01 correction=token_tis", "quatro delta=0.1 correction=none",
        "gspo correction=token_tis", "grpo correction=none", "Initialization"]
