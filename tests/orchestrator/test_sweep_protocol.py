"""One evaluation protocol per sweep (issue 55): the protocol is a function of the evaluation settings and the machine
only; the sweep's first evaluation records what ``auto`` resolved to on its parent run, later ones use the record or
stop with one line; a report pairs runs only inside one protocol. On a real MLflow store (SQLite)."""
import json

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from evaluation import protocol as P
from orchestrator.checks.preflight import sweep_points
from orchestrator.point.sweep_protocol import TAG_PREFIX, ProtocolMismatch, resolve_for_sweep
from orchestrator.store import mlflow_views, tracking


def _cfg(*overrides):
    [(_, cfg)] = sweep_points(["model=tiny-random", "eval=smoke", *overrides])
    return cfg


@pytest.fixture
def sweep(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = tracking.setup_experiment(uri, "protocol-test", str(tmp_path / "art"))
    sweep_id = str(tmp_path / "multirun" / "S")
    store = tracking.Store()
    parent = mlflow_views.open_sweep_run(exp_id, sweep_id, "abc", argv=["sweep.py"], store=store)
    return exp_id, sweep_id, parent, MlflowClient(tracking_uri=uri), store


def test_the_protocol_depends_on_evaluation_settings_and_the_machine_not_on_training():
    base = P.resolve(_cfg().eval)
    assert base["sampler"] == "hf" and base["dtype"] == "float32"  # no GPU; the tests' CPU flags have no bf16 units
    for training in (["train.rollout.sampler=vllm"], ["algo=gspo", "train.lr=1e-3"], ["train.precision=fp32"]):
        assert P.resolve(_cfg(*training).eval) == base, training
    for replicate in (["eval.seed=7"], ["eval.base=false"], ["eval.batch_prompts=2"], ["eval.flip_k=2"]):
        assert P.protocol_id(P.resolve(_cfg(*replicate).eval)) == P.protocol_id(base), replicate
    for other in (["eval.max_new_tokens=9"], ["eval.temperature=0.7"], ["eval.dtype=bfloat16"], ["eval.n=8", "eval.ks=[1,8]"]):
        differ = P.differences(base, P.resolve(_cfg(*other).eval))
        assert differ and all(" vs " in d for d in differ), other
    assert P.differences(base, {**base, "sampler": "vllm"}) == ["sampler: hf vs vllm"]


@pytest.mark.slow
def test_the_first_evaluation_records_the_choice_and_later_ones_use_it(sweep):
    exp_id, sweep_id, parent, client, store = sweep
    cfg = _cfg()
    key = TAG_PREFIX + P.settings_key(cfg.eval)
    pinned, proto = resolve_for_sweep(cfg, exp_id, sweep_id, store)
    assert json.loads(client.get_run(parent).data.tags[key]) == {"sampler": "hf", "dtype": "float32"}
    assert pinned.sampler == "hf" and pinned.dtype == "float32" and proto == P.resolve(cfg.eval)
    # a later job on a machine that would choose otherwise (here: its record says bfloat16) takes the sweep's choice
    client.set_tag(parent, key, json.dumps({"sampler": "hf", "dtype": "bfloat16"}))
    pinned, proto = resolve_for_sweep(cfg, exp_id, sweep_id, store)
    assert pinned.dtype == "bfloat16" and proto["dtype"] == "bfloat16" and proto["sampler"] == "hf"
    # another evaluation setting of the same sweep is its own protocol, with its own record
    other = _cfg("eval.temperature=0.7")
    _, proto7 = resolve_for_sweep(other, exp_id, sweep_id, store)
    assert proto7["temperature"] == 0.7 and TAG_PREFIX + P.settings_key(other.eval) in client.get_run(parent).data.tags


def test_a_machine_that_cannot_run_the_sweeps_protocol_stops_with_one_line(sweep):
    exp_id, sweep_id, parent, client, store = sweep
    cfg = _cfg()
    client.set_tag(parent, TAG_PREFIX + P.settings_key(cfg.eval), json.dumps({"sampler": "nosuch", "dtype": "float32"}))
    with pytest.raises(ProtocolMismatch) as e:
        resolve_for_sweep(cfg, exp_id, sweep_id, store)
    msg = str(e.value)
    assert "\n" not in msg and "sampler=nosuch" in msg and "sampler: nosuch vs hf" in msg


def test_outside_a_multirun_the_machine_decides():
    cfg = _cfg()
    pinned, proto = resolve_for_sweep(cfg, "0", None, tracking.Store())
    assert proto == P.resolve(cfg.eval) and pinned.sampler == "hf"


def _samples(correct):
    rows = [{"benchmark": "a", "prompt_id": str(p), "sample_idx": i, "correct": bool(c)}
            for p, cs in enumerate(correct) for i, c in enumerate(cs)]
    return pd.DataFrame(rows)


def _frame(rows):
    """A labelled runs frame: (label, kind, algo, params, protocol id or None)."""
    from core import tags

    return pd.DataFrame([{"label": lab, "kind": kind, "algo": algo, "status": "FINISHED", "params": params,
                          "tags": {tags.EVAL_PROTOCOL_ID: proto} if proto else {}}
                         for lab, kind, algo, params, proto in rows])


def test_the_report_pairs_runs_only_inside_one_protocol():
    """Two sweeps' runs, one evaluated with hf (with its base), one with vllm (with its own base): against the base
    model each run takes the base of its protocol; against a trained run of the other protocol a run is refused;
    runs logged before protocols were recorded pair only with each other (issue 70)."""
    from reports import pairing

    base_hf = _samples([[0, 0], [1, 0], [0, 0], [1, 1]])
    base_vl = _samples([[0, 0], [0, 0], [0, 0], [0, 0]])
    run_hf = _samples([[1, 0], [1, 1], [0, 0], [1, 1]])
    run_vl = _samples([[1, 1], [0, 0], [0, 0], [1, 0]])
    samples = {"Initialization": base_hf, "Initialization #2": base_vl, "grpo": run_hf, "grpo #2": run_vl}
    runs = _frame([("Initialization", "base", "base model", {}, "H"), ("Initialization #2", "base", "base model", {}, "V"),
                   ("grpo", "trained", "grpo", {}, "H"), ("grpo #2", "trained", "grpo", {}, "V")])
    pairs, refused = pairing.pair_runs(runs, "Initialization")
    d = pairing.differences(samples, pairs, n_boot=200)
    assert d.loc["grpo", "against"] == "Initialization" and d.loc["grpo #2", "against"] == "Initialization #2"
    assert d.loc["grpo", "difference"] == pytest.approx((0.5 + 1 + 0 + 1) / 4 - (0 + 0.5 + 0 + 1) / 4)
    assert d.loc["grpo #2", "difference"] == pytest.approx((1 + 0 + 0 + 0.5) / 4 - 0)  # its own base, by hand
    assert refused == {} and set(d.index) == {"grpo", "grpo #2"}  # a base is never compared with a base
    runs.loc[runs["label"] == "grpo #2", "algo"] = "gspo"
    pairs, refused = pairing.pair_runs(runs, "grpo")
    assert pairs == [] and list(refused) == ["grpo #2"] and refused["grpo #2"].startswith("evaluated under another protocol")
    # a run without a protocol tag (logged before they were recorded) pairs only with another without one
    old = _frame([("grpo", "trained", "grpo", {}, None), ("gspo", "trained", "gspo", {}, "H"),
                  ("dapo", "trained", "dapo", {}, None)])
    pairs, refused = pairing.pair_runs(old, "grpo")
    assert pairs == [pairing.Pair("dapo", "grpo")] and "before evaluation protocols were recorded" in refused["gspo"]


def test_an_algorithm_baseline_is_matched_within_each_level_of_the_other_factors():
    """Issue 70's sweep, ``algo=quatro,grpo train.rollout.correction=none,token_tis``: QUATRO is compared with GRPO at
    correction=none and again at token_tis, never across; a key GRPO ignores (``delta``, one GRPO run) does not
    split; Holm's correction counts the two comparisons (with p-values 0.5 and 0.01, by hand: 2 x 0.01 and
    max(0.5, 0.02))."""
    from evaluation.study import with_holm
    from reports import pairing

    def p(algo, corr, delta="0.1"):
        return {"algo.name": algo, "train.rollout.correction": corr, "delta": delta}

    runs = _frame([("quatro correction=none", "trained", "quatro", p("quatro", "none"), "H"),
                   ("quatro correction=token_tis", "trained", "quatro", p("quatro", "token_tis"), "H"),
                   ("grpo correction=none", "trained", "grpo", p("grpo", "none"), "H"),
                   ("grpo correction=token_tis", "trained", "grpo", p("grpo", "token_tis"), "H"),
                   ("Initialization", "base", "base model", {}, "H")])
    pairs, refused = pairing.pair_runs(runs, "grpo")
    assert pairs == [pairing.Pair("quatro correction=none", "grpo correction=none", "correction=none"),
                     pairing.Pair("quatro correction=token_tis", "grpo correction=token_tis", "correction=token_tis")]
    assert refused == {}
    # delta swept too: GRPO's points are one run (delta does not split it); QUATRO's two deltas each meet it
    runs2 = _frame([("quatro delta=0.01", "trained", "quatro", p("quatro", "none", "0.01"), "H"),
                    ("quatro delta=0.1", "trained", "quatro", p("quatro", "none", "0.1"), "H"),
                    ("grpo", "trained", "grpo", p("grpo", "none", "0.01"), "H")])
    assert [(q.run, q.against, q.level) for q in pairing.pair_runs(runs2, "grpo")[0]] == [
        ("quatro delta=0.01", "grpo", ""), ("quatro delta=0.1", "grpo", "")]
    # a level the baseline was not run at is named, not compared with another level
    runs3 = _frame([("quatro correction=icepop", "trained", "quatro", p("quatro", "icepop"), "H"),
                    ("grpo correction=none", "trained", "grpo", p("grpo", "none"), "H"),
                    ("grpo correction=token_tis", "trained", "grpo", p("grpo", "token_tis"), "H")])
    assert pairing.pair_runs(runs3, "grpo") == ([], {"quatro correction=icepop": "no grpo run at correction=icepop"})
    table = with_holm(pd.DataFrame({"p_value": [0.5, 0.01]}, index=["a", "b"]))
    assert list(table["p_holm"]) == pytest.approx([0.5, 0.02]) and list(table["resolved_holm"]) == [False, True]
    samples = {lab: _samples([[1, 1], [1, 0], [0, 0], [1, 1]]) for lab in runs["label"]}
    d = pairing.differences(samples, pairs, n_boot=200)
    assert list(d["family"]) == [2, 2] and list(d["difference"]) == [0.0, 0.0]
