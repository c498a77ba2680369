"""Failure isolation, idempotent re-runs, +force, and parallel jobs on one SQLite store."""


from tests.conftest import CONCURRENT, require_benchmarks
from tests.e2e.test_sweep import TINY, _runs, _sweep

FAST = TINY + ["train.steps=2", "report.enabled=false"]


def _bench_dirs(tmp_path):
    """Three benchmark folders with the same two AIME 2024 problems as ``toy_flaky`` (tests/plugins/toy_tasks.py):
    in ``bad`` its scorer fails (a ``FAIL`` file beside the data), a failure only the evaluation meets, since
    pre-flight reads every benchmark's rows first and refuses a malformed file before any work."""
    src = require_benchmarks() / "aime24" / "test.jsonl"
    lines = src.read_text().splitlines()[:2]
    dirs = {}
    for name in ("good1", "good2", "bad"):
        d = tmp_path / "data" / name / "toy_flaky"
        d.mkdir(parents=True)
        d.joinpath("test.jsonl").write_text("\n".join(lines) + "\n")
        if name == "bad":
            d.joinpath("FAIL").write_text("")
        dirs[name] = d.parent
    return dirs


def test_one_failing_point_does_not_stop_the_others_and_a_rerun_trains_only_it(tmp_path):
    dirs = _bench_dirs(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    args = ["-m", "algo=gspo", f"eval.data_dir={dirs['good1']},{dirs['good2']},{dirs['bad']}",
            "eval.benchmarks=[arithmetic,toy_flaky]", "plugins=[tests.plugins.toy_tasks]", *FAST]
    proc = _sweep(work, *args)
    assert proc.returncode != 0
    assert "Sweep summary" in proc.stdout and "1 point(s) did not finish" in proc.stdout
    client, runs = _runs(work)
    status = {r.data.params["eval.data_dir"]: r.info.status for r in runs}
    assert status == {str(dirs["good1"]): "FINISHED", str(dirs["good2"]): "FINISHED", str(dirs["bad"]): "FAILED"}
    failed = next(r for r in runs if r.info.status == "FAILED")
    tb = client.download_artifacts(failed.info.run_id, "traceback.txt", str(tmp_path))
    assert "toy_flaky: " in open(tb).read() and "FAIL exists" in open(tb).read()

    (dirs["bad"] / "toy_flaky" / "FAIL").unlink()  # fix the cause
    proc = _sweep(work, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, runs = _runs(work)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    assert len(trained) == 4  # the three of the first sweep, plus only the fixed point
    assert sorted(r.info.status for r in trained) == ["FAILED", "FINISHED", "FINISHED", "FINISHED"]
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "duplicate"]) == 2
    # the points differ only in their evaluation data: one of them trained, the others evaluated its checkpoint
    finished = [r for r in trained if r.info.status == "FINISHED"]
    assert len([r for r in finished if "rlvr.trained_in" not in r.data.tags]) == 1
    assert len({r.data.tags.get("rlvr.trained_in") for r in finished if "rlvr.trained_in" in r.data.tags}) == 1

    proc = _sweep(work, "-m", "algo=gspo", f"eval.data_dir={dirs['good1']}", "eval.benchmarks=[arithmetic,toy_flaky]",
                  "plugins=[tests.plugins.toy_tasks]", "+force=true", *FAST)
    assert proc.returncode == 0
    _, runs = _runs(work)
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]) == 5  # +force trains again


