"""Every registered report section over one store holding two evaluation protocols and two factors (issue 70): the
algorithm and ``train.rollout.correction`` on protocol H (a sweep on the transformers sampler), the algorithm alone on
protocol V (a second sweep on vLLM), a base model under each. Each section renders (the paper tables too); every
comparison any section shows pairs runs of one protocol, and an algorithm baseline is matched within each correction.
The numbers compared come from samples written here, so the differences are checked by hand."""
import json

import pandas as pd
import pytest

from core import tags as T


def _samples(correct_per_prompt, seed=0):
    """Four prompts x two samples of toy parity answers: ``correct_per_prompt[p]`` correct samples of prompt p."""
    rows = []
    for p, n_ok in enumerate(correct_per_prompt):
        for i in range(2):
            ok = i < n_ok
            rows.append({"benchmark": "toy_parity", "prompt_id": f"p{p}", "sample_idx": i, "prompt": f"Write {p} words.",
                         "gold": "even", "response": f"answer {seed} {p} {i}", "n_tokens": 8, "finish_reason": "stop",
                         "extracted_answer": "even" if ok else "odd", "correct": ok, "mean_token_entropy": 1.0,
                         "seed": seed})
    return pd.DataFrame(rows)


# (run name, kind, algorithm, correction, protocol, correct samples per prompt)
RUNS = [("Initialization", "base", None, None, "H", [2, 1, 0, 1]),
        ("quatro none", "trained", "quatro", "none", "H", [2, 2, 1, 1]),
        ("quatro tis", "trained", "quatro", "token_tis", "H", [2, 1, 1, 1]),
        ("grpo none", "trained", "grpo", "none", "H", [2, 1, 1, 1]),
        ("grpo tis", "trained", "grpo", "token_tis", "H", [2, 2, 2, 1]),
        ("Initialization V", "base", None, None, "V", [2, 0, 0, 1]),
        ("quatro V", "trained", "quatro", "none", "V", [2, 2, 2, 2]),
        ("grpo V", "trained", "grpo", "none", "V", [2, 1, 1, 1])]  # prompt p0: the Shared set of Table 2B


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import mlflow


    tmp = tmp_path_factory.mktemp("pairing")
    uri = f"sqlite:///{tmp}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment("pairing", artifact_location=(tmp / "art").as_uri())
    for i, (name, kind, algo, corr, proto, correct) in enumerate(RUNS):
        protocol = {"sampler": "hf" if proto == "H" else "vllm", "dtype": "float32", "n": 2}
        tags = {T.KIND: kind, T.EVAL_PROTOCOL_ID: proto, T.EVAL_PROTOCOL: json.dumps(protocol)}
        with mlflow.start_run(experiment_id=exp, run_name=name, tags=tags):
            if kind == "trained":
                mlflow.log_params({"algo.name": algo, "train.rollout.correction": corr, "seed": 0, "train.steps": 2,
                                   "delta": 0.1, "train.group_size": 4})
                for step in (0, 1):
                    mlflow.log_metrics({"train/reward_mean": 0.25 * step, "train/entropy": 1.0 - 0.1 * step}, step=step)
            samples = _samples(correct, seed=i)
            path = tmp / f"s{i}" / "samples.parquet"
            path.parent.mkdir()
            samples.to_parquet(path)
            mlflow.log_artifact(str(path))
            acc = samples["correct"].mean()
            mlflow.log_metrics({"eval/toy_parity/pass_at_1": acc, "eval/mean/pass_at_1": acc})
    return uri, tmp


def _context(uri, tmp, baseline):
    from reports import data, load
    from reports import sections as S
    from reports.render import Page, run_colors

    runs = data.short_labels(load.load_runs(uri, "pairing"))
    shown, done = load.evaluated(runs), load.finished(runs)
    paper = [name for name, sec in S.SECTIONS.items() if sec.build is not None]
    ctx = S.Context(runs, shown, done, uri, experiment="pairing", work_dir=tmp / f"work-{baseline}", baseline=baseline,
                    paper=paper, colors=run_colors(list(shown["label"]) + list(done["label"])))
    return ctx, Page(tmp / f"figures-{baseline}", tmp / f"paper-{baseline}")


@pytest.mark.parametrize("baseline", ["grpo", None])
def test_every_section_renders_and_pairs_within_one_protocol(store, baseline):
    from reports import sections as S

    uri, tmp = store
    ctx, page = _context(uri, tmp, baseline)
    labels = set(ctx.shown["label"])
    proto = {lab: t[T.EVAL_PROTOCOL_ID] for lab, t in zip(ctx.runs["label"], ctx.runs["tags"])}
    rendered = [S.show_section(sec, ctx, page) for sec in S.body()]  # a built-in section's error fails the test
    assert len(rendered) == len(S.body())
    paper = tmp / f"paper-{baseline}"
    diffs = pd.read_csv(paper / "baseline_differences.csv", index_col=0)
    assert len(diffs) and all(proto[run] == proto[against] for run, against in diffs["against"].items())
    if baseline == "grpo":
        # QUATRO against GRPO within each correction on H, and on V against V's GRPO; GRPO's runs are the references
        assert dict(diffs["against"]) == {"quatro correction=none": "grpo correction=none",
                                          "quatro correction=token_tis": "grpo correction=token_tis",
                                          "quatro correction=none #2": "grpo correction=none #2"}, dict(diffs["against"])
        # by hand: (2+2+1+1)/8 - (2+1+1+1)/8, (2+1+1+1)/8 - (2+2+2+1)/8, (2+2+2+2)/8 - (2+1+1+1)/8
        assert list(diffs["difference"]) == pytest.approx([1 / 8, -2 / 8, 3 / 8])
        assert set(diffs["family"]) == {3}  # Holm over the table's three comparisons
        shared = pd.read_csv(paper / "paper_exppo_shared_d.csv", index_col=0)  # ExPPO's Table 2B: a block per reference
        assert set(shared["against"]) == set(diffs["against"])
        assert all(proto[run] == proto[against] for run, against in shared["against"].items())
    else:  # the base model of each run's own protocol
        assert {run: proto[a] for run, a in diffs["against"].items()} == {run: proto[run] for run in diffs.index}
        assert set(diffs.index) == labels - {"Initialization", "Initialization #2"}
    summary = pd.read_csv(paper / "summary.csv", index_col=0)
    assert set(summary.index) == labels
    assert any(c.endswith("(Holm)") for c in summary.columns)
