"""Sampling (entropy, resume) and `python -m orchestrator.evaluate` on real benchmark files with the tiny model."""
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from core.sampling import HFSampler, SamplingSettings, prompt_texts
from evaluation.pipeline import Draw, sample_benchmarks
from tests.conftest import REPO
from tests.prewarmed import python


def test_hf_sampler_entropy_is_the_exact_mean_next_token_entropy(tiny_policy):
    model, tok = tiny_policy
    sampler = HFSampler(model, tok, score_rows=2, score_tokens=2)  # chunked in rows and positions
    [samples] = sampler.sample(["Compute 1 + 1."], 3, [0], SamplingSettings(1.0, 1.0, 5))
    assert len({s["response"] for s in samples}) > 1  # the n samples of a prompt differ
    text = prompt_texts(tok, ["Compute 1 + 1."])[0]
    p = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    for s in samples:
        r = tok(s["response"], return_tensors="pt", add_special_tokens=False).input_ids
        if r.shape[1] != s["n_tokens"]:
            continue  # decoding/re-encoding is not always the identity; skip those
        with torch.no_grad():
            logits = model(input_ids=torch.cat([p, r], 1)).logits[0, p.shape[1] - 1:-1]
        lp = torch.log_softmax(logits.float(), -1)
        assert s["mean_token_entropy"] == pytest.approx(float(-(lp.exp() * lp).sum(-1).mean()), rel=1e-4)


class _CountingSampler:
    """Deterministic Sampler for the resume logic; fails on demand after some prompts."""

    def __init__(self, fail_after=None):
        self.prompts_seen, self.fail_after = [], fail_after

    name = "counting"

    def sample(self, prompts, n, seeds, settings):
        if self.fail_after is not None and len(self.prompts_seen) >= self.fail_after:
            raise KeyboardInterrupt("interrupted")
        self.prompts_seen += list(prompts)
        return [[{"response": f"\\boxed{{{p[-1]}}}", "n_tokens": 3, "finish_reason": "stop"} for _ in range(n)] for p in prompts]


def test_interrupted_evaluation_resumes_without_resampling(tmp_path):
    rows = {"b": [{"id": str(i), "prompt": f"q{i}", "gold": str(i), "task": "arithmetic"} for i in range(6)]}
    path = tmp_path / "samples.parquet"
    with pytest.raises(KeyboardInterrupt):
        sample_benchmarks(_CountingSampler(fail_after=4), rows, Draw(n=2, seed=0, batch_prompts=2), path)
    assert len(pd.read_parquet(path)) == 4 * 2  # two finished batches kept
    second = _CountingSampler()
    table = sample_benchmarks(second, rows, Draw(n=2, seed=0, batch_prompts=2), path)
    assert second.prompts_seen == ["q4", "q5"]
    assert len(table) == 12 and table["correct"].all()


