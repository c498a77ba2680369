"""Knights and Knaves logic puzzles (the K&K task of Logic-RL, used by the TR-GRPO paper), and their reward.

Knights always tell the truth, knaves always lie. Each of n people (2-7) makes one statement about
the others (or themself); a puzzle is kept only when exactly one knight/knave assignment makes every
knight's statement true and every knave's statement false, found by brute force over all 2^n
assignments. Generation is seeded: the same (n, seed, index) gives the same puzzle.

Reward (TR-GRPO paper's table, which follows Logic-RL's K&K reward): a format score of +1 when the
response has exactly one ``<think>...</think>`` followed by exactly one ``<answer>...</answer>``, else
-1; with a valid format, an answer score of +2 when the stated assignment is the solution, -1.5 when
it names a role for every person but is wrong (partially correct or wrong), -2 when it does not
(unparseable or incomplete). As in Logic-RL's implementation, a response with a bad format gets
no answer score (total -1). Total reward in {3, -0.5, -1}.
"""
from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

from core.config_keys import I, L, S

from .base import Score, Task, read_jsonl, register_task

NAMES = ["Zoey", "Oliver", "Liam", "Emma", "Noah", "Ava", "Mason", "Mia", "Lucas", "Sofia", "Ethan", "Aria",
         "James", "Chloe", "Jack", "Lily", "Owen", "Grace", "Henry", "Ella", "Samuel", "Nora", "David", "Ruby"]
MIN_PEOPLE, MAX_PEOPLE = 2, 7

PROMPT = ("A very special island is inhabited only by knights and knaves. Knights always tell the truth, and "
          "knaves always lie. You meet {n} inhabitants: {names}. {statements} So who is a knight and who is a "
          "knave?\nThink it through inside <think> </think> tags, then give the final answer inside "
          "<answer> </answer> tags, one line per person in the form (1) <name> is a knight/knave.")

# A statement is a small formula over "person j is a knight":
#   ("is", j, True|False) | ("not", f) | ("and", f, g) | ("or", f, g) | ("imp", f, g) | ("iff", f, g)


def evaluate(formula, knights: tuple[bool, ...]) -> bool:
    """Truth value of ``formula`` when ``knights[j]`` says whether person j is a knight."""
    op = formula[0]
    if op == "is":
        return knights[formula[1]] == formula[2]
    if op == "not":
        return not evaluate(formula[1], knights)
    a, b = evaluate(formula[1], knights), evaluate(formula[2], knights)
    return {"and": a and b, "or": a or b, "imp": (not a) or b, "iff": a == b}[op]


def solutions(statements: list, n: int) -> list[tuple[bool, ...]]:
    """Every assignment (tuple of n booleans, True = knight) consistent with the statements, by brute
    force: person i is a knight exactly when statement i is true."""
    return [k for k in itertools.product((True, False), repeat=n)
            if all(evaluate(s, k) == k[i] for i, s in enumerate(statements))]


def _role(is_knight: bool) -> str:
    return "a knight" if is_knight else "a knave"


def render(formula, names: list[str], speaker: int) -> str:
    """English text of a statement made by ``names[speaker]``."""
    def lit(f):
        j, k = f[1], f[2]
        return f"I am {_role(k)}" if j == speaker else f"{names[j]} is {_role(k)}"

    op = formula[0]
    if op == "is":
        return lit(formula)
    if op == "not":
        return f"It is false that {lit(formula[1])}"
    a, b = lit(formula[1]), lit(formula[2])
    if op == "and":
        return f"{a} and {b}"
    if op == "or":
        return f"{a} or {b}"
    if op == "imp":
        return f"If {a}, then {b}"
    return f"{a} if and only if {b}"


def _random_statement(rng: random.Random, n: int, speaker: int):
    others = [j for j in range(n) if j != speaker]

    def lit(pool):
        return ("is", rng.choice(pool), rng.random() < 0.5)

    kind = rng.choice(["is", "is", "not", "and", "or", "imp", "iff"])
    if kind == "is":
        return lit(others)
    if kind == "not":
        return ("not", lit(others))
    first = lit(others)
    second = lit([j for j in range(n) if j != first[1]] or others)
    return (kind, first, second)


