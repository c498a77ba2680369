"""One plug-in of every kind, each in one file of this folder plus at most one YAML file (``conf/``), run through one
sweep point together: a task and a math benchmark (toy_tasks.py), an algorithm (toy_algorithm.py +
conf/algo/toy_rank.yaml), an engine (toy_engine.py + conf/engine/toy_local.yaml), a sampler (toy_sampler.py), a
metric table (toy_metric.py) and a report section (toy_section.py). No other file of the repository names them (checked below), so adding each one took
only its own files: the claim of docs/extending.md."""
import json
import subprocess

import pandas as pd
import pytest
import torch

from tests.conftest import REPO

PLUGINS = {  # kind: (module, registered name, its YAML or None)
    "task": ("tests.plugins.toy_tasks", "toy_echo", None),
    "algorithm": ("tests.plugins.toy_algorithm", "toy_rank", "conf/algo/toy_rank.yaml"),
    "engine": ("tests.plugins.toy_engine", "toy_local", "conf/engine/toy_local.yaml"),
    "sampler": ("tests.plugins.toy_sampler", "toy_hf", None),
    "metric": ("tests.plugins.toy_metric", "response_length", None),
    "section": ("tests.plugins.toy_section", "toy_reward_range", None),
}


def test_rank_advantage_by_hand():
    """The plug-in algorithm's estimator on the docstring's group (0, 1, 1, 0) and a group of distinct rewards."""
    from tests.plugins import toy_algorithm  # noqa: F401  (registers toy_rank)
    from training.algorithms import get_advantage_fn

    fn = get_advantage_fn("toy_rank")
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 3.0, 1.0, 2.0, 0.0])
    adv, _ = fn(_batch(rewards, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])), scale=2.0)
    # ranks (1.5, 3.5, 3.5, 1.5) and (4, 2, 3, 1) of 1..4, centred by 2.5, divided by 1.5
    expected = [-2 / 3, 2 / 3, 2 / 3, -2 / 3, 1.0, -1 / 3, 1 / 3, -1.0]
    assert torch.allclose(adv, torch.tensor(expected) * 2.0, atol=1e-6)


def test_an_algorithm_declares_the_training_metrics_its_report_panels_plot():
    """The report's per-step panels are the update's and the mismatch's (reports.data.TRAIN_PANELS, no algorithm's)
    plus what each registered algorithm declared (panels=): QUATRO's lambda and reversed share, the toy's metric."""
    from reports.data import TRAIN_PANELS, train_panels
    from tests.plugins import toy_algorithm  # noqa: F401  (registers toy_rank with its panel)
    from training.algorithms import panel_metrics

    declared = panel_metrics()
    assert {"train/lambda_mean", "train/lambda_floored_groups", "train/reversed_share", "train/toy_rank_max"} <= set(declared)
    assert not set(declared) & set(TRAIN_PANELS)
    panels = train_panels()
    assert set(panels) == set(TRAIN_PANELS) | set(declared) and len(panels) == len(set(panels))


def _batch(rewards, groups):
    from types import SimpleNamespace

    return SimpleNamespace(rewards=rewards, group_index=groups)


def test_no_file_outside_the_plug_ins_names_them():
    # the modules' names and the registered names (a metric's column name may be a common word elsewhere)
    names = {m.rsplit(".", 1)[1] for m, _n, _y in PLUGINS.values()} | {n for k, (_m, n, _y) in PLUGINS.items() if k != "metric"}
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    hits = []
    for path in tracked:
        # the suite's code and its config groups (experiment presets and tests may use a plug-in; none may wire it)
        if not path.startswith(("core/", "training/", "evaluation/", "orchestrator/", "reports/", "sweep.py",
                                "sweeps/config.yaml", "sweeps/algo/", "sweeps/engine/", "sweeps/eval/", "sweeps/data/")):
            continue
        text = (REPO / path).read_text(errors="ignore")
        hits += [(path, n) for n in names if n in text]
    assert hits == []