def _eval(cwd, *args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([*python(), "-m", "orchestrator.evaluate", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tiny_policy):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    model, tok = tiny_policy
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_cli_evaluates_two_shared_benchmarks_and_logs_every_table(tmp_path, benchmark_dir, tiny_checkpoint):
    from mlflow.tracking import MlflowClient

    common = ["--eval", "smoke", "benchmarks=[aime24,amc23]", f"data_dir={benchmark_dir}", "max_prompts=2", "n=4",
              "ks=[1,2,4]", "max_new_tokens=6"]
    env_root = str(REPO)
    proc = _eval(tmp_path, "--checkpoint", str(tiny_checkpoint), "--out", "base", "--run-name", "base", *common)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = _eval(tmp_path, "--checkpoint", str(tiny_checkpoint), "--run-name", "after",
                 "--base-samples", "base/samples.parquet", *common)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # without --out: a folder of its own, named by the checkpoint and the run (issue 46: every checkpoint folder is
    # named "checkpoint", and a second evaluation replaced the first's files)
    after = Path(next(ln for ln in proc.stdout.splitlines() if ln.startswith("results: "))[len("results: "):])
    assert after.parent == tmp_path / "eval_out" and after.name.startswith("tiny-") and (after / "samples.parquet").is_file()
    assert "flip rates on the 4 of 4 prompts shared with --base-samples base/samples.parquet" in proc.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("rlvr-eval")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert after.name == f"tiny-{runs['after'].info.run_id[:12]}"
    m = runs["after"].data.metrics
    for bench in ("aime24", "amc23", "mean"):
        for key in ("pass_at_1", "pass_at_4", "avg_at_4", "ucc_at_4", "ucr", "entropy", "observed_yield",
                    "effective_yield", "coverage_at_4", "accuracy"):
            assert f"eval/{bench}/{key}" in m, (bench, key)
    assert "eval/all/flip/very_hard/solved_from_unsolved" in m and "eval/aime24/flip/very_hard/n_prompts" in m
    inputs = {(d.dataset.name, {t.key: t.value for t in d.tags}["mlflow.data.context"])
              for d in runs["after"].inputs.dataset_inputs}
    assert inputs == {("aime24", "evaluation"), ("amc23", "evaluation")}  # the Dataset column of MLflow's runs table
    artifacts = {a.path for a in client.list_artifacts(runs["after"].info.run_id)}
    assert {"samples.parquet", "passk.csv", "ucc.csv", "modes.csv", "entropy.csv", "flip_rates.csv"} <= artifacts
    df = pd.read_parquet(after / "samples.parquet")
    assert set(df["benchmark"]) == {"aime24", "amc23"} and len(df) == 2 * 2 * 4
    # recompute from the saved samples gives the logged numbers
    proc = subprocess.run([*python(), "-m", "evaluation.recompute", str(after / "samples.parquet"),
                           "--ks", "1", "2", "4", "--out", str(tmp_path / "re")], capture_output=True, text=True,
                          cwd=env_root, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    re_passk = pd.read_csv(tmp_path / "re" / "passk.csv", index_col=0)
    assert re_passk.loc["mean", "pass@4"] == pytest.approx(m["eval/mean/pass_at_4"])


def test_extra_temperatures_evaluate_again_with_their_own_keys_and_files(tmp_path, tiny_cfg, tiny_policy):
    from omegaconf import OmegaConf

    from core.tasks import load_prompts
    from evaluation.pipeline import EvalJob, evaluate_temperatures

    model, tok = tiny_policy
    sampler = HFSampler(model, tok)
    ecfg = OmegaConf.merge(tiny_cfg.eval, {"extra_temperatures": [1.0, 2.0], "max_prompts": 2})
    metrics, files = evaluate_temperatures(sampler, EvalJob(ecfg, load_prompts(tiny_cfg.data, "eval")), tmp_path)
    assert "eval/arithmetic/pass_at_1" in metrics and "eval_T2/arithmetic/pass_at_1" in metrics
    assert "eval_T2/arithmetic/ucr" in metrics and not any(k.startswith("eval_T1/") for k in metrics)  # 1.0 is the main one
    assert files["T2/samples.parquet"] == tmp_path / "T2" / "samples.parquet"
    # sampling really ran hotter: the entropy of softmax(z / T) grows with T, position by position
    assert metrics["eval_T2/arithmetic/entropy"] > metrics["eval/arithmetic/entropy"]
    with pytest.raises(ValueError, match="extra_temperatures"):
        evaluate_temperatures(sampler, EvalJob(OmegaConf.merge(ecfg, {"extra_temperatures": [0.0]})), tmp_path / "x")


def test_samples_drawn_with_other_settings_are_set_aside_not_resumed(tmp_path, tiny_cfg, tiny_policy):
    import pandas as pd
    from omegaconf import OmegaConf

    from core.tasks import load_prompts
    from evaluation.pipeline import EvalJob, evaluate

    sampler = HFSampler(*tiny_policy)
    held = load_prompts(tiny_cfg.data, "eval")
    e1 = OmegaConf.merge(tiny_cfg.eval, {"max_prompts": 2, "max_new_tokens": 4})
    evaluate(sampler, EvalJob(e1, held), tmp_path)
    first = pd.read_parquet(tmp_path / "samples.parquet")
    assert first["n_tokens"].max() <= 4
    evaluate(sampler, EvalJob(e1, held), tmp_path)  # same settings: resumed, nothing resampled
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "samples.parquet"), first)
    e2 = OmegaConf.merge(e1, {"max_new_tokens": 12, "temperature": 0.5})
    evaluate(sampler, EvalJob(e2, held), tmp_path)
    second = pd.read_parquet(tmp_path / "samples.parquet")
    assert second["n_tokens"].max() > 4  # drawn afresh with the new settings
    stale = list(tmp_path.glob("samples.stale-*.parquet"))
    assert len(stale) == 1  # the earlier samples are kept, not deleted
    pd.testing.assert_frame_equal(pd.read_parquet(stale[0]), first)


def test_entropy_taken_while_sampling_equals_the_teacher_forced_pass(tiny_policy, monkeypatch):
    """The hf sampler takes entropies from generate's own logits when they fit the budget; with the budget at 0 it
    runs the teacher-forced pass instead. Same samples (same seed), same entropies to float rounding, and the
    method each used is named."""
    import core.sampling as cs

    model, tok = tiny_policy
    settings = SamplingSettings(0.8, 0.9, 6)
    during = HFSampler(model, tok, score_rows=3, score_tokens=4)
    a = during.sample(["Compute 1 + 1.", "Compute 2 + 5."], 3, [4, 4], settings)
    assert during.entropy_method == cs.GENERATION_ENTROPY_METHOD
    monkeypatch.setattr(cs.hf, "ENTROPY_LOGITS_BUDGET", 0)  # where the hf sampler reads it (core/sampling/hf.py)
    forced = HFSampler(model, tok, score_rows=3, score_tokens=4)
    b = forced.sample(["Compute 1 + 1.", "Compute 2 + 5."], 3, [4, 4], settings)
    assert forced.entropy_method == cs.ENTROPY_METHOD
    for ga, gb in zip(a, b):
        for x, y in zip(ga, gb):
            assert x["response"] == y["response"] and x["n_tokens"] == y["n_tokens"]
            assert x["mean_token_entropy"] == pytest.approx(y["mean_token_entropy"], rel=1e-5, abs=1e-6)


def test_greedy_decoding_is_the_argmax_path_and_the_same_on_every_run(tiny_policy):
    """eval.temperature=0: greedy decoding. Second method: a plain argmax loop (one unpadded forward per token).
    Two calls with different seeds give the same sequences; the n samples of a prompt are that one sequence; the
    entropy is taken at T = 1 (the model's own distribution) and equals the teacher-forced pass."""
    model, tok = tiny_policy
    settings = SamplingSettings(0.0, 0.5, 6)
    sampler = HFSampler(model, tok)
    prompts = ["Compute 1 + 1.", "Compute 20 + 22. Answer with just the number."]
    a = sampler.sample(prompts, 3, [1, 1], settings)
    b = sampler.sample(prompts, 3, [99, 99], settings)
    assert [[s["response"] for s in g] for g in a] == [[s["response"] for s in g] for g in b]
    eos = set([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int)
              else model.generation_config.eos_token_id or [tok.eos_token_id])
    for prompt, group in zip(prompts, a):
        assert len({s["response"] for s in group}) == 1 and len(group) == 3
        ids = tok(prompt_texts(tok, [prompt])[0], add_special_tokens=False).input_ids
        out, ents = [], []
        with torch.no_grad():
            for _ in range(6):
                logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1].float()
                lp = torch.log_softmax(logits, -1)
                ents.append(float(-(lp.exp() * lp).sum()))
                out.append(int(logits.argmax()))
                if out[-1] in eos:
                    break
        assert group[0]["n_tokens"] == len(out)
        assert group[0]["response"] == tok.decode(out, skip_special_tokens=True)
        assert group[0]["mean_token_entropy"] == pytest.approx(sum(ents) / len(ents), rel=1e-4)


