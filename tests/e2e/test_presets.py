"""Experiment presets (sweeps/experiment/): every sweep point of every preset composes and validates,
the command line prints it (``--cfg job``), and the log-ratio ablation twin runs on the tiny model through
scripts/run_twins.py, the script that runs the full twins (3-15 min each on 2 cores; measured times in docs/performance.md)."""

import functools

import pytest

from tests.conftest import REPO
from tests.e2e.test_sweep import _sweep
from tests.prewarmed import python

PRESETS = sorted(p.stem for p in (REPO / "sweeps" / "experiment").glob("*.yaml"))
# sweep points per preset (Hydra's basic sweeper: the cartesian product of hydra.sweeper.params)
POINTS = {
    "quatro_main": 14, "quatro_main_cpu": 14, "quatro_staleness": 32, "quatro_staleness_cpu": 8,
    "quatro_log_ratio_ablation": 3, "quatro_log_ratio_ablation_cpu": 3, "exppo_core": 25, "exppo_core_cpu": 10,
    "trgrpo_kk": 6, "trgrpo_kk_cpu": 6, "trgrpo_sensitivity": 9, "trgrpo_sensitivity_cpu": 9, "quatro_paper_verl": 1,
    "exppo_multi_answer": 25, "exppo_multi_answer_cpu": 10, "exppo_main": 15, "exppo_main_cpu": 5,
    "exppo_components": 5, "exppo_components_cpu": 5, "exppo_dapo": 2, "exppo_dapo_cpu": 2,
    "exppo_decoding_seeds": 6, "exppo_decoding_seeds_cpu": 6, "quatro_group_size": 4, "quatro_group_size_cpu": 4,
    "trgrpo_cross_model": 6, "trgrpo_cross_model_cpu": 4, "trgrpo_math": 4, "trgrpo_math_cpu": 2,
    "quatro_code": 4, "quatro_code_cpu": 4, "trgrpo_search": 4, "trgrpo_search_cpu": 2, "verl_smoke": 4,
    "cpu_study": 12, "quatro_async_staleness": 72, "quatro_async_staleness_cpu": 4,
}
# what a user adds to a preset before it runs (a Wikipedia index for the search agents): a small index stands in
NEEDS = {"trgrpo_search": "tools.search.index"}


@pytest.fixture(scope="module")
def search_index(tmp_path_factory):
    """A built BM25 index of a few passages, standing in for the Wikipedia index trgrpo_search needs."""
    import json

    from core.retrieval import build_index

    d = tmp_path_factory.mktemp("index")
    (d / "c.jsonl").write_text(json.dumps({"id": "1", "contents": '"A"\nA text.'}) + "\n")
    return build_index(d / "c.jsonl", d / "index")


def _needs(name, index) -> list[str]:
    return [f"{NEEDS[name]}={index}"] if name in NEEDS else []
# distinct trainings (points whose effective configs are equal train once; the rest are duplicates)
TRAINED = {"quatro_main_cpu": 8, "quatro_staleness_cpu": 8, "quatro_log_ratio_ablation_cpu": 3,
           "exppo_core_cpu": 6, "trgrpo_kk_cpu": 6, "trgrpo_sensitivity_cpu": 9,
           "exppo_multi_answer_cpu": 6, "exppo_decoding_seeds_cpu": 6, "exppo_components_cpu": 5,
           "cpu_study": 12, "quatro_async_staleness_cpu": 4}
# distinct trainings where the evaluation differs between points (identity.training_hash): eval.seed=0,1,2 trains once
TRAININGS = {"exppo_decoding_seeds": 2, "exppo_decoding_seeds_cpu": 2}


