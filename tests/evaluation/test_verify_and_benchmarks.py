"""Answer checking and benchmark loading on the real benchmark files."""
import pytest

from core.tasks.math import load_local_benchmark
from core.verify import check_answer, is_correct, last_boxed


@pytest.mark.parametrize("response,gold,expected", [
    ("\\boxed{\\frac{1}{2}}", "1/2", True),
    ("So 3 + 4 = 7.", "7", True),
    ("The answer is 11.", "7", False),
    ("1728", "1331 and 1728", False),
    ("", "7", False),
    ("\\boxed{27}", "27.0", True),
])
def test_is_correct(response, gold, expected):
    assert is_correct(response, gold) is expected


def test_exact_numbers_compare_exactly():
    # math-verify's float tolerance alone accepts this pair (both are ~0)
    assert is_correct("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2006!}") is False
    assert is_correct("\\boxed{\\frac{1}{2006!}}", "\\frac{1}{2006!}") is True
    assert is_correct("\\boxed{0.5}", "\\frac{1}{2}") is True  # a float answer keeps the tolerance


@pytest.mark.timeout(120)
def test_adversarial_outputs_are_bounded_and_incorrect():
    from core.verify import Verifier

    v = Verifier(item_timeout_s=5.0)
    adversarial = ["x" * 1_000_000 + " \\boxed{8}", "\\boxed{9^{9^{9^{9}}}}", "{" * 10_000 + "7" + "}" * 10_000,
                   "\\boxed{" + "{" * 10_000 + "7" + "}" * 10_000 + "}"]
    assert [ok for ok, _ in v.check_many(adversarial, ["7"] * 4)] == [False] * 4
    # the pool still works afterwards, and repeated answers are verified once (cache)
    assert v.check_many(["\\boxed{7}"] * 256, ["7"] * 256) == [(True, "7")] * 256
    assert sum(1 for key in v.cache if key[0] == "7") == 1
    v.close()


def test_bad_output_scores_zero_without_raising():
    assert is_correct(None, "7") is False
    assert is_correct("}" * 1000 + "\\boxed{" * 500, "7") is False
    ok, extracted = check_answer("x = \\boxed{42}", "42")
    assert ok and extracted == "42"


def test_last_boxed_keeps_nested_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("no box") is None


@pytest.mark.parametrize("name,count,first_gold", [
    ("math500", 500, "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("aime24", 30, "204"),
    ("aime25", 30, "70"),
    ("amc23", 40, "27"),          # stored as the number 27.0
    ("gsm8k", 1319, "18"),        # 'Janet sells 16 - 3 - 4 = ... #### 18'
    ("olympiadbench", 675, "2"),  # final_answer list ['2']
    ("gpqa_diamond_mcq", 198, "A"),  # multiple choice: the letter
])
def test_local_benchmarks_load_with_right_counts_and_gold(benchmark_dir, name, count, first_gold):
    rows = load_local_benchmark(name, benchmark_dir)
    assert len(rows) == count
    assert rows[0]["gold"] == first_gold
    assert all(r["prompt"] and r["gold"] for r in rows)
    assert is_correct(f"The answer is \\boxed{{{rows[0]['gold']}}}.", rows[0]["gold"])


@pytest.mark.timeout(600)
def test_every_gold_answer_verifies_against_itself_boxed(benchmark_dir):
    from core.verify import Verifier

    v = Verifier(workers=2)
    failures = {}
    for name in ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "gsm8k", "gpqa_diamond_mcq"):
        rows = load_local_benchmark(name, benchmark_dir)
        res = v.check_many([f"The final answer is \\boxed{{{r['gold']}}}." for r in rows], [r["gold"] for r in rows])
        bad = [r["gold"] for r, (ok, _) in zip(rows, res) if not ok]
        if bad:
            failures[name] = bad
    v.close()
    assert not failures, {k: (len(b), b[:5]) for k, b in failures.items()}


def test_minerva_gold_comes_from_the_solution_box(benchmark_dir):
    rows = load_local_benchmark("minerva_math", benchmark_dir)
    assert len(rows) == 272 and all(r["gold"] for r in rows)


def test_unreadable_row_fails_clearly(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "test.jsonl").write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "no answer"}\n')
    with pytest.raises(ValueError, match="test.jsonl:2"):
        load_local_benchmark("bad", tmp_path)
    with pytest.raises(FileNotFoundError, match="missing"):
        load_local_benchmark("missing", tmp_path)


def test_hub_loader_normalises_rows_like_the_local_loader(benchmark_dir):
    """The hub path (datasets.load_dataset) on the local file, through datasets' json builder."""
    pytest.importorskip("datasets")
    from core.tasks.math import load_hub_benchmark

    local = load_local_benchmark("gsm8k", benchmark_dir, limit=5)
    hub = load_hub_benchmark("gsm8k", limit=5, path="json", config=None, split="train",
                             data_files=str(benchmark_dir / "gsm8k" / "test.jsonl"))
    assert [r["gold"] for r in hub] == [r["gold"] for r in local] and hub[0]["prompt"] == local[0]["prompt"]