def make_puzzle(n: int, seed: int, max_tries: int = 10000) -> dict:
    """One puzzle with ``n`` people and exactly one solution.

    Returns:
        {"names", "statements" (formulas), "solution" (tuple of bools, True = knight), "text" (the statements
        in English)}.
    Raises:
        ValueError: n outside [2, 7]. RuntimeError: no unique puzzle within ``max_tries`` draws.
    """
    if not (isinstance(n, int) and MIN_PEOPLE <= n <= MAX_PEOPLE):
        raise ValueError(f"n_people={n!r}: expected an integer in [{MIN_PEOPLE}, {MAX_PEOPLE}]")
    rng = random.Random(f"kk:{n}:{seed}")
    names = rng.sample(NAMES, n)
    for _ in range(max_tries):
        statements = [_random_statement(rng, n, i) for i in range(n)]
        sols = solutions(statements, n)
        if len(sols) == 1:
            text = " ".join(f'{names[i]} says, "{render(s, names, i)}."' for i, s in enumerate(statements))
            return {"names": names, "statements": statements, "solution": sols[0], "text": text}
    raise RuntimeError(f"no puzzle with a unique solution for n={n} after {max_tries} draws")


def gold_string(names: list[str], solution) -> str:
    """The gold answer as stored in a row: ``Zoey=knight,Oliver=knave``."""
    return ",".join(f"{nm}={'knight' if k else 'knave'}" for nm, k in zip(names, solution))


def parse_gold(gold: str) -> dict[str, str]:
    """Inverse of :func:`gold_string`. Raises ValueError on a malformed gold string."""
    out = {}
    for part in str(gold).split(","):
        name, _, role = part.partition("=")
        if role not in ("knight", "knave") or not name:
            raise ValueError(f"K&K gold {gold!r}: expected 'Name=knight|knave,...'")
        out[name.strip()] = role
    return out


def make_kk(sizes=(3, 4, 5), per_size: int = 100, seed: int = 0, exclude=frozenset()) -> list[dict]:
    """``per_size`` puzzles for each number of people in ``sizes``, as prompt rows
    ``{"id", "prompt", "gold", "task": "kk", "subset": "<n>_people", "n_people", "structure"}``.

    ``structure`` is the puzzle up to the names (its statement formulas); puzzles whose structure is in
    ``exclude`` are skipped, so a held-out set can avoid every training puzzle up to renaming.

    Raises:
        ValueError: a size outside [2, 7] or per_size < 1.
        RuntimeError: fewer than ``per_size`` distinct-enough puzzles in 50 x per_size draws (small sizes
            have only a few hundred structures).
    """
    if int(per_size) < 1:
        raise ValueError(f"per_size={per_size!r}: expected >= 1")
    rows = []
    for n in sizes:
        got, i = 0, 0
        while got < int(per_size):
            if i >= 50 * int(per_size) + 100:
                raise RuntimeError(f"only {got} of {per_size} puzzles with {n} people differ from the excluded ones")
            p = make_puzzle(int(n), seed * 1_000_003 + i)
            i += 1
            structure = repr(p["statements"])
            if structure in exclude:
                continue
            names = p["names"]
            prompt = PROMPT.format(n=n, names=", ".join(names[:-1]) + f" and {names[-1]}", statements=p["text"])
            rows.append({"id": f"kk{n}-{seed}-{i - 1}", "prompt": prompt, "gold": gold_string(names, p["solution"]),
                         "task": "kk", "subset": f"{n}_people", "n_people": int(n), "structure": structure})
            got += 1
    return rows