def test_every_preset_is_listed_and_every_twin_has_a_full_preset():
    assert set(PRESETS) == set(POINTS)
    # every preset names its paper's tables (reports/sections.py), each a registered section, the twin the same
    from reports.sections import SECTIONS

    for name in PRESETS:
        sections = list(_points_with_index(name)[0].report.sections)
        assert sections and not set(sections) - set(SECTIONS), (name, sections)
        if name.endswith("_cpu"):
            assert sections == list(_points_with_index(name.removesuffix("_cpu"))[0].report.sections), name
    for name in PRESETS:
        if name.endswith("_cpu"):
            assert name.removesuffix("_cpu") in PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_every_sweep_point_composes_and_validates(name, search_index):
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.checks.validate import validate_config
    from orchestrator.point.identity import config_hash, training_hash

    points = sweep_points([f"experiment={name}", *_needs(name, search_index)], multirun=True)
    assert len(points) == POINTS[name]
    assert len({tuple(p) for p, _ in points}) == len(points)
    for _point, cfg in points:
        validate_config(cfg)
        assert cfg.experiment_name == name
        # no preset fixes a precision (none of the papers prescribes one): chosen by the device's capability
        assert (cfg.train.precision, cfg.train.rollout.dtype, cfg.eval.dtype) == ("auto", "auto", "auto"), _point
    if name in TRAINED:
        assert len({config_hash(cfg) for _, cfg in points}) == TRAINED[name]
    assert len({training_hash(cfg) for _, cfg in points}) == TRAININGS.get(name, len({config_hash(c) for _, c in points}))


def _points_with_index(name):
    """The composed points of a preset (a built index standing in where the preset needs one)."""
    from orchestrator.checks.preflight import sweep_points

    extra = [f"{NEEDS[name]}=/tmp"] if name in NEEDS else []
    return [cfg for _, cfg in sweep_points([f"experiment={name}", *extra], multirun=True)]


def _points(name):
    from orchestrator.checks.preflight import sweep_points

    return [cfg for _, cfg in sweep_points([f"experiment={name}"], multirun=True)]


def _kl(cfg) -> float:
    """The KL coefficient a run trains with: the engine's k3 term, or TR-GRPO's weighted term in its loss."""
    return float(cfg.algo.kl_beta) or float(cfg.algo.policy_loss.get("kl_beta", 0.0) or 0.0)