def test_per_benchmark_decoding_samples_each_benchmark_its_own_way_and_resumes(tmp_path, tiny_cfg, tiny_policy,
                                                                               benchmark_dir):
    """eval.decoding: MATH-500 greedy (n 1, ks [1]) beside AIME24 sampled (n 4, ks [1, 2, 4]) in one evaluation.
    Second method: each benchmark evaluated alone with those settings as the main ones gives the same samples;
    a second call resumes (nothing resampled, neither group's rows lost)."""
    from omegaconf import OmegaConf

    from evaluation.pipeline import EvalJob, evaluate

    sampler = HFSampler(*tiny_policy)
    base = OmegaConf.merge(OmegaConf.to_container(tiny_cfg.eval), {"benchmarks": ["math500", "aime24"], "data_dir": str(benchmark_dir),
                                           "max_prompts": 2, "max_new_tokens": 6, "n": 4, "ks": [1, 2, 4]})
    ecfg = OmegaConf.merge(base, {"decoding": {"math500": {"n": 1, "ks": [1], "temperature": 0.0}}})
    metrics, _ = evaluate(sampler, EvalJob(ecfg), tmp_path / "both")
    both = pd.read_parquet(tmp_path / "both" / "samples.parquet")
    assert both.groupby("benchmark").size().to_dict() == {"aime24": 8, "math500": 2}
    assert "eval/math500/pass_at_1" in metrics and "eval/math500/pass_at_4" not in metrics
    assert "eval/aime24/pass_at_4" in metrics and "eval/aime24/coverage_at_4" in metrics
    # the budget metrics: each benchmark at its own largest k, unweighted mean
    assert metrics["eval/mean/pass_at_budget"] == pytest.approx(
        (metrics["eval/math500/pass_at_1"] + metrics["eval/aime24/pass_at_4"]) / 2)
    alone = {
        "math500": OmegaConf.merge(base, {"benchmarks": ["math500"], "n": 1, "ks": [1], "temperature": 0.0}),
        "aime24": OmegaConf.merge(base, {"benchmarks": ["aime24"]}),
    }
    for bench, cfg in alone.items():
        evaluate(sampler, EvalJob(cfg), tmp_path / bench)
        one = pd.read_parquet(tmp_path / bench / "samples.parquet")
        mine = both[both["benchmark"] == bench].reset_index(drop=True)
        assert mine["response"].tolist() == one["response"].tolist(), bench
    evaluate(sampler, EvalJob(ecfg), tmp_path / "both")  # resumed: every row kept, nothing drawn again
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "both" / "samples.parquet"), both)


