"""Honest checkpoint selection (orchestrator.point.run_evaluation.select_on_validation): a validation split held out of the training
prompts, every kept checkpoint scored on it, the best one evaluated on the benchmarks, ``train.keep_top_k`` keeping
only the best on disk, and the report naming the chosen step. One sweep point through the real command on the tiny
model and the toy parity task (a random model's responses are right about half the time; a large learning rate,
0.05, makes each step's checkpoint answer differently); every number checked against the validation samples by
hand."""
import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.prewarmed import python

STEPS, N_PROMPTS, N_VAL, N, K, TOP = 4, 16, 6, 6, 2, 2
ARGS = ["-m", "algo=grpo", "model=tiny-random", "eval=smoke", "plugins=[tests.plugins.toy_tasks]", "data.name=toy_parity",
        f"+data.n_prompts={N_PROMPTS}", f"data.validation_prompts={N_VAL}", "eval.benchmarks=[toy_parity]", "eval.base=false",
        f"train.steps={STEPS}", "train.save_every=1", "train.prompts_per_step=2", "train.group_size=4",
        "train.minibatch_size=4", "train.max_new_tokens=8", "train.lr=0.05", "eval.select_on=validation", f"eval.validation.n={N}",
        f"eval.validation.k={K}", f"train.keep_top_k={TOP}", "report.enabled=false"]


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021), eq. 1, with math.comb: 1 - C(n-c, k) / C(n, k)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _sweep(cwd, args):
    """Run the sweep ``args`` in ``cwd``; returns (cwd, MLflow client, its one trained run)."""
    proc = subprocess.run([*python(), str(REPO / "sweep.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd}/mlflow.db")
    exp = client.get_experiment_by_name("rlvr")
    [run] = client.search_runs([exp.experiment_id], filter_string="tags.`rlvr.kind` = 'trained'")
    return cwd, client, run


@pytest.fixture(scope="module")
def selected(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("select"), ARGS)


@pytest.mark.slow
def test_the_chosen_checkpoint_is_the_best_on_held_out_training_prompts_and_only_the_best_are_kept(selected):
    cwd, client, run = selected
    run_dir = Path(run.data.tags["rlvr.run_dir"])
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"val/pass_at_{K}")}
    assert sorted(logged) == list(range(1, STEPS + 1))  # every kept checkpoint and the final one, once each
    # each score by hand from its samples: the held-out prompts (the last N_VAL the task makes), N samples each
    want_ids = {f"p{i}" for i in range(N_PROMPTS - N_VAL, N_PROMPTS)}
    for step, value in logged.items():
        s = pd.read_parquet(run_dir / "validation" / f"step_{step}" / "samples.parquet")
        assert set(s["prompt_id"]) == want_ids, step
        per = s.groupby("prompt_id")["correct"].agg(["size", "sum"])
        assert (per["size"] == N).all()
        assert value == pytest.approx(sum(_pass_at_k(N, int(c), K) for c in per["sum"]) / N_VAL, abs=1e-9)
    from omegaconf import OmegaConf

    from core.tasks import load_prompts

    data = OmegaConf.create({"name": "toy_parity", "n_prompts": N_PROMPTS, "validation_prompts": N_VAL})
    import tests.plugins.toy_tasks  # noqa: F401  (registers toy_parity)

    assert not {r["id"] for r in load_prompts(data, "train")} & want_ids  # never trained on
    assert len(set(logged.values())) > 1, logged  # the checkpoints differ: the choice is not a tie-break alone
    best = min(logged, key=lambda s: (-logged[s], s))  # the highest score, the earliest on a tie
    assert run.data.tags["rlvr.selected_step"] == str(best)
    assert f"pass@{K}" in run.data.tags["rlvr.selected_on"] and f"{N_VAL} held-out" in run.data.tags["rlvr.selected_on"]
    # the benchmarks evaluated the chosen checkpoint, once, at its step
    hist = client.get_metric_history(run.info.run_id, "eval/toy_parity/pass_at_1")
    assert [m.step for m in hist] == [best]
    # train.keep_top_k: only the TOP best kept checkpoints stay (the final one, the run's record, always)
    ranked = sorted(logged, key=lambda s: (-logged[s], s))
    kept = {int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*")}
    assert kept == {s for s in ranked[:TOP] if s < STEPS}, (ranked, kept)
    assert (run_dir / "checkpoint" / "config.json").is_file()
    # the report's run table names the evaluated checkpoint
    from reports.data import run_table
    from reports.load import load_runs

    table = run_table(load_runs(f"sqlite:///{cwd}/mlflow.db", "rlvr"))
    assert table["evaluated checkpoint"].dropna().tolist() == [f"step {best} (best {run.data.tags['rlvr.selected_on']})"]


@pytest.fixture(scope="module")
def selected_in_loop(tmp_path_factory):
    """The same point choosing among the policies the validation inside the loop scored (``train.validate_every=1``,
    no ``train.save_every``)."""
    args = [a for a in ARGS if a != "train.save_every=1"] + ["train.validate_every=1"]
    return _sweep(tmp_path_factory.mktemp("select_loop"), args)


@pytest.mark.slow
def test_selection_on_the_loops_validation_keeps_only_the_policies_it_may_still_choose(selected_in_loop):
    """Issue 69: ``eval.select_on=validation`` with the validation inside the loop chooses among the starting policy,
    each step's and the final one by their logged pass@k (each by hand from its samples), and kept on disk only the
    ``train.keep_top_k`` best before the last (the final checkpoint always), never a policy per candidate."""
    cwd, client, run = selected_in_loop
    run_dir = Path(run.data.tags["rlvr.run_dir"])
    logged = {m.step: m.value for m in client.get_metric_history(run.info.run_id, f"val/toy_parity/pass_at_{K}")}
    assert sorted(logged) == list(range(STEPS + 1))
    for step, value in logged.items():
        s = pd.read_parquet(run_dir / "validation" / f"step_{step}" / "samples.parquet")
        per = s.groupby("prompt_id")["correct"].agg(["size", "sum"])
        assert len(per) == N_VAL and (per["size"] == N).all()
        assert value == pytest.approx(sum(_pass_at_k(N, int(c), K) for c in per["sum"]) / N_VAL, abs=1e-9)
    ranked = sorted(logged, key=lambda s: (-logged[s], s))
    assert run.data.tags["rlvr.selected_step"] == str(ranked[0])
    assert "in the loop" in run.data.tags["rlvr.selected_on"]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/toy_parity/pass_at_1")] == [ranked[0]]
    kept = {int(p.name.split("_")[1]) for p in (run_dir / "selectable").glob("step_*")}
    assert kept == set([s for s in ranked if s < STEPS][:TOP]), (ranked, kept)
    assert not (run_dir / "checkpoints").exists() and (run_dir / "checkpoint" / "config.json").is_file()
