"""Answer checking and benchmark loading on the real benchmark files."""
import re
import time

import pytest
import sympy

from core.tasks.math import load_local_benchmark
from core.verify import _BASE_NUMBER, check_answer, is_correct, last_boxed
from tests.conftest import REPO


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


# The classes of wrong verdicts that issue 14 found, each against a hand-checked expected value.
@pytest.mark.parametrize("response,gold,expected", [
    ("\\boxed{(1, 2)}, \\boxed{(2, 1)}", "(2,1),(1,2)", True),     # several boxes against a set gold
    ("First \\boxed{1}. Then the answer is \\boxed{2}.", "2", True),  # a single gold: the last box
    ("First \\boxed{1}. Then the answer is \\boxed{2}.", "1", False),
    ("\\boxed{7} or \\boxed{8}", "7", False),                        # hedging is not an answer
    ("28 %", "28\\%", True), ("\\boxed{28}", "28\\%", True),         # percent golds
    ("\\boxed{28\\%}", "28\\%", True), ("\\boxed{29}", "28\\%", False),
    ("\\boxed{\\infty}", "\\infty", True), ("\\boxed{-\\infty}", "\\infty", False),  # infinities
    ("$12:00$", "$12:00$", True), ("\\boxed{1:00}", "12:00", False),
    ("\\boxed 5. Note that $\\frac{1}{2}$", "5", True),              # brace-less box
    ("\\fbox{7}", "7", True),
    # minerva_math: the boxed gold parses to the fragment 2/3; written as $gold$ it is read whole
    ("\\boxed{\\frac{1}{3}E_1+\\frac{2}{3}E_2}", "\\frac{1}{3}E_1+\\frac{2}{3}E_2", True),
    ("\\boxed{\\frac{2}{3}}", "\\frac{1}{3}E_1+\\frac{2}{3}E_2", False),
    ("\\boxed{\\frac{1}{3}E_1+\\frac{2}{3}E_3}", "\\frac{1}{3}E_1+\\frac{2}{3}E_2", False),
    ("\\boxed{69, 84}", "69$,$84", True), ("\\boxed{\\$36}", "\\$36", True),  # OlympiadBench lists, currency
    ("\\boxed{52_9}", "52_8", False), ("\\boxed{52_8}", "52_8", True),       # numerals in a base
])
def test_issue_classes(response, gold, expected):
    assert is_correct(response, gold) is expected


def test_exact_comparison_is_bounded_and_falls_back_to_math_verify():
    # equal nested radicals: sympy's simplify() of the difference took 6.3 s of CPU; now a 60-digit
    # evaluation plus the minimal polynomial (x: zero) decide it at once
    t0 = time.perf_counter()
    assert is_correct("\\boxed{\\sqrt{2}+\\sqrt{3}}", "\\sqrt{5+2\\sqrt{6}}") is True
    assert time.perf_counter() - t0 < 5.0
    # a difference of 10^-70 is found by the minimal polynomial, where 60 digits cannot see it
    assert is_correct("\\boxed{\\sqrt{2}+\\sqrt{3}+10^{-70}}", "\\sqrt{5+2\\sqrt{6}}") is False
    from core import verify as V

    g, p = sympy.sqrt(2) + sympy.sqrt(3), sympy.sqrt(5 + 2 * sympy.sqrt(6))
    assert V._exactly_equal(sympy.oo, sympy.oo) is True and V._exactly_equal(sympy.zoo, sympy.zoo) is True
    assert V._exactly_equal(sympy.Rational(1, 3), sympy.Rational(1, 3) + sympy.Rational(1, 10**80)) is False
    assert V._exactly_equal(g, p) is True
    # out of time: None, and _check_one then keeps math-verify's verdict
    old = V.EXACT_TIMEOUT_S
    V.EXACT_TIMEOUT_S = 1e-6
    try:
        assert V._exactly_equal(g, p) is None
        assert V._check_one(("\\boxed{\\sqrt{2}+\\sqrt{3}}", "\\sqrt{5+2\\sqrt{6}}")).correct is True
    finally:
        V.EXACT_TIMEOUT_S = old


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_adversarial_outputs_are_bounded_and_incorrect():
    from core.verify import Verifier

    v = Verifier(item_timeout_s=5.0)
    adversarial = [None, b"\\boxed{7}", "x" * 1_000_000 + " \\boxed{8}", "\\boxed{9^{9^{9^{9}}}}",
                   "{" * 10_000 + "7" + "}" * 10_000, "\\boxed{" + "{" * 10_000 + "7" + "}" * 10_000 + "}",
                   "\\boxed{" * 500 + "}" * 1000]
    t0 = time.perf_counter()
    checks = v.check_many(adversarial, ["7"] * len(adversarial))
    assert [c.correct for c in checks] == [False] * len(adversarial)
    assert time.perf_counter() - t0 < 60   # bound: one item timeout (5 s) plus parsing, far below a minute
    # the pool still works afterwards, and repeated responses are verified once (cache)
    hits = v.hits
    assert v.check_many(["\\boxed{7}"] * 256, ["7"] * 256) == [(True, "7", True)] * 256
    assert v.hits - hits == 255 and sum(1 for key in v.cache if key[0] == "\\boxed{7}") == 1
    v.close()


