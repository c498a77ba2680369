"""Graders grade the answer, not the question (issue 55): every math-verify-scored task reads the final answer in the
form its prompt asks for (core/tasks/answer_forms.py), so restating the prompt earns nothing, in training rewards,
in evaluation and in verl's reward function alike.

The tables are built from real prompts: each benchmark file of ../shared/data/benchmarks (the prompts' own ``$...$``
expressions, restated bare, inside a sentence, boxed, reordered and after a wrong answer), the training sets' loaders
on local files made from MATH-500's rows in each set's release format, the generated arithmetic and products tasks,
and responses the README's main job sampled from SmolLM2-135M-Instruct (2026-12-06) that plain math-verify paid."""
import json
import re

import pytest
from omegaconf import OmegaConf

from core.tasks import get_task, score_responses
from core.tasks.answer_forms import (
    MISSING,
    NOT_A_VALUE,
    RESTATED,
    STATED,
    is_expression,
    numeric_operations,
    restates,
    stated_number,
)
from core.verify import check_answer

BENCHMARKS = ["gsm8k", "math500", "minerva_math", "olympiadbench", "aime24", "aime25", "amc23"]


def _graded(responses, rows):
    """Each response's verdict three ways: the training reward, the evaluation's check and verl's reward function."""
    from evaluation.pipeline import check_rows
    from training.engines.verl_support.verl_reward import compute_score
    from training.rewards import row_rewards

    rewards, correct = row_rewards(responses, rows)
    checks = check_rows(rows, responses)
    verl = [compute_score(f"rlvr/{r['task']}", resp, r["gold"], {"row": json.dumps(r)}) for resp, r in zip(responses, rows)]
    assert [bool(c) for c in correct] == [c[0] for c in checks] == [v["acc"] == 1.0 for v in verl]
    assert [float(x) for x in rewards] == [v["score"] for v in verl]
    return [c[0] for c in checks], [c[3] for c in checks]


def _top_level_terms(expr: str) -> list[str]:
    depth, cut, out = 0, 0, []
    for i, ch in enumerate(expr):
        depth += ch in "({[" 
        depth -= ch in ")}]"
        if ch == "+" and depth == 0 and i:
            out.append(expr[cut:i])
            cut = i + 1
    return out + [expr[cut:]]


def restatements(expr: str, wrong: str) -> dict[str, str]:
    """Restatements of a prompt's expression: bare, inside a sentence, boxed, reordered (its top-level terms reversed,
    when it has several) and after a wrong answer (a boxed wrong value, then the expression boxed last)."""
    out = {"bare": expr, "sentence": f"To solve this, we compute ${expr}$.", "boxed": f"\\boxed{{{expr}}}",
           "after_wrong": f"First I get \\boxed{{{wrong}}}. Hmm, no: the answer is \\boxed{{{expr}}}."}
    terms = _top_level_terms(expr)
    if len(terms) > 1:
        out["reordered"] = f"\\boxed{{{'+'.join(reversed(terms))}}}"
    return out