def test_three_parallel_points_evaluate_the_base_model_once_and_every_checkpoint(tmp_path):
    """hydra/launcher=local: three processes at once (on two cores) on one new SQLite store. Exactly one base run, every trained
    run evaluated at each kept checkpoint (steps 1 and 2) with flip rates against that base run, no metric lost,
    and the report plots the trajectories. Re-running the sweep trains nothing and evaluates no base model."""
    args = ["-m", "hydra/launcher=local", "algo=quatro,grpo,gspo", *TINY, "train.steps=2", "train.save_every=1",
            "eval.checkpoints=all"]
    proc = _sweep(tmp_path, *args, env=CONCURRENT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(tmp_path)
    trained = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    bases = [r for r in runs if r.data.tags.get("rlvr.kind") == "base"]
    assert len(trained) == 3 and all(r.info.status == "FINISHED" for r in trained)
    assert len(bases) == 1 and bases[0].info.status == "FINISHED" and bases[0].info.run_name == "Initialization"
    assert [m.step for m in client.get_metric_history(bases[0].info.run_id, "eval/mean/pass_at_4")] == [0]
    for r in trained:
        for key in ("train/reward_mean", "train/entropy", "train/grad_norm", "train/step_time_s"):
            assert sorted(m.step for m in client.get_metric_history(r.info.run_id, key)) == [0, 1], key
        assert r.data.tags["rlvr.base_run_id"] == bases[0].info.run_id
        for key in ("eval/mean/pass_at_4", "eval/arithmetic/entropy", "eval/all/flip/very_hard/n_prompts"):
            assert sorted(m.step for m in client.get_metric_history(r.info.run_id, key)) == [1, 2], key
        arts = {a.path for a in client.list_artifacts(r.info.run_id, "eval/step_1")}
        assert {"eval/step_1/samples.parquet", "eval/step_1/flip_rates.csv"} <= arts
    figures = {p.name for p in (tmp_path / "reports_out" / "rlvr" / "latest" / "figures").glob("*.png")}
    assert {"checkpoint_trajectory.png", "flip_rates.png"} <= figures
    html = (tmp_path / "reports_out" / "rlvr" / "latest" / "report.html").read_text()
    assert "Initialization" in html[html.index('id="pass@k"'):]

    proc = _sweep(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, runs = _runs(tmp_path)
    kinds = [r.data.tags.get("rlvr.kind") for r in runs]
    assert kinds.count("trained") == 3 and kinds.count("base") == 1 and kinds.count("duplicate") == 3


def test_a_failed_base_evaluation_fails_the_sweep_and_a_rerun_adds_the_flip_rates(tmp_path, monkeypatch, tiny_cfg):
    """The base model cannot be written to its cache folder (a file is in the way): the trained point still
    finishes, the sweep exits 1 naming the base evaluation; once the cause is gone, re-running the sweep trains
    nothing, evaluates the base model and adds the flip rates to the run that lacked them."""
    from core.models import tiny_model_dir

    cache = tmp_path / "cache"
    monkeypatch.setenv("RLVR_CACHE", str(cache))
    blocker = tiny_model_dir(tiny_cfg.model)
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a model folder")
    args = ["-m", "algo=grpo", *FAST]
    proc = _sweep(tmp_path, *args, env={"RLVR_CACHE": str(cache)})
    assert proc.returncode == 1 and "The base model's evaluation failed" in proc.stdout, proc.stdout[-2000:]
    client, runs = _runs(tmp_path)
    [trained] = [r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]
    [base] = [r for r in runs if r.data.tags.get("rlvr.kind") == "base"]
    assert trained.info.status == "FINISHED" and base.info.status == "FAILED"
    assert "rlvr.base_run_id" not in trained.data.tags and not any("/flip/" in k for k in trained.data.metrics)

    blocker.unlink()
    proc = _sweep(tmp_path, *args, env={"RLVR_CACHE": str(cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(tmp_path)
    [new_base] = [r for r in runs if r.data.tags.get("rlvr.kind") == "base" and r.info.status == "FINISHED"]
    trained = client.get_run(trained.info.run_id)
    assert trained.data.tags["rlvr.base_run_id"] == new_base.info.run_id
    assert [m.step for m in client.get_metric_history(trained.info.run_id, "eval/all/flip/very_hard/n_prompts")] == [2]
    assert "flip_rates.csv" in {a.path for a in client.list_artifacts(trained.info.run_id)}
    assert len([r for r in runs if r.data.tags.get("rlvr.kind") == "trained"]) == 1


def test_decoding_seeds_train_once_evaluate_twice_and_the_report_aggregates_them(tmp_path):
    """``eval.seed=0,1``: the evaluation is not part of the training identity, so the first point trains and the
    second evaluates the same checkpoint in a run of its own (tag ``rlvr.trained_in``, the training metrics
    copied); the two evaluations differ (other seeds), and the report shows their mean and sample std."""
    import numpy as np
    import pandas as pd

    proc = _sweep(tmp_path, "-m", "algo=gspo", "eval.seed=0,1", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = _runs(tmp_path)
    points = sorted((r for r in runs if r.data.tags.get("rlvr.kind") == "trained"), key=lambda r: r.data.params["eval.seed"])
    assert [r.info.status for r in points] == ["FINISHED", "FINISHED"]
    trainer, evaluator = points
    assert "rlvr.trained_in" not in trainer.data.tags and evaluator.data.tags["rlvr.trained_in"] == trainer.info.run_id
    assert trainer.data.tags["rlvr.train_hash"] == evaluator.data.tags["rlvr.train_hash"]
    assert trainer.data.tags["rlvr.config_hash"] != evaluator.data.tags["rlvr.config_hash"]
    # one training: the same checkpoint bytes, the training curve copied, not re-run
    ckpt = [tmp_path / r.data.tags["rlvr.run_dir"] / "checkpoint" / "model.safetensors" for r in points]
    assert ckpt[0].read_bytes() == ckpt[1].read_bytes()
    hist = [[(m.step, m.value) for m in sorted(client.get_metric_history(r.info.run_id, "train/reward_mean"),
                                                 key=lambda m: m.step)] for r in points]
    assert hist[0] == hist[1] and len(hist[0]) == 2
    # two evaluations: each with its own seed in its samples
    samples = [pd.read_parquet(tmp_path / r.data.tags["rlvr.run_dir"] / "eval" / "samples.parquet") for r in points]
    assert set(samples[0]["seed"]).isdisjoint(samples[1]["seed"])
    assert not samples[0]["response"].equals(samples[1]["response"])
    # the report: one row "gspo" over the two decoding seeds, mean +- sample std of the two pass@1 values
    p1 = [r.data.metrics["eval/arithmetic/pass_at_1"] for r in points]
    html = (tmp_path / "reports_out" / "rlvr" / "latest" / "report.html").read_text()
    section = html[html.index("mean ± std over decoding seeds"):]
    expect = f"{np.mean(p1):.4f}" + (f" ± {np.std(p1, ddof=1):.4f}")
    assert expect in section, expect