def test_paper_presets_carry_their_papers_protocols():
    """The protocol values the papers state (QUATRO appendix B, TR-GRPO Tables 6 and 7, ExPPO Table 9)."""
    # QUATRO main comparison (and its verl setup): identical KL 0.001 for every method, batch 256 prompts,
    # baselines as verl's built-ins run them with verl's defaults
    for name in ("quatro_main", "quatro_main_cpu"):
        cfgs = _points(name)
        assert sorted({c.algo.name for c in cfgs}) == ["cispo", "dapo", "gmpo", "gpg", "grpo", "gspo", "quatro"]
        assert {_kl(c) for c in cfgs} == {0.001}
        by_algo = {c.algo.name: c.algo.policy_loss for c in cfgs}
        assert by_algo["grpo"].dual_clip == 3.0 and by_algo["dapo"].dual_clip == 3.0
        for algo in ("grpo", "dapo", "gspo", "cispo", "gpg"):
            assert by_algo[algo].loss_agg_mode == "token-mean", algo
        assert (by_algo["cispo"].clip_ratio_low, by_algo["cispo"].clip_ratio_high) == (0.2, 0.2)
    main = _points("quatro_main")
    assert {(c.train.prompts_per_step, c.train.group_size, c.train.minibatch_size, c.train.lr) for c in main} == {
        (256, 8, 2048, 1e-6)}
    [verl] = _points("quatro_paper_verl")
    assert (verl.train.prompts_per_step, verl.algo.kl_beta) == (256, 0.001)
    # TR-GRPO on K&K, Table 6: temperature 0.7, clip 0.20/0.24, KL 0.001, G = 8, lr 1e-6, token-mean
    kk = _points("trgrpo_kk")
    assert {(c.train.temperature, c.train.group_size, c.train.lr, c.algo.policy_loss.loss_agg_mode, _kl(c))
            for c in kk} == {(0.7, 8, 1e-6, "token-mean", 0.001)}
    for c in kk:
        if c.algo.policy_loss.name == "tr_grpo":
            pl = c.algo.policy_loss
            assert (pl.clip_ratio_low, pl.clip_ratio_high, pl.alpha, pl.mu, pl.tau) == (0.2, 0.24, 2.0, 0.25, 9.0)
            expect = ("literal", "inside_clip") if c.algo.name == "tr_grpo_literal" else ("inverse_temperature", "outside_clip")
            assert (pl.weight_reading, pl.weight_placement) == expect, c.algo.name
    # Table 7: tau at (1.0, 1.4), bounds at tau 9, one factor at a time
    points = {(float(c.algo.policy_loss.tau), float(c.algo.policy_loss.low), float(c.algo.policy_loss.high))
              for c in _points("trgrpo_sensitivity")}
    assert points == {(t, 1.0, 1.4) for t in (0.5, 2, 7, 9, 10, 20)} | {(9.0, 1.0, 1.2), (9.0, 0.8, 1.5), (9.0, 0.5, 1.5)}
    # TR-GRPO K&K (Tables 1, 4, 7, Fig. 2) on Qwen2.5-3B-Instruct, mini-batch 64 prompts; Table 9's three other models
    assert {(c.model.path, c.train.prompts_per_step, c.train.minibatch_size) for c in kk} == {
        ("Qwen/Qwen2.5-3B-Instruct", 64, 64 * 8)}
    assert {c.model.path for c in _points("trgrpo_sensitivity")} == {"Qwen/Qwen2.5-3B-Instruct"}
    cross = _points("trgrpo_cross_model")
    assert {(c.model.path, c.algo.name) for c in cross} == {(m, a) for m in (
        "Qwen/Qwen2.5-3B", "mistralai/Mistral-7B-Instruct-v0.3", "meta-llama/Llama-3.1-8B-Instruct") for a in ("grpo", "tr_grpo")}
    assert {(c.train.temperature, c.train.group_size, c.train.lr, _kl(c)) for c in cross} == {(0.7, 8, 1e-6, 0.001)}
    # ExPPO (Tables 3, 4, 7, 9): backbones and steps, 32 prompts x G 16, its in-domain budgets k = 16, 16, 8, 4
    main = _points("exppo_main")
    assert {(c.model.path, c.train.steps) for c in main} == {("Qwen/Qwen2.5-7B-Instruct", 900), ("Qwen/Qwen3-0.6B", 300),
                                                             ("microsoft/Phi-3.5-mini-instruct", 300)}
    for name in ("exppo_main", "exppo_components", "exppo_dapo", "exppo_decoding_seeds"):
        for c in _points(name):
            assert (c.train.prompts_per_step, c.train.group_size) == (32, 16), name
            assert list(c.eval.benchmarks) == ["aime24", "aime25", "minerva_math", "olympiadbench"], name
            budgets = {b: (c.eval.decoding[b].n if b in c.eval.decoding else c.eval.n) for b in c.eval.benchmarks}
            assert budgets == {"aime24": 16, "aime25": 16, "minerva_math": 8, "olympiadbench": 4}, name
    parts = {c.algo.name: c.algo.advantage for c in _points("exppo_components")}
    assert {k: (a.get("rarity", True), a.get("pass_rate_gate", True), a.get("shared_norm", True),
                a.get("shuffle_surprisal", False), a.lam) for k, a in parts.items()} == {
        "exppo_full": (True, True, True, False, 0.2), "exppo_no_rarity": (False, True, True, False, 0.2),
        "exppo_no_gate": (True, False, True, False, 0.2), "exppo_no_shared_norm": (True, True, False, False, 0.2),
        "exppo_shuffled": (True, True, True, True, 0.2)}
    dapo = {c.algo.name: c.algo for c in _points("exppo_dapo")}
    for a in dapo.values():  # both arms keep DAPO's clip-higher, token-mean, dynamic sampling, overlong shaping
        assert (a.policy_loss.clip_ratio_high, a.policy_loss.loss_agg_mode, a.dynamic_sampling.enabled) == (0.28, "token-mean", True)
    assert dapo["exppo_dapo"].advantage.name == "exppo" and dapo["exppo_dapo"].advantage.base_estimator == "grpo"
    assert sorted((c.algo.name, c.eval.seed) for c in _points("exppo_decoding_seeds")) == [
        (a, s) for a in ("exppo", "grpo") for s in (0, 1, 2)]
    # TR-GRPO math (Table 2) evaluation: greedy on OlympiadBench, Minerva, MATH-500; 16 samples on AMC and AIME
    from orchestrator.checks.preflight import sweep_points

    [(_, tr)] = sweep_points(["eval=trgrpo_math"])
    for b in ("olympiadbench", "minerva_math", "math500"):
        assert (tr.eval.decoding[b].temperature, tr.eval.decoding[b].n) == (0.0, 1), b
    assert (tr.eval.n, max(tr.eval.ks), tr.eval.temperature, tr.eval.max_new_tokens) == (16, 16, 1.0, 4096)
    assert {"amc23", "aime24"} <= set(tr.eval.benchmarks) and not {"amc23", "aime24"} & set(tr.eval.decoding)
    math = _points("trgrpo_math")
    assert {(c.data.name, c.algo.name) for c in math} == {(d, a) for d in ("dsr_uniform", "orz") for a in ("grpo", "tr_grpo")}
    assert {(c.model.path, c.train.temperature, c.train.group_size, c.train.lr, c.train.max_new_tokens, _kl(c),
             c.train.minibatch_size // c.train.group_size, c.eval.name) for c in math} == {
        ("Qwen/Qwen2.5-7B", 1.0, 8, 1e-6, 4096, 0.001, 128, "trgrpo_math")}
    for c in math:
        if c.algo.name == "tr_grpo":
            assert (c.algo.policy_loss.clip_ratio_low, c.algo.policy_loss.clip_ratio_high) == (0.2, 0.24)
    # QUATRO code (Table 4): Qwen2.5-Coder-1.5B on APPS, QUATRO vs GSPO, pass@k on HumanEval(+) and MBPP(+)
    code = _points("quatro_code")
    assert {(c.model.path, c.data.name, tuple(c.eval.benchmarks)) for c in code} == {
        ("Qwen/Qwen2.5-Coder-1.5B", "apps", ("humaneval", "humaneval_plus", "mbpp", "mbpp_plus"))}
    assert {c.algo.name for c in code} == {"quatro", "gspo"}
    # TR-GRPO search agents (Table 3, Table 6's settings), E5 retrieval, Search-R1's seven benchmarks
    search = _points("trgrpo_search")
    assert {(c.model.path, c.algo.name) for c in search} == {(m, a) for m in ("Qwen/Qwen2.5-3B", "Qwen/Qwen3-4B-Instruct-2507")
                                                             for a in ("grpo", "tr_grpo")}
    assert {(c.train.group_size, c.train.temperature, c.train.max_new_tokens, c.train.lr, _kl(c),
             c.train.minibatch_size // c.train.group_size, c.tools.search.backend, c.data.name) for c in search} == {
        (8, 0.8, 4096, 1e-6, 0.001, 32, "e5", "search_train")}
    assert list(search[0].eval.benchmarks) == ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
    for c in search:
        if c.algo.name == "tr_grpo":
            assert (c.algo.policy_loss.clip_ratio_low, c.algo.policy_loss.clip_ratio_high) == (0.2, 0.24)
    from orchestrator import ConfigError
    from orchestrator.checks.validate import validate_config

    with pytest.raises(ConfigError, match="tools.search: .*set tools.search.url"):
        validate_config(search[0])  # the Wikipedia index is the user's to build
    # QUATRO group size: G in 4, 8, 16, 32 with the main comparison's settings
    assert sorted(c.train.group_size for c in _points("quatro_group_size")) == [4, 8, 16, 32]
    # ExPPO Table 9's lambda grid, 1.0 included
    assert sorted({float(c.algo.advantage.lam) for c in _points("exppo_core") if c.algo.name == "exppo"}) == [
        0.1, 0.3, 0.5, 0.75, 1.0]


# the command line's --cfg job on three presets that cover its paths (a full GPU preset, a CPU twin, and a preset
# whose points are config-group files); every preset's points are composed in-process above
@pytest.mark.parametrize("name", ["quatro_main", "exppo_core_cpu", "trgrpo_sensitivity"])
def test_cfg_job_prints_a_sweep_point(name, tmp_path):
    from orchestrator.checks.preflight import sweep_points

    point, cfg = sweep_points([f"experiment={name}"], multirun=True)[-1]
    proc = _sweep(tmp_path, *point, "--cfg", "job", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"experiment_name: {name}" in proc.stdout
    assert f"name: {cfg.algo.name}" in proc.stdout and f"steps: {cfg.train.steps}" in proc.stdout


def _trained_runs(cwd, experiment):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=200)
    return client, [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]


def _run_twins_script():
    """scripts/run_twins.py as a module (a site-packages distribution owns the name ``scripts``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("rlvr_run_twins", REPO / "scripts" / "run_twins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run_twin = functools.partial(module.run_twin, python=python())  # through this worker's fork server
    return module


@pytest.mark.slow
def test_log_ratio_ablation_twin_runs_both_arms(tmp_path):
    """The twin through scripts/run_twins.py (what users run for the full twins, which take 3-15 min each): the
    tiny model instead of SmolLM2 (CI's 30-minute budget: 40 s instead of 250 s); the preset's sweep, arms,
    settings and pipeline are the same."""
    problems, trained = _run_twins_script().run_twin("quatro_log_ratio_ablation_cpu", tmp_path, ["model=tiny-random"], capture=True)
    assert problems == [] and len(trained) == TRAINED["quatro_log_ratio_ablation_cpu"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'quatro_log_ratio_ablation_cpu'}/mlflow.db")
    arms = {(r.data.params["algo.policy_loss.log_ratio_penalty"], r.data.params["algo.policy_loss.log_ratio_scale"]): r
            for r in trained}
    assert set(arms) == {("True", "mean"), ("True", "sum"), ("False", "mean")}
    for arm, r in arms.items():
        steps = sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/seq_ratio_mean"))
        assert steps == [0, 1] and "eval/arithmetic/pass_at_4" in r.data.metrics
    # without the penalty no sample can have its gradient reversed (the loss logs 0 by construction)
    assert arms[("False", "mean")].data.metrics["train/reversed_share"] == 0.0


def test_staleness_twin_draws_the_staleness_grid_with_its_one_learning_rate(tmp_path):
    """quatro_staleness_cpu sweeps one learning rate: its report draws QUATRO's Fig. 1/4 grid (one colour) and its
    paper tables (run_twin checks each is present and non-empty). The tiny model and inner epochs 1 and 2 (the
    preset's 1, 2, 4, 8 are the same pipeline) keep it to CI's budget."""
    problems, trained = _run_twins_script().run_twin("quatro_staleness_cpu", tmp_path,
                                                     ["model=tiny-random", "train.ppo_epochs=1,2"], capture=True)
    assert problems == [] and len(trained) == 4
    out = tmp_path / "quatro_staleness_cpu" / "reports_out" / "quatro_staleness_cpu" / "latest"
    assert (out / "figures" / "staleness.png").is_file() and (out / "paper" / "staleness.pdf").is_file()
    assert "does not vary train.ppo_epochs" not in (out / "report.html").read_text()


def test_async_staleness_twin_trains_on_stale_rollouts_and_draws_them_against_k(tmp_path):
    """quatro_async_staleness_cpu (issue 58) on the tiny model: QUATRO and GRPO at staleness 0 and 2, three steps; the
    k = 2 runs log train/staleness_mean 0, 1, 2 (the warm-up, then two steps old), the k = 0 runs none, and the report
    draws the async_staleness section (run_twin checks it is present and non-empty) with its figure."""
    from mlflow.tracking import MlflowClient

    problems, trained = _run_twins_script().run_twin("quatro_async_staleness_cpu", tmp_path,
                                                     ["model=tiny-random", "train.max_new_tokens=16",
                                                      "eval.max_new_tokens=16", "eval.max_prompts=4"], capture=True)
    assert problems == [] and len(trained) == TRAINED["quatro_async_staleness_cpu"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'quatro_async_staleness_cpu'}/mlflow.db")
    for r in trained:
        ages = [m.value for m in sorted(client.get_metric_history(r.info.run_id, "train/staleness_mean"),
                                        key=lambda m: m.step)]
        assert ages == ([0.0, 1.0, 2.0] if r.data.params["train.rollout.staleness"] == "2" else []), r.data.params
    out = tmp_path / "quatro_async_staleness_cpu" / "reports_out" / "quatro_async_staleness_cpu" / "latest"
    html = (out / "report.html").read_text()
    assert "Staleness k (asynchronous rollouts)" in html or "Asynchronous staleness" in html


def test_run_twins_refuses_an_unknown_twin_before_any_work_and_names_a_bad_override(capsys, tmp_path):
    main = _run_twins_script().main
    assert main(["quatro_main_cpu", "no_such_twin"]) == 2
    assert "no_such_twin" in capsys.readouterr().err
    assert main(["quatro_log_ratio_ablation_cpu", "--set", "nosuchkey=1", "--work", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "quatro_log_ratio_ablation_cpu: FAILED" in out and "does not compose" in out and "nosuchkey" in out
    assert not list(tmp_path.iterdir())  # nothing ran


def test_search_agent_twin_trains_with_tool_calls_and_the_report_shows_them(tmp_path):
    """The search-agent twin (trgrpo_search_cpu) on one point, TR-GRPO (SmolLM2-135M, the generated world, BM25
    started for the run; the random model never calls the tool): training episodes call the search tool (their
    results masked), exact match and tool metrics are logged for training and evaluation, and the report shows the
    preset's paper table (TR-GRPO Table 3, checked by run_twin) and the "Tool use" section."""
    problems, trained = _run_twins_script().run_twin("trgrpo_search_cpu", tmp_path, [
        "algo=tr_grpo", "train.steps=1", "train.prompts_per_step=2", "train.group_size=4", "train.minibatch_size=8",
        "train.max_new_tokens=40", "tools.max_turns=1", "tools.max_obs_tokens=48", "eval.max_prompts=4", "eval.n=2",
        "eval.ks=[1,2]", "eval.ucc_ks=[2]", "eval.max_new_tokens=40", "eval.batch_prompts=4", "eval.base=false"],
        capture=True)
    assert problems == []
    [run] = trained
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'trgrpo_search_cpu'}/mlflow.db")
    m = run.data.metrics
    assert m["train/tool_calls_mean"] > 0 and 0 < m["train/tool_token_share"] < 1  # searched; results masked
    assert 0 <= m["train/no_answer_share"] <= 1 and set(client.get_run(run.info.run_id).data.metrics) >= {
        "eval/search_demo/exact_match", "eval/search_demo/tool_calls", "eval/search_demo/no_answer_share"}
    assert m["eval/search_demo/exact_match"] == m["eval/search_demo/pass_at_1"]
    assert m["eval/kind/search_general/pass_at_1"] == m["eval/search_demo/pass_at_1"]
    html = (tmp_path / "trgrpo_search_cpu" / "reports_out" / "trgrpo_search_cpu" / "latest" / "report.html").read_text()
    assert html.index('id="paper-trgrpo_search"') < html.index('id="Tool-use"')
    from tests.e2e.test_sweep import _section

    section = _section(html, "Tool-use")
    assert "no_answer_share" in section and f"{m['eval/search_demo/tool_calls']:.4f}" in section