def test_observed_coverage_and_budget_means_by_hand():
    """ExPPO's observed coverage@k (a correct answer among the *first k* responses) beside the unbiased pass@k,
    and the per-benchmark budgets' suite mean, on samples written by hand."""
    from evaluation.tables import budget_metrics, compute_tables

    def rows(bench, pid, correct):
        return [{"benchmark": bench, "prompt_id": pid, "sample_idx": i, "response": f"r{i}", "correct": c,
                 "extracted_answer": "1" if c else "2", "mean_token_entropy": None, "reference_correct": None}
                for i, c in enumerate(correct)]

    samples = pd.DataFrame(rows("a", 0, [False, False, True, False]) + rows("a", 1, [True, False, False, False])
                           + rows("b", 0, [False, True]) + rows("b", 1, [False, False]))
    tables, metrics = compute_tables(samples, {"a": [1, 2, 4], "b": [1, 2]})
    # a: prompt 0's first correct answer is its third, prompt 1's its first
    assert metrics["eval/a/coverage_at_1"] == 0.5 and metrics["eval/a/coverage_at_2"] == 0.5
    assert metrics["eval/a/coverage_at_4"] == 1.0
    # unbiased pass@2 with n = 4, c = 1: 1 - C(3,2)/C(4,2) = 1/2 for both prompts
    assert metrics["eval/a/pass_at_2"] == pytest.approx(0.5)
    assert metrics["eval/b/coverage_at_1"] == 0.0 and metrics["eval/b/coverage_at_2"] == 0.5
    assert "eval/b/pass_at_4" not in metrics and metrics["eval/b/pass_at_1"] == pytest.approx(0.25)
    # mean rows over the benchmarks that have the column: pass@4 only a's, pass@1 both
    assert metrics["eval/mean/pass_at_4"] == 1.0 and metrics["eval/mean/pass_at_1"] == pytest.approx((0.25 + 0.25) / 2)
    budget = budget_metrics(tables, {"a": 4, "b": 2})
    assert budget["eval/mean/coverage_at_budget"] == pytest.approx((1.0 + 0.5) / 2)
    assert budget["eval/mean/pass_at_budget"] == pytest.approx((1.0 + 0.5) / 2)