def _expression_rows(rows, per_task=3):
    """(row, expression) for the first ``per_task`` rows whose problem holds a ``$...$`` expression that plain
    math-verify would pay for the gold (an echo that scored before issue 55), else any expression of the problem."""
    spans = [(r, sp.strip()) for r in rows for sp in re.findall(r"\$([^$]{3,60})\$", r["problem"])
             if is_expression(sp) and "=" not in sp and not re.search(r"(?<![\\A-Za-z])[A-Za-z]{3,}", sp)]
    paid = [(r, sp) for r, sp in spans if check_answer(f"We compute ${sp}$.", r["gold"]).reference]
    seen, out = set(), []
    for r, sp in paid + spans:
        if r["id"] not in seen:
            seen.add(r["id"])
            out.append((r, sp))
        if len(out) == per_task:
            break
    return out, len(paid)


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCHMARKS)
def test_restating_a_benchmark_prompt_earns_nothing_and_the_boxed_gold_earns_one(bench, benchmark_dir):
    rows = get_task(bench).load("test", OmegaConf.create({"data_dir": str(benchmark_dir), "max_prompts": None}))
    picked, n_paid = _expression_rows(rows)
    responses, table_rows, kinds = [], [], []
    for row, expr in picked:
        for kind, resp in restatements(expr, wrong=f"{row['gold']}1").items():
            responses.append(resp)
            table_rows.append(row)
            kinds.append(kind)
    for row in rows[:3]:  # the question itself, restated: bare, in a sentence, boxed, after a wrong answer
        question = row["problem"].strip().splitlines()[-1]
        for resp in (question, f"The question is: {question}", f"\\boxed{{{question}}}",
                     f"I get {row['gold']}1. {question}"):
            responses.append(resp)
            table_rows.append(row)
            kinds.append("question")
        for resp in (f"\\boxed{{{row['gold']}}}", f"Reasoning first. The final answer is \\boxed{{{row['gold']}}}."):
            responses.append(resp)
            table_rows.append(row)
            kinds.append("right")
    correct, status = _graded(responses, table_rows)
    for kind, ok, st, resp in zip(kinds, correct, status, responses):
        if kind == "right":
            assert ok and st == STATED, (bench, resp)
        elif kind == "question":
            assert not ok, (bench, resp)
        else:
            assert not ok and st in (RESTATED, NOT_A_VALUE, MISSING), (bench, kind, resp, st)
    if bench in ("math500", "olympiadbench"):  # restatements plain math-verify pays, refused here
        assert n_paid >= {"math500": 20, "olympiadbench": 3}[bench]
        ref = [check_answer(r, row["gold"]).reference for r, row, k in zip(responses, table_rows, kinds) if k == "boxed"]
        assert all(ref), "the boxed echoes chosen are ones plain math-verify accepts"


def _arith_row(a, op, b):
    from core.tasks.arithmetic import make_arithmetic

    return next(dict(r, task="arithmetic") for r in make_arithmetic(1, ("+", "-", "*"))
                if r["id"] == f"{a}{op}{b}")


@pytest.mark.parametrize("a,op,b", [("0", "+", "8"), ("5", "+", "4"), ("9", "*", "1"), ("3", "-", "5")])
def test_arithmetic_restatements_earn_nothing_and_stated_values_earn_one(a, op, b):
    row = _arith_row(a, op, b)
    gold = row["gold"]
    echoes = [f"{a} {op} {b}", f"To solve {a} {op} {b},", f"I don't know, maybe {a} {op} {b}", f"\\boxed{{{a} {op} {b}}}",
              f"{b} {op} {a}" if op != "-" else f"-{b} + {a}", f"The answer to {a} {op} {b}.",
              f"{a} {op} {b} = {int(gold) + 2}. This is the only integer answer to {a} {op} {b}.",
              f"The original question asks for {a} {op} {b}."]
    right = [gold, f"{a} {op} {b} = {gold}", f"The answer is {gold}.", f"\\boxed{{{gold}}}", f"The answer is **{gold}**.",
             f"To compute {a} {op} {b}, we simply work it out, which gives {gold}."]
    correct, status = _graded(echoes + right, [row] * (len(echoes) + len(right)))
    assert correct == [False] * len(echoes) + [True] * len(right), list(zip(echoes + right, correct, status))
    assert all(s in (RESTATED, NOT_A_VALUE) for s in status[:len(echoes) - 2] if s)  # the wrong value: 'stated', 0
    # plain math-verify paid every bare, sentence and boxed echo of a value that equals the gold
    assert all(check_answer(e, gold).reference for e in echoes[:4])