@pytest.mark.slow
def test_the_pool_closes_when_a_timed_out_worker_cannot_run_its_sigterm_handler():
    """A worker stuck in C code on an item that timed out (a huge power) runs no Python signal handler until that
    code returns, and close()'s Pool.terminate() joined it for ever: a 600 s test time-out on a loaded 2-core machine
    (2026-12-05, test_every_gold_verifies_against_itself_and_rejects_gold_plus_one). Stood in for by a check that
    blocks SIGTERM and sleeps: close() kills it after its grace and returns in seconds; the next check gets a new
    pool. Run in a child process so that a regression fails on its timeout instead of hanging here."""
    import subprocess
    import sys

    code = (
        "import signal, time\n"
        "import core.verify as V\n"
        "def stuck(key):\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # as C code that never returns to Python\n"
        "    time.sleep(3600)\n"
        "real, V._check_one = V._check_one, stuck\n"
        "v = V.Verifier(workers=1, item_timeout_s=1.0)\n"
        "t0 = time.monotonic()\n"
        "assert [c.correct for c in v.check_many(['\\\\boxed{7}'], ['7'])] == [False] and v.timeouts == 1\n"
        "print('timed out and closed in', round(time.monotonic() - t0, 1))\n"
        "V._check_one = real\n"
        "assert v.check_many(['\\\\boxed{3}'], ['3'])[0].correct; v.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("timed out and closed in") and float(proc.stdout.split()[-1]) < 15


@pytest.mark.slow
def test_the_pool_closes_after_its_idle_workers_got_sigterm():
    """A signal to the whole process group (``pkill -f``, ``scancel``, a supervisor) reaches the verifier's forked
    workers too. Killed with the default action, a worker waiting for a task kept the task queue's lock, and
    Pool.terminate() in close() waited on it for ever: the sweep said "stopped" and never exited (seen in the CPU
    study, 2026-12-04); exiting by raising still left it held about one time in three (a signal just after the
    lock's acquire, before the ``with`` block). Run in a child process so that a regression fails on its timeout
    instead of hanging here."""
    import subprocess
    import sys

    code = (
        "import os, signal, time\n"
        "from core.verify import Verifier\n"
        "for _ in range(5):  # the lock was left held about one time in three: five rounds\n"
        "    v = Verifier(workers=2)\n"
        "    assert [c.correct for c in v.check_many(['\\\\boxed{7}', '8'], ['7', '7'])] == [True, False]\n"
        "    time.sleep(0.5)  # both workers back in the queue's get()\n"
        "    pids = [p.pid for p in v._pool._pool]\n"
        "    for pid in pids: os.kill(pid, signal.SIGTERM)\n"
        "    time.sleep(0.5)\n"
        "    t0 = time.monotonic(); v.close(); print('closed', round(time.monotonic() - t0, 2))\n"
        "v2 = Verifier(workers=1); assert v2.check_many(['\\\\boxed{3}'], ['3'])[0].correct; v2.close()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("closed")


def test_bad_output_scores_zero_without_raising():
    assert is_correct(None, "7") is False
    assert is_correct("}" * 1000 + "\\boxed{" * 500, "7") is False
    check = check_answer("x = \\boxed{42}", "42")
    assert check.correct and check.extracted == "42" and check.reference is True


def test_last_boxed_keeps_nested_braces():
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\boxed 5. Note that $\\frac{1}{2}$") == "5"   # the brace must follow the tag
    assert last_boxed("\\fbox{x} and \\boxed {y}") == "y"
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


def _gold_plus_one(gold: str) -> str | None:
    """The gold with its last number + 1 (a nearby wrong answer), or None when it has no number."""
    numbers = list(re.finditer(r"\d+", gold))
    if not numbers:
        return None
    m = numbers[-1]
    return gold[:m.start()] + str(int(m.group()) + 1) + gold[m.end():]


# gold+1 answers that plain math-verify accepts (it reads each pair as equal) besides the six numerals in a wrong base;
# this suite rejects them all (core/verify.py: unit powers, fragment golds, a gold's sentence period)
PLAIN_FALSE_ACCEPTS = {
    "864 \\mbox{ inches}^2": "units are dropped: 864 against 864",
    "15\\mbox{ cm}^2": "units are dropped: 15 against 15",
    "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}": "both parse to the fragment 2 (E_{0}^{2} stops the LaTeX reading)",
    "(-\\infty, 0) \\cup\\{1\\}$.": "the period inside the math stops the reading: both parse to the fragment 0",
}


@pytest.mark.parametrize("gold, response, expected", [
    # the false accepts above, and what must still hold beside each fix
    ("864 \\mbox{ inches}^2", "\\boxed{864 \\mbox{ inches}^3}", False),   # a volume for an area
    ("864 \\mbox{ inches}^2", "\\boxed{864}", True),                      # units left out
    ("864 \\mbox{ inches}^2", "\\boxed{864 \\text{ square inches}}", True),  # the same power in words
    ("15\\mbox{ cm}^2", "\\boxed{15 \\text{cm}^{3}}", False),
    ("15\\mbox{ cm}^2", "\\boxed{16\\mbox{ cm}^2}", False),
    ("5", "\\boxed{5 \\text{ cm}}", True),                                 # units on one side only
    ("5 \\text{ cm}^2", "\\boxed{5 \\text{ cm^2}}", True),                     # the power inside the braces
    ("4.2 \\mathrm{~kg} \\mathrm{~m}^{-2}", "\\boxed{4.2 \\text{ kg/m}^2}", True),  # compound units: not compared
    ("6 \\text{ cm}^3", "\\boxed{6 \\text{ cc}}", True),                       # a power not stated: not compared
    ("6 \\text{ cm}^2", "The side is $\\sqrt6 \\text{ cm}$, so the answer is $6 \\text{ cm}^2$", True),  # no box
    ("\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", "\\boxed{2}", False),  # the fragment itself
    ("\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}",
     "\\boxed{\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}}", True),
    ("10\\%", "\\boxed{10}", True),                                         # a number with a sign is no fragment
    ("(-\\infty, 0) \\cup\\{1\\}$.", "\\boxed{(-\\infty, 0) \\cup\\{2\\}}", False),
    ("(-\\infty, 0) \\cup\\{1\\}$.", "\\boxed{0}", False),
    ("(-\\infty, 0) \\cup\\{1\\}$.", "\\boxed{\\{1\\} \\cup (-\\infty,0)}", True),  # the same set, reordered
    ("(-\\infty, 0) \\cup\\{1\\}$.", "so $x \\in (-\\infty, 0) \\cup \\{1\\}$", True),
])
def test_plain_math_verifys_false_accepts_are_rejected(gold, response, expected):
    """Each answer judged by hand: units of another power are another quantity, an expression is not one of
    its numbers, a union with {2} is not a union with {1}."""
    assert check_answer(response, gold).correct is expected


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_gold_verifies_against_itself_and_rejects_gold_plus_one(benchmark_dir):
    """All 3,064 local golds: each accepted against its own boxed form; each gold+1 answer rejected unless
    plain math-verify accepts 10 (listed above, and six numerals in a wrong base), this suite none."""
    from core.verify import Verifier

    v = Verifier(workers=2)
    golds = [r["gold"] for name in ("math500", "aime24", "aime25", "amc23", "minerva_math", "olympiadbench", "gsm8k",
                                    "gpqa_diamond_mcq") for r in load_local_benchmark(name, benchmark_dir)]
    assert len(golds) == 3064
    own = v.check_many([f"The final answer is \\boxed{{{g}}}." for g in golds], golds)
    assert [g for g, c in zip(golds, own) if not c.correct] == []
    wrong = [(g, _gold_plus_one(g)) for g in golds if _gold_plus_one(g)]
    checks = v.check_many([f"The final answer is \\boxed{{{w}}}." for _, w in wrong], [g for g, _ in wrong])
    v.close()
    accepted = {g for (g, _), c in zip(wrong, checks) if c.correct}
    assert not [g for (g, _), c in zip(wrong, checks) if c.correct and not c.reference]  # never worse than plain
    assert accepted == set()
    plain = {g for (g, _), c in zip(wrong, checks) if c.reference}
    assert len(plain) == 10 and set(PLAIN_FALSE_ACCEPTS) < plain
    assert all(_BASE_NUMBER.search(g) for g in plain - set(PLAIN_FALSE_ACCEPTS))  # the six numerals in a base


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


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_verifier_benchmark_measures_both_graders():
    """benchmarks/verifier.py's measuring functions on pairs whose verdicts and cache hits are known by hand."""
    from benchmarks.verifier import side_by_side, time_plain_capped

    r = side_by_side(["\\boxed{7}", "\\boxed{8}", "\\boxed{7}", "\\fbox{7}"], ["7", "7", "7", "7"])
    # the third pair repeats the first (one cache hit in four); plain math-verify does not read \fbox
    assert (r["n"], r["ours_correct"], r["plain_correct"], r["disagree"]) == (4, 3, 2, 1)
    assert r["hit_rate"] == 0.25 and r["reference_matches_plain"] == 4
    seconds, verdict = time_plain_capped("\\boxed{9^{9^{9^{9}}}}", "7", cap_s=2.0)
    assert verdict == "killed" and 2.0 <= seconds < 10
    assert time_plain_capped("\\boxed{7}", "7", cap_s=30.0)[1] == "True"