def _samples(n: int, cap: int, prompts=("p0", "p1", "p2"), template="Q: {}") -> pd.DataFrame:
    """A samples table of ``n`` samples per prompt whose longest responses stopped at ``cap`` tokens."""
    rows = [{"benchmark": "arithmetic", "prompt_id": p, "sample_idx": i, "prompt": template.format(p), "gold": "1",
             "response": f"r{i}", "n_tokens": cap if i == 0 else 1, "finish_reason": "length" if i == 0 else "stop",
             "extracted_answer": "1" if i % 2 == 0 else "0", "correct": i % 2 == 0, "reference_correct": i % 2 == 0,
             "mean_token_entropy": 0.5 + 0.1 * i, "seed": 0, "subset": None, "tool_calls": 0}
            for p in prompts for i in range(n)]
    return pd.DataFrame(rows)


def test_the_evaluation_command_refuses_before_loading_what_would_mislead_or_overwrite(tmp_path, tiny_checkpoint,
                                                                                      monkeypatch, capsys):
    """Issue 46: a missing --checkpoint was an 83-line traceback; an --out that holds results was written over; base
    samples of another protocol (n 8 vs 4, 48 vs 8 tokens) gave flip rates that measured truncation. Each is one
    line, exit 2, before a model is loaded; --any-protocol computes them anyway."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "passk.csv").write_text("x\n")
    _samples(8, 48).to_parquet(tmp_path / "other.parquet")
    common = ["--eval", "smoke", "n=4", "ks=[1,2,4]", "max_new_tokens=8"]
    for args, fragment in (
            (["--checkpoint", str(tmp_path / "nowhere")], "--checkpoint: '" + str(tmp_path / "nowhere") + "': no such folder"),
            (["--checkpoint", str(tiny_checkpoint), "--out", "full"], "--out=full: exists and is not empty"),
            (["--checkpoint", str(tiny_checkpoint), "--base-samples", "nothing.parquet"], "--base-samples nothing.parquet: "
             "cannot be read"),
            (["--checkpoint", str(tiny_checkpoint), "--base-samples", "other.parquet"],
             "evaluated with another protocol than this one: samples per prompt 4 against the base's 8; responses cut "
             "(eval.max_new_tokens) at 8 tokens against the base's 48")):
        from orchestrator.evaluate import main  # in this process: each refusal comes before anything is loaded

        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        rc = main([*args, *common])
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert rc == 2 and len(lines) == 1 and fragment in lines[0], (args, lines)
    assert (tmp_path / "full" / "passk.csv").read_text() == "x\n" and not (tmp_path / "mlflow.db").exists()


def test_recompute_writes_a_new_folder_and_checks_the_base_protocol(tmp_path, monkeypatch):
    """Issue 46: recompute wrote its CSVs beside the samples it read (a run or MLflow artifact folder: the logged
    ``passk.csv`` replaced by one of other ks) and compared against base samples of another protocol on the shared
    prompts without saying how many."""
    from evaluation.recompute import main

    run = tmp_path / "run" / "eval"
    run.mkdir(parents=True)
    _samples(4, 8).to_parquet(run / "samples.parquet")
    (run / "passk.csv").write_text("logged\n")
    _samples(4, 8, prompts=("p1", "p2", "p9")).to_parquet(tmp_path / "base.parquet")
    _samples(8, 48).to_parquet(tmp_path / "other.parquet")
    monkeypatch.chdir(tmp_path)
    assert main([str(run / "samples.parquet"), "--ks", "1", "2", "--base-samples", str(tmp_path / "base.parquet")]) == 0
    assert main([str(run / "samples.parquet"), "--ks", "1", "4"]) == 0
    assert (run / "passk.csv").read_text() == "logged\n" and sorted(p.name for p in run.iterdir()) == ["passk.csv", "samples.parquet"]
    first, second = tmp_path / "recomputed" / "eval", tmp_path / "recomputed" / "eval-2"
    assert list(pd.read_csv(first / "passk.csv", index_col=0).columns)[:2] == ["pass@1", "pass@2"]
    assert "pass@4" in pd.read_csv(second / "passk.csv", index_col=0).columns
    assert main([str(run / "samples.parquet"), "--out", str(first)]) == 2  # holds results: refused
    assert main([str(run / "samples.parquet"), "--base-samples", str(tmp_path / "other.parquet")]) == 2
    assert main([str(run / "samples.parquet"), "--ks", "0"]) == 2
    assert main([str(run / "samples.parquet"), "--base-samples", str(tmp_path / "other.parquet"), "--any-protocol",
                 "--out", str(tmp_path / "any")]) == 0


def test_recompute_says_how_many_prompts_the_flip_rates_compare_on(tmp_path, capsys):
    from evaluation.recompute import main
    from evaluation.tables import protocol_differences

    _samples(4, 8).to_parquet(tmp_path / "s.parquet")
    _samples(4, 8, prompts=("p1", "p2", "p9")).to_parquet(tmp_path / "b.parquet")
    assert main([str(tmp_path / "s.parquet"), "--base-samples", str(tmp_path / "b.parquet"), "--out", str(tmp_path / "o")]) == 0
    assert "flip rates on the 2 of 3 prompts shared with --base-samples" in capsys.readouterr().out
    # the reading, by hand: n 4 vs 8, the cap 8 vs 48, another template on every shared prompt
    differ, shared, total = protocol_differences(_samples(4, 8), _samples(8, 48, template="Question: {}"))
    assert (shared, total) == (3, 3) and len(differ) == 3 and differ[0] == "samples per prompt 4 against the base's 8"
    assert protocol_differences(_samples(4, 8), _samples(4, 8))[0] == []
    assert protocol_differences(_samples(4, 8), _samples(4, 6).assign(finish_reason="stop"))[0] == []  # never cut: fine


def test_a_sample_is_a_typed_record_that_still_reads_as_the_dict_it_replaced():
    """Samplers return Sample records (issue 57); a plug-in sampler written before them returns dicts, which the
    evaluation takes through Sample.of; code that read a sample as a dict keeps working."""
    from core.sampling import Sample

    old = {"response": "7", "n_tokens": 2, "finish_reason": "stop", "mean_token_entropy": 0.5, "seed": 3, "extra": 1}
    s = Sample.of(old)
    assert s == Sample("7", 2, "stop", 0.5, 3) and Sample.of(s) is s
    assert s["response"] == "7" and s.get("tool_calls") is None and s.get("tool_calls", 0) == 0
    with pytest.raises(KeyError):
        s["extra"]
    with pytest.raises(TypeError):  # a dict without the required keys
        Sample.of({"response": "7"})
