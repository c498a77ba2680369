"""Every paper preset's CPU twin shows its paper's tables (issue 33): the twin's own sweep through
scripts/run_twins.py, which checks that the sweep exited 0, that every distinct config has a FINISHED trained run,
and that the report holds every section the preset's ``report.sections`` names, non-empty; this test also checks
each is titled with the paper's table or figure number and comes before the generic sections.

To fit CI, every twin runs on the tiny random model with one training step, short responses and two of its
points (the preset's other arms are the same pipeline); where a section needs correct answers (similarity among
correct responses, the Shared set's disagreement, answer modes), the twin trains and evaluates on ``toy_parity``
(tests/plugins/toy_tasks.py), which a random model answers correctly about half the time. The log-ratio, staleness
and study twins have their own tests (tests/e2e/test_presets.py, tests/e2e/test_study.py); the search-agent twin
runs on SmolLM2 there, since the random model never calls the tool.
"""
import html as H

import pytest

from tests.e2e.test_presets import TRAINED, _run_twins_script
from tests.e2e.test_sweep import render_in_browser

SHORT = ["model=tiny-random", "train.steps=1", "train.max_new_tokens=16", "eval.max_new_tokens=16"]
PARITY = ["plugins=[tests.plugins.toy_tasks]", "data.name=toy_parity", "+data.n_prompts=16",
          "eval.benchmarks=[toy_parity]"]
KK = ["data.eval_per_size=1"]
# twin: (overrides after the preset, distinct configs expected); a preset's config-group arms (+exppo_part, ...) are
# narrowed by replacing its sweeper's parameters, as the command line cannot repeat a +group
TWINS = {
    "quatro_main_cpu": (["algo=quatro,grpo_verl", "delta=0.1", "eval.max_prompts=4", *PARITY], 2),
    "quatro_group_size_cpu": (["train.group_size=2,4", "eval.max_prompts=4"], 2),
    "quatro_code_cpu": (["algo=quatro,gspo", "delta=0.1", "eval.max_prompts=2"], 2),
    "exppo_main_cpu": (["algo=grpo,exppo", "eval.max_prompts=4", *PARITY], 2),
    "exppo_core_cpu": (["algo=grpo,exppo", "exppo_lambda=0.5", "eval.max_prompts=4", *PARITY], 2),
    "exppo_components_cpu": (["hydra.sweeper.params={+exppo_part: 'full,no_gate'}", "eval.max_prompts=4", *PARITY], 2),
    "exppo_dapo_cpu": (["eval.max_prompts=4", *PARITY], 2),
    "exppo_decoding_seeds_cpu": (["algo=exppo", "eval.seed=0,1", "eval.max_prompts=4"], 2),  # one training
    "exppo_multi_answer_cpu": (["algo=grpo,exppo", "exppo_lambda=0.5", "eval.max_prompts=4", "eval.n=4",
                                "eval.ks=[1,2,4]", *PARITY], 2),
    "trgrpo_kk_cpu": (["algo=tr_grpo,tr_grpo_random", *KK], 2),
    "trgrpo_cross_model_cpu": (["algo=grpo,tr_grpo", *KK], 2),
    "trgrpo_sensitivity_cpu": (["hydra.sweeper.params={algo: tr_grpo, +trgrpo_point: 'tau_2,bounds_1p0_1p2'}", *KK], 2),
    "trgrpo_math_cpu": (["algo=grpo,tr_grpo", "eval.max_prompts=4"], 2),
}


# one twin's report per paper opened in headless Chromium, its screenshot kept (test-artifacts/paper_<twin>.png)
IN_BROWSER = {"quatro_main_cpu", "exppo_core_cpu", "trgrpo_kk_cpu"}


def _kk(cwd, trained):
    """K&K through the whole pipeline: the K&K reward in training, the per-size table in evaluation, the token
    probabilities of TR-GRPO's Fig. 1."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    for run in trained:
        # 16 random tokens never spell <think>...</think><answer>...</answer>: every response gets the format penalty
        assert run.data.metrics["train/reward_mean"] == -1.0
        assert run.data.metrics["eval/kk/2_people/accuracy"] == 0.0 and "eval/kk/4_people/pass_at_4" in run.data.metrics
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"subsets.csv", "samples.parquet", "token_probs.csv"} <= arts


CHECKS = {"trgrpo_kk_cpu": _kk}


def test_every_twin_is_checked_here_or_in_its_own_test():
    twins = {p.stem for p in (_run_twins_script().REPO / "sweeps" / "experiment").glob("*_cpu.yaml")}
    own = {"quatro_log_ratio_ablation_cpu", "quatro_staleness_cpu", "trgrpo_search_cpu", "quatro_async_staleness_cpu"}
    assert twins == set(TWINS) | own
    for name, (_, n) in TWINS.items():
        assert n <= TRAINED.get(name, n), name


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_report_shows_its_papers_tables(name, tmp_path):
    from orchestrator.checks.preflight import sweep_points
    from orchestrator.store.tracking import TAG_HASH
    from reports.sections import SECTIONS

    overrides, n_configs = TWINS[name]
    problems, trained = _run_twins_script().run_twin(name, tmp_path, [*SHORT, *overrides], capture=True)
    assert problems == [], problems
    assert len({r.data.tags.get(TAG_HASH) for r in trained}) == n_configs
    sections = list(sweep_points([f"experiment={name}"], multirun=True)[0][1].report.sections)
    html = (tmp_path / name / "reports_out" / name / "latest" / "report.html").read_text(encoding="utf-8")
    for s in sections:  # titled with the paper's number, and shown before the generic sections
        assert H.escape(SECTIONS[s].title) in html or SECTIONS[s].title in html, s
        assert html.index(f'id="paper-{s}"') < html.index('id="Cost"'), s
    if name in IN_BROWSER:  # every paper table rendered, visible and filled; every figure decoded and laid out
        check = render_in_browser(tmp_path / name / "reports_out" / name / "latest" / "report.html", tmp_path, f"paper_{name}.png")
        assert check["errors"] == [] and check["shown"] == check["images"] > 0, check
        assert [p[0] for p in check["paper"]] == sections and all(cells > 0 and seen for _, cells, seen in check["paper"])
    if name in CHECKS:
        CHECKS[name](tmp_path / name, trained)
