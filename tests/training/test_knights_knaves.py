"""Knights and Knaves: unique solutions by an independent brute force, the reward table on hand-made
responses, and the evaluation's accuracy by number of people."""
import itertools

import pandas as pd
import pytest

from core.tasks.knights_knaves import (
    evaluate,
    gold_string,
    kk_reward,
    kk_splits,
    make_kk,
    make_puzzle,
    parse_gold,
)


def _consistent_by_hand(statements, assignment):
    # independent of solutions(): knights say true things, knaves say false things
    for speaker, st in enumerate(statements):
        truth = evaluate(st, assignment)
        if assignment[speaker] and not truth:
            return False
        if not assignment[speaker] and truth:
            return False
    return True


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_every_generated_puzzle_has_exactly_one_solution(n):
    for seed in range(25):
        p = make_puzzle(n, seed)
        sols = [a for a in itertools.product((True, False), repeat=n) if _consistent_by_hand(p["statements"], a)]
        assert sols == [p["solution"]]
        assert len(p["names"]) == len(set(p["names"])) == n


def test_statement_semantics_by_hand():
    knights = (True, False)  # person 0 knight, person 1 knave
    assert evaluate(("is", 1, False), knights) is True
    assert evaluate(("not", ("is", 0, True)), knights) is False
    assert evaluate(("and", ("is", 0, True), ("is", 1, True)), knights) is False
    assert evaluate(("or", ("is", 0, False), ("is", 1, False)), knights) is True
    assert evaluate(("imp", ("is", 1, True), ("is", 0, False)), knights) is True  # false antecedent
    assert evaluate(("iff", ("is", 0, True), ("is", 1, True)), knights) is False


def test_generation_is_seeded_and_train_and_held_out_are_disjoint():
    a, b = make_kk((3,), 5, seed=4), make_kk((3,), 5, seed=4)
    assert a == b
    train, held = kk_splits(train_sizes=(2, 3), eval_sizes=(2, 3, 4), train_per_size=30, eval_per_size=5, seed=0)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    # not even up to renaming: 2 people have only a few hundred statement structures, 30 of them used to train
    assert not {r["structure"] for r in train} & {r["structure"] for r in held}
    assert sum(r["subset"] == "2_people" for r in held) == 5  # the held-out count is kept
    assert {r["subset"] for r in held} == {"2_people", "3_people", "4_people"}
    assert all(r["task"] == "kk" for r in train + held)
    with pytest.raises(ValueError, match="n_people=8"):
        make_puzzle(8, 0)


GOLD = "Zoey=knight,Oliver=knave,Emma=knave"


@pytest.mark.parametrize("response, reward, correct", [
    # correct: format +1, answer +2
    ("<think>Zoey tells the truth...</think>\n<answer>(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knave</answer>",
     3.0, True),
    # partially correct (Emma wrong): +1 - 1.5
    ("<think>...</think><answer>(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight</answer>", -0.5, False),
    # wrong on every person: still -1.5
    ("<think>x</think><answer>Zoey is a knave, Oliver is a knight, Emma is a knight</answer>", -0.5, False),
    # format fine, answer incomplete (Emma missing): +1 - 2
    ("<think>x</think><answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>", -1.0, False),
    # format fine, answer hedges (Oliver both): unparseable, +1 - 2
    ("<think>x</think><answer>Zoey is a knight, Oliver is a knave, Oliver is a knight, Emma is a knave</answer>", -1.0, False),
    # bad format (no think block), even with the right assignment: -1, no answer score
    ("<answer>(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knave</answer>", -1.0, False),
    # bad format: tags out of order / doubled
    ("<answer>Zoey is a knight</answer><think>x</think>", -1.0, False),
    ("<think>a</think><think>b</think><answer>Zoey is a knight, Oliver is a knave, Emma is a knave</answer>", -1.0, False),
    ("", -1.0, False),
])
def test_reward_table_on_hand_made_responses(response, reward, correct):
    out = kk_reward(response, GOLD)
    assert out["reward"] == reward and out["correct"] is correct
    assert out["format"] in (1.0, -1.0) and out["reward"] == out["format"] + out["answer"]


def test_gold_round_trip_and_bad_gold():
    assert parse_gold(gold_string(["A", "B"], (True, False))) == {"A": "knight", "B": "knave"}
    with pytest.raises(ValueError, match="K&K gold"):
        kk_reward("<think></think><answer></answer>", "A=angel")


def test_training_rewards_dispatch_and_eval_accuracy_by_people():
    from evaluation.tables import compute_tables
    from training.rewards import row_rewards

    rows = [{"gold": GOLD, "task": "kk"}, {"gold": "4", "task": "math500"}, {"gold": GOLD, "task": "kk"}]
    good = "<think>t</think><answer>Zoey is a knight. Oliver is a knave. Emma is a knave.</answer>"
    rewards, correct = row_rewards([good, "so \\boxed{4}", "no tags"], rows)
    assert rewards.tolist() == [3.0, 1.0, -1.0] and correct.tolist() == [True, True, False]
    with pytest.raises(ValueError, match="task 'chess' is not registered"):
        row_rewards(["x"], [{"gold": "1", "task": "chess"}])

    # evaluation table: 2 prompts with 3 people (accuracy 3/4 and 1/4), 1 prompt with 5 people (0/2)
    recs = []
    for pid, subset, flags in [("a", "3_people", [1, 1, 1, 0]), ("b", "3_people", [0, 0, 1, 0]),
                               ("c", "5_people", [0, 0, 0, 0])]:
        for j, f in enumerate(flags):
            recs.append({"benchmark": "kk", "prompt_id": pid, "sample_idx": j, "prompt": "p", "gold": GOLD,
                         "response": f"r{pid}{j}", "n_tokens": 3, "finish_reason": "stop", "extracted_answer": None,
                         "correct": bool(f), "mean_token_entropy": 1.0, "seed": 0, "subset": subset})
    tables, metrics = compute_tables(pd.DataFrame(recs), ks=[1, 2])
    sub = tables["subsets"]
    assert sub.loc["kk/3_people", "accuracy"] == pytest.approx(0.5)
    assert sub.loc["kk/3_people", "pass@2"] == pytest.approx((1 - 0) / 2 + (1 - 3 / 6) / 2)  # 1 - C(1,2)/C(4,2); 1 - C(3,2)/C(4,2)
    assert sub.loc["kk/5_people", "accuracy"] == 0.0
    assert metrics["eval/kk/3_people/accuracy"] == pytest.approx(0.5)


def test_unicode_case_folding_cannot_pass_as_a_role():
    # 'KNİGHT' (Turkish dotted capital I) is not 'knight': with ASCII case folding it names no role -> -2
    out = kk_reward("<think>x</think><answer>ZOEY is a KNİGHT, Oliver is a knave, Emma is a knave</answer>", GOLD)
    assert out["answer"] == -2.0
    out = kk_reward("<think>x</think><answer>ZOEY IS A KNIGHT, oliver is a KNAVE, Emma is a knave</answer>", GOLD)
    assert out["reward"] == 3.0