def test_main_job_responses_that_plain_math_verify_paid():
    """Responses SmolLM2-135M-Instruct gave in the README's main job (2026-12-06) that plain math-verify scored
    correct: echoes now score 0, the stated answers keep their verdict."""
    cases = [  # (a, b, response, correct now)
        ("2", "3", "To compute 2 + 3, we simply add them together.", False),
        ("1", "1", "To find 1 + 1, you simply add the two numbers together.", False),
        ("0", "8", "The original question asks for 0 + 8.", False),
        ("4", "8", 'The original question was "What is 4 + 8?" It is a basic arithmetic problem where the answer is '
                   "simply 4 + 8, but with a twist.", False),
        ("5", "4", "To solve this, you need to add 5 to 4.\n\n5 + 4 = 11.\n\nThis is the only integer answer to 5 + 4.",
         False),
        ("1", "1", "The answer to this equation is 2, but to clarify, we can re-express 1 + 1 as 1 + 2, which equals 3.",
         False),
        ("0", "7", "To compute 0 + 7, we simply add 0 and 7, which gives 7.", True),
        ("0", "8", "Let's evaluate the expression 0 + 8 by first adding 0 and 8.\n\nAdding 0 to 8 results in 8.\n\n"
                   "The answer is 8.", True),
        ("6", "3", "The answer is 13. To compute 6 + 3, we simply add them together: 6 + 3 = 9.", True),
        ("9", "1", "1\n\nHere's a list of pre-defined math operations that have been requested: 9 + 1 = 10.", True),
    ]
    rows = [_arith_row(a, "+", b) for a, b, _, _ in cases]
    correct, _ = _graded([c[2] for c in cases], rows)
    assert correct == [c[3] for c in cases]
    assert all(check_answer(c[2], r["gold"]).reference for c, r in zip(cases, rows))


def test_training_sets_read_the_boxed_answer_their_template_asks_for(tmp_path, benchmark_dir):
    """The MATH training set (MATH-style JSONL), DSR-Uniform (DeepScaleR's problem/answer/solution) and ORZ (its
    conversation release file), each made from MATH-500's rows with a paid restatement, through each task's loader
    and its data template (which asks for \\boxed{}); the held-out split (benchmark ``math``) too."""
    src = get_task("math500").load("test", OmegaConf.create({"data_dir": str(benchmark_dir), "max_prompts": None}))
    picked, _ = _expression_rows(src, per_task=4)
    recs = [{"problem": r["problem"], "answer": r["gold"], "solution": f"\\boxed{{{r['gold']}}}"} for r, _ in picked]
    (tmp_path / "math.jsonl").write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    conv = [[{"from": "human", "value": x["problem"]}, {"from": "assistant", "ground_truth": {"value": x["answer"]}}]
            for x in recs]
    (tmp_path / "orz.json").write_text(json.dumps(conv))
    template = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    expr_of = {r["problem"]: e for r, e in picked}
    for task, path in (("math", "math.jsonl"), ("dsr_uniform", "math.jsonl"), ("orz", "orz.json")):
        cfg = OmegaConf.create({"name": task, "source": "local", "path": str(tmp_path / path), "template": template,
                                "seed": 0, "n_eval": 1})
        for split in ("train", "eval"):
            rows = get_task(task).load(split, cfg)
            responses, table, right = [], [], []
            for row in rows:
                expr = next(e for problem, e in expr_of.items() if problem in row["prompt"])
                for resp in restatements(expr, f"{row['gold']}1").values():
                    responses.append(resp)
                    table.append(row)
                    right.append(False)
                responses.append(f"So the answer is \\boxed{{{row['gold']}}}.")
                table.append(row)
                right.append(True)
            correct, _ = _graded(responses, table)
            assert correct == right, (task, split, [r for r, c, w in zip(responses, correct, right) if c != w])


def test_products_task_pays_two_factors_never_a_restatement():
    from core.tasks.multi_answer import make_products

    row = dict(make_products(1, 0)[0], task="products")
    n = row["n"]
    a, b = (int(x) for x in row["gold"].split(";")[0].split(","))
    echoes = [str(n), f"Two whole numbers whose product is {n}.", f"\\boxed{{{n}}}", f"\\boxed{{{n}, 1}}",
              f"\\boxed{{1, {n}}}", f"\\boxed{{{a}, {b + 1}}} since their product is {n}."]
    right = [f"\\boxed{{{a}, {b}}}", f"\\boxed{{{b},{a}}}"]
    rows = [dict(row, prompt=get_task("products").render(row["problem"]))] * (len(echoes) + len(right))
    correct, status = _graded(echoes + right, rows)
    assert correct == [False] * len(echoes) + [True] * len(right)
    assert status[-1] == STATED and status[0] == MISSING