def kk_splits(train_sizes=(3, 4, 5), eval_sizes=(2, 3, 4, 5, 6, 7), train_per_size: int = 200, eval_per_size: int = 10,
              seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): no held-out puzzle equals a training puzzle, even up to renaming
    (same statement structure with other names)."""
    train = make_kk(train_sizes, train_per_size, seed=2 * int(seed))
    held = make_kk(eval_sizes, eval_per_size, seed=2 * int(seed) + 1, exclude=frozenset(r["structure"] for r in train))
    random.Random(seed).shuffle(train)
    return train, held


# ----------------------------------------------------------------------------------- reward

FORMAT_OK, FORMAT_BAD = 1.0, -1.0
ANSWER_CORRECT, ANSWER_WRONG, ANSWER_UNPARSED = 2.0, -1.5, -2.0
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def format_ok(response: str) -> bool:
    """Exactly one of each tag, in the order <think> </think> <answer> </answer>."""
    pos = []
    for tag in _TAGS:
        if response.count(tag) != 1:
            return False
        pos.append(response.index(tag))
    return pos == sorted(pos)


def parse_answer(answer: str, names: list[str]) -> dict[str, str] | None:
    """{name: 'knight'|'knave'} from the answer text, or None unless every person is given exactly one
    role ("<Name> is a knight/knave", case-insensitive) and no role is stated more often than there are people."""
    out = {}
    for name in names:
        found = re.findall(rf"\b{re.escape(name)}\b\s+is\s+an?\s+(knight|knave)\b", answer,
                           flags=re.IGNORECASE | re.ASCII)
        if len(set(r.lower() for r in found)) != 1:
            return None
        out[name] = found[0].lower()
    n_roles = len(re.findall(r"\bkn(?:ight|ave)s?\b", answer, flags=re.IGNORECASE | re.ASCII))
    return out if n_roles <= len(names) else None


def kk_reward(response: str, gold: str) -> dict:
    """Score one response (see the module docstring for the table).

    Returns:
        {"reward": total, "format": format score, "answer": answer score (0 when the format is bad),
        "correct": bool (the full assignment is right), "extracted": the parsed assignment or None}.
        Never raises on model output.
    Raises:
        ValueError: a malformed gold string (a data error, not a model error).
    """
    truth = parse_gold(gold)
    response = str(response)
    if not format_ok(response):
        return {"reward": FORMAT_BAD, "format": FORMAT_BAD, "answer": 0.0, "correct": False, "extracted": None}
    answer = response.split("<answer>", 1)[1].split("</answer>", 1)[0]
    got = parse_answer(answer, list(truth))
    if got is None:
        score = ANSWER_UNPARSED
    else:
        score = ANSWER_CORRECT if got == truth else ANSWER_WRONG
    return {"reward": FORMAT_OK + score, "format": FORMAT_OK, "answer": score, "correct": got == truth,
            "extracted": None if got is None else gold_string(list(got), [got[n] == "knight" for n in got])}


@register_task
class KnightsKnaves(Task):
    """Knights and Knaves as a task (``data=kk``; its held-out puzzles are the benchmark ``kk``, by ``subset``)."""

    name = "kk"
    config = {"train_sizes": L(I(1), min_len=1), "eval_sizes": L(I(1), min_len=1), "train_per_size": I(1, null=True),
              "eval_per_size": I(0, null=True), "seed": I(0)}
    kind = "logic"
    heldout_from_data = True

    def load(self, split: str, cfg) -> list[dict]:
        train, held_out = kk_splits(train_sizes=list(cfg.train_sizes), eval_sizes=list(cfg.eval_sizes),
                                    train_per_size=int(cfg.train_per_size), eval_per_size=int(cfg.eval_per_size),
                                    seed=int(cfg.seed))
        return train if split == "train" else held_out

    def score(self, response: str, row: dict) -> Score:
        out = kk_reward(response, row["gold"])
        return Score(float(out["reward"]), bool(out["correct"]), out["extracted"])

    def validate(self, cfg, role: str) -> None:
        if role != "data":
            return
        for key in ("train_sizes", "eval_sizes"):
            raw = cfg.get(key)
            if not isinstance(raw, (list, tuple)) and not hasattr(raw, "__len__") or isinstance(raw, str):
                raise ValueError(f"data.{key}={raw!r}: expected a list, e.g. data.{key}=[{raw}]")
            sizes = list(raw or [])
            if len(set(sizes)) != len(sizes):
                raise ValueError(f"data.{key}={sizes}: a size appears twice")
            bad = [n for n in sizes if not isinstance(n, int) or not MIN_PEOPLE <= n <= MAX_PEOPLE]
            if not sizes or bad:
                raise ValueError(f"data.{key}={sizes}: people per puzzle must be integers in "
                                 f"[{MIN_PEOPLE}, {MAX_PEOPLE}]; bad: n_people={bad[0] if bad else None}")
        for key in ("train_per_size", "eval_per_size"):
            v = cfg.get(key)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"data.{key}={v!r}: expected an integer >= 1")


# ------------------------------------------------------------------------ the published K&K release

PUBLISHED_INSTRUCTION = ("\nThink it through inside <think> </think> tags, then give the final answer inside "
                         "<answer> </answer> tags, one line per person in the form (1) <name> is a knight/knave.")


def published_rows(records: list, n_people: int, where: str, split: str) -> list[dict]:
    """Rows of the published K&K release (the "memorization" K&K data that Logic-RL and TR-GRPO train on): each
    record has ``quiz`` (the puzzle in English), ``names`` and ``solution`` (one boolean per person, True =
    knight). The prompt is the quiz and the suite's answer-format instruction (the reward's format).

    Raises:
        ValueError: a record without those fields, or names and solution of different lengths, naming its place.
    """
    rows = []
    for i, rec in enumerate(records):
        try:
            quiz, names, sol = str(rec["quiz"]), [str(x) for x in rec["names"]], [bool(x) for x in rec["solution"]]
        except (KeyError, TypeError):
            raise ValueError(f"{where}: record {i + 1} needs quiz, names and solution (K&K release fields)") from None
        if len(names) != len(sol) or not names:
            raise ValueError(f"{where}: record {i + 1} has {len(names)} names but {len(sol)} roles")
        rows.append({"id": f"kkp{n_people}-{split}-{rec.get('index', i)}", "prompt": quiz.strip() + PUBLISHED_INSTRUCTION,
                     "gold": gold_string(names, sol), "task": "kk_published", "subset": f"{n_people}_people",
                     "n_people": int(n_people)})
    return rows


def load_published(split: str, sizes, source: str = "hub", path: str | None = None,
                   hub_path: str = "K-and-K/knights-and-knaves", per_size: int | None = None) -> list[dict]:
    """The published K&K puzzles of ``split`` (``train`` or ``test``) for each number of people in ``sizes``.

    Args:
        source: ``hub`` (``datasets.load_dataset(hub_path, split, split="<n>ppl")``) or ``local`` (``path`` is
            the release's data folder: ``<path>/<split>/people<n>_*.jsonl``).
        per_size: keep the first this many puzzles of each size (None: all).
    Raises:
        FileNotFoundError: no local file for a size; ValueError: a bad record or source.
    """
    rows = []
    for n in sizes:
        if source == "local":
            files = sorted(Path(str(path)).glob(f"{split}/people{int(n)}_*.jsonl")) if path else []
            if not files:
                raise FileNotFoundError(f"data.path={path!r}: no {split}/people{n}_*.jsonl there (the K&K release's data folder)")
            records, where = read_jsonl(files[0]), str(files[0])
        elif source == "hub":
            from datasets import load_dataset

            records, where = list(load_dataset(hub_path, split, split=f"{int(n)}ppl")), f"{hub_path}[{split}/{n}ppl]"
        else:
            raise ValueError(f"data.source={source!r}: expected 'hub' or 'local'")
        got = published_rows(records, int(n), where, split)
        rows += got[: int(per_size)] if per_size else got
    return rows


@register_task
class KnightsKnavesPublished(KnightsKnaves):
    """The published K&K splits (``data=kk_published``: its ``train`` split for training, its ``test`` split as the
    benchmark ``kk_published``, by size), scored with the K&K reward. TR-GRPO trains on 3-7 people."""

    name = "kk_published"
    config = {**KnightsKnaves.config, "source": S(("hub", "local"), null=True), "hub_path": S(), "path": S(null=True)}

    def load(self, split: str, cfg) -> list[dict]:
        sizes = list(cfg.train_sizes if split == "train" else cfg.eval_sizes)
        per = cfg.get("train_per_size") if split == "train" else cfg.get("eval_per_size")
        rows = load_published("train" if split == "train" else "test", sizes, str(cfg.get("source", "hub")),
                              cfg.get("path"), str(cfg.get("hub_path", "K-and-K/knights-and-knaves")), per)
        if split == "train":
            random.Random(int(cfg.get("seed", 0))).shuffle(rows)
        return rows

    def validate(self, cfg, role: str) -> None:
        if role != "data":
            return
        if cfg.get("source") not in ("hub", "local"):
            raise ValueError(f"data.source={cfg.get('source')!r}: expected 'hub' or 'local'")
        if cfg.get("source") == "local" and not (cfg.get("path") and Path(str(cfg.path)).is_dir()):
            raise ValueError(f"data.path={cfg.get('path')!r}: data.source=local needs the K&K release's data folder")
        for key in ("train_sizes", "eval_sizes"):
            sizes = list(cfg.get(key) or [])
            bad = [n for n in sizes if not isinstance(n, int) or not 2 <= n <= 8]
            if not sizes or bad:
                raise ValueError(f"data.{key}={sizes}: the release has 2-8 people per puzzle; bad: {bad}")
        for key in ("train_per_size", "eval_per_size"):
            v = cfg.get(key)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"data.{key}={v!r}: expected null (all) or an integer >= 1")