@pytest.mark.slow
def test_one_plugin_of_every_kind_runs_through_one_sweep_point(tmp_path):
    from tests.e2e.test_sweep import TINY, _runs, _sweep

    data = tmp_path / "data" / "toy_math"
    data.mkdir(parents=True)
    data.joinpath("test.jsonl").write_text("\n".join(json.dumps({"problem": f"What is {a} + 1?", "answer": str(a + 1)})
                                                    for a in range(3)) + "\n")
    log = tmp_path / "sampler.log"
    modules = ",".join(m for m, _n, _y in PLUGINS.values())
    proc = _sweep(tmp_path, f"plugins=[{modules}]", f"hydra.searchpath=[file://{REPO / 'tests' / 'plugins' / 'conf'}]",
                  *TINY, "algo=toy_rank", "engine=toy_local", "eval.sampler=toy_hf", "+eval.toy_hf.max_batch=1",
                  "eval.benchmarks=[toy_math,toy_echo]", f"eval.data_dir={tmp_path / 'data'}", "eval.base=false",
                  "report.sections=[toy_reward_range]", env={"TOY_SAMPLER_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, [run] = _runs(tmp_path)
    m, p = run.data.metrics, run.data.params
    # the task and the benchmark: evaluated and tabled by kind
    for key in ("eval/toy_math/pass_at_1", "eval/toy_echo/pass_at_4", "eval/kind/math/pass_at_1", "eval/kind/echo/avg_at_4"):
        assert key in m, key
    df = pd.read_parquet(client.download_artifacts(run.info.run_id, "samples.parquet", str(tmp_path / "dl")))
    assert set(df["benchmark"]) == {"toy_math", "toy_echo"} and len(df) == (3 + 4) * 4
    # the metric table: the mean response length in characters, recomputed from the samples
    for bench, grp in df.groupby("benchmark"):
        assert m[f"eval/{bench}/response_length"] == pytest.approx(grp["response"].str.len().mean())
    # the algorithm: its estimator ran (its own metric) with the preset's parameters
    assert any(k.endswith("toy_rank_max") for k in m), sorted(m)
    assert p.get("algo.advantage.name") in (None, "toy_rank")
    # the engine: every step went through it
    hist = client.get_metric_history(run.info.run_id, "engine/marker_steps")
    assert [h.value for h in sorted(hist, key=lambda h: h.step)] == [1.0, 2.0]
    # the sampler: it sampled every prompt, one per call (its own key)
    calls = [int(x) for x in log.read_text().split()]
    assert calls and set(calls) == {1} and sum(calls) == 3 + 4
    # the report section: named by report.sections (pre-flight knew it from plugins=), shown among the paper's tables
    # (read back from the run's config) and in the body after the built-in sections, its table recomputed from the
    # run's reward history, its figure saved; the report notebook imports the plug-in from the run's config
    from reports.build import build

    rewards = [h.value for h in sorted(client.get_metric_history(run.info.run_id, "train/reward_mean"), key=lambda h: h.step)]
    out = tmp_path / "report"
    build("rlvr", f"sqlite:///{tmp_path / 'mlflow.db'}", out_dir=out, log_to_mlflow=False)
    html = (out / "report.html").read_text()
    assert 'id="paper-toy_reward_range"' in html and "Reward range over training (a plug-in section)" in html
    assert html.index('id="paper-toy_reward_range"') < html.index('id="Cost"')
    import re

    from reports import sections as S

    at = html.rindex("Reward range over training (a plug-in section)")  # order=500: after every built-in section shown
    heads = [re.search(rf"<h2[^>]*>{re.escape(s.body_heading())}<", html) for s in S.body() if s.order < 500 and s.body_heading()]
    assert len([h for h in heads if h]) > 3 and all(h.start() < at for h in heads if h)
    table = pd.read_csv(out / "paper" / "toy_reward_range.csv", index_col=0)
    assert list(table.columns) == ["first", "last", "range"] and len(table) == 1
    assert table.iloc[0].tolist() == pytest.approx([rewards[0], rewards[-1], max(rewards) - min(rewards)])
    assert (out / "figures" / "toy_reward_range.png").is_file() and (out / "paper" / "toy_reward_range.pdf").is_file()


def test_tool_benchmarks_take_a_sampler_that_declares_tool_support():
    """Tool support is a capability a sampler declares (``supports_tools``), not a name the evaluation knows: the
    plug-in sampler inherits the transformers sampler's, vLLM's (no multi-turn episodes through this interface) is
    refused for a benchmark that calls tools, with the capable samplers named."""
    from omegaconf import OmegaConf

    from core.sampling import SAMPLERS, tool_samplers
    from evaluation.pipeline import evaluation_sampler
    from tests.plugins import toy_sampler  # noqa: F401  (registers toy_hf)

    assert tool_samplers() == ["hf", "toy_hf"] and not SAMPLERS["vllm"].tools
    cfg = OmegaConf.create({"benchmarks": ["search_demo"], "sampler": "toy_hf"})
    assert evaluation_sampler(cfg) == "toy_hf"
    assert evaluation_sampler(OmegaConf.merge(cfg, {"sampler": "auto"})) == "hf"
    with pytest.raises(ValueError, match=r"only the samplers \['hf', 'toy_hf'\] run"):
        evaluation_sampler(OmegaConf.merge(cfg, {"sampler": "vllm"}))