@pytest.mark.parametrize("text,value,expression", [
    ("5 + 4 = 9", "9", True), ("The answer is -3", "-3", False), ("3 - 5 = -2", "-2", True), ("To solve 0 + 8,", None, True),
    ("add 5 to 4", None, True), ("the sum of 2 and 3 is 5.", "5", True), ("2x + 3", None, True), ("It is 1,000.", "1000", False),
    ("**12**", "12", False), ("$3 \\times 4$ is $12$", "12", True), ("12 apples", "12", False), ("no number", None, False),
])
def test_the_stated_number_rule_by_hand(text, value, expression):
    assert stated_number(text) == (value, expression)


def test_restatement_and_value_rules_by_hand():
    assert restates("0 + 8", "Compute 0 + 8. Answer with just the number.")
    assert restates("8+0", "Compute 0 + 8.") and restates("1 + 2^3", "What is $2^3 + 1$?")
    assert not restates("8", "Compute 0 + 8.")  # a value is never a restatement
    assert not restates("-3", "Compute 0 - 3.")  # a sign is not an operation
    assert not restates("2^{10}", "Which is larger, $2^{10}$ or $10^3$?", gold="2^{10}")  # the gold as written
    assert not restates("0 + 9", "Compute 0 + 8.")
    assert numeric_operations("2^3+1") == {"^"} and numeric_operations("5!") == {"!"}  # the + adds to a power
    assert numeric_operations("\\frac{1}{2}") == set() and numeric_operations("2\\sqrt{3}") == set()
    assert numeric_operations("-5") == set() and numeric_operations("3 \\cdot 4") == {"*"}


@pytest.mark.parametrize("response,gold,correct", [
    ("\\boxed{0.5}", "\\frac{1}{2}", True), ("\\boxed{\\frac{1}{2}}", "0.5", True),  # fractions are values
    ("\\boxed{2^{10}}", "2^{10}", True), ("\\boxed{2^{10}}", "1024", False),  # an expression where a value is asked
    ("\\boxed{6 \\cdot 2}", "12", False), ("\\boxed{3 + 5 = 8}", "8", True),  # a statement is read by its value
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}", True), ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}", True),  # the fallback
    ("I think it is 1/2", "\\frac{1}{2}", False),  # no box and no "answer is": no answer in the asked form
    ("\\boxed{(1, 2)}, \\boxed{(2, 1)}", "(2,1),(1,2)", True),  # a list gold reads every box, as before
])
def test_the_boxed_form_by_hand(response, gold, correct):
    row = {"id": "x", "problem": "A problem.", "prompt": "A problem.\nPut your final answer within \\boxed{}.",
           "gold": gold, "task": "math500"}
    assert score_responses([response], [row])[0].correct is correct


def test_samples_drawn_before_answer_forms_are_graded_again_not_resampled():
    """An evaluation resumed from a samples file written before answer forms (no ``answer_status`` column) grades its
    samples again: the echo plain math-verify paid is now wrong, the stated answer stays right."""
    import pandas as pd

    from evaluation.pipeline import regrade

    row = _arith_row("0", "+", "8")
    old = pd.DataFrame({"benchmark": ["arithmetic"] * 3, "prompt_id": [row["id"]] * 3, "sample_idx": [0, 1, 2],
                        "response": ["To solve 0 + 8,", "0 + 8 = 8", "other prompt"], "correct": [True, True, False],
                        "extracted_answer": ["0 + 8", "8", None], "reference_correct": [True, True, False]})
    old.loc[2, "prompt_id"] = "not-in-rows"  # a prompt the evaluation no longer has keeps its verdicts
    new = regrade(old, {"arithmetic": [row]})
    assert new["correct"].tolist() == [False, True, False]
    assert new["answer_status"].tolist() == [RESTATED, STATED, None] and new["reference_correct"].tolist()[:2] == [True, True]


# Found by trying to break the grader (2026-12-06): each case scored the other way before its fix.
@pytest.mark.parametrize("a,op,b,response,correct", [
    ("5", "+", "4", "9 (5 + 4)", True), ("5", "+", "4", "9\n\nWant to try 3 + 3 next?", True),  # the answer judged alone
    ("3", "-", "7", "−4", True), ("3", "-", "7", "The answer is −4", True), ("2", "-", "9", "(-7)", True),
    ("3", "-", "7", "3 - 7 = - 4", True), ("5", "+", "4", "9\n\n---\n*5 + 4*", True),  # a line break is no operator
    ("0", "+", "8", "$0 \\, + \\, 8$", False), ("0", "+", "8", "0 ＋ 8", False), ("0", "+", "8", "0 & + 8", False),
    ("0", "+", "8", "0, plus 8", False), ("0", "+", "8", "0 \\text{ plus } 8", False), ("0", "+", "8", "0 \\mathbin{+} 8", False),
    ("0", "+", "8", "0 \\oplus 8", False), ("0", "+", "8", "0 ➕ 8", False), ("1", "*", "8", "1 ∗ 8", False),
    ("1", "*", "8", "1 ⋅ 8", False), ("1", "*", "8", "1 • 8", False), ("1", "*", "8", "1 \\times\\! 8", False),
    ("0", "*", "7", "7 ⋅ 0", False), ("0", "+", "8", "0 add 8", False), ("2", "*", "3", "2**3", False),
    ("5", "+", "4", "The answer is **9**.", True),
])
def test_arithmetic_cases_found_by_breaking_the_grader(a, op, b, response, correct):
    row = _arith_row(a, op, b)
    got, _ = _graded([response], [row])
    assert got == [correct], (response, row["gold"])


@pytest.mark.parametrize("problem,gold,response,correct", [
    ("Find x.", "1+\\sqrt{2}", "\\boxed{\\sqrt{2}+1}", True), ("Find x.", "3\\sqrt{2}", "\\boxed{\\sqrt{2}\\cdot 3}", True),
    ("Find z.", "5i-4", "\\boxed{-4+5i}", True), ("Expand $(x+1)^2-2x$.", "x^2+1", "\\boxed{1 + x^2}", True),
    ("Find the area in square centimetres.", "25", "\\boxed{25 \\text{ cm}^2}", True), ("Find x.", "-5", "The answer is −5.", True),
    ("Compute $\\dbinom{5}{2}$.", "10", "\\boxed{\\dbinom{5}{2}}", False), ("What is $|-5|$?", "5", "\\boxed{\\left|-5\\right|}", False),
    ("Compute $\\lfloor 3.7 \\rfloor$.", "3", "\\boxed{\\lfloor 3.7 \\rfloor}", False),
    ("Find $\\gcd(12, 18)$.", "6", "\\boxed{\\gcd(18,12)}", False), ("What is $\\max(3, 7)$?", "7", "\\boxed{\\max(3, 7)}", False),
    ("Compute $\\frac{6}{3}$.", "2", "\\boxed{6 \\div 3}", False), ("Compute $6/3$.", "2", "\\boxed{\\frac{6}{3}}", False),
    ("Write $\\frac{2}{4}$ in lowest terms.", "\\frac{1}{2}", "\\boxed{2/4}", False),
    ("Compute $17 \\mod 5$.", "2", "The answer is $17 \\mod 5$.", False),
])
def test_boxed_cases_found_by_breaking_the_grader(problem, gold, response, correct):
    row = {"id": "x", "problem": problem, "gold": gold, "task": "math500",
           "prompt": problem + "\nPlease reason step by step, and put your final answer within \\boxed{}."}
    got, _ = _graded([response], [row])
    assert got == [correct], response
