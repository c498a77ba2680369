"""Question answering with a search tool (Search-R1's setting; TR-GRPO's agentic experiments, its Table 3).

The policy reasons, may call ``<search>query</search>`` (answered as ``<information>...</information>`` by the
retrieval server, :mod:`core.tools`), and ends with ``<answer>...</answer>``. Scoring: exact match of the last
``<answer>`` against any gold answer after Search-R1's normalisation (lower case; punctuation, the articles a / an /
the and extra whitespace removed); reward +1 for a match and -1 otherwise (TR-GRPO's Eq. 15); a response without an
answer scores -1 and counts in ``no_answer_share``.

Tasks:

- general QA ``nq``, ``triviaqa``, ``popqa`` (kind ``search_general``) and multi-hop ``hotpotqa``,
  ``2wikimultihopqa``, ``musique``, ``bamboogle`` (kind ``search_multihop``): FlashRAG's processed releases
  (``RUC-NLPIR/FlashRAG_datasets``, the files Search-R1 evaluates on: ``question``, ``golden_answers``), from the hub
  or ``<eval.data_dir>/<name>/test.jsonl``; the report's task-kind table gives the general and multi-hop means.
- ``search_train`` (``data=search_train``): Search-R1's training mix, the ``train`` splits of NQ and HotpotQA.
- ``search_demo`` (``data=search_demo``): a generated world of invented people and places whose facts no model can
  know, a corpus of one passage per fact plus distractors, and questions about them: a CPU run shows tool calls,
  masking and exact match end to end (its held-out questions are the benchmark ``search_demo``).
"""
from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

from core.config_keys import I, L, S

from .base import HUB_KEYS, Score, Task, read_jsonl, register_task

SEARCH_TEMPLATE = (
    "Answer the question. Think inside <think> </think>. When you need a fact you do not know, search for it by "
    "writing <search> your query </search>; the results come back inside <information> </information>, and you may "
    "search again. Give the final short answer inside <answer> </answer>, e.g. <answer> Paris </answer>.\n"
    "Question: {problem}")

# the generated world's prompt: one worked example, so a small model sees the tags used (the world's names are
# invented, so the example gives nothing away)
DEMO_TEMPLATE = (
    "Answer questions about people by searching. Example:\nQuestion: Where was Tovar Lumesk born?\n"
    "<search> Tovar Lumesk </search>\n<information> Doc 1(Title: Tovar Lumesk) Tovar Lumesk born in Quilton. "
    "</information>\n<answer> Quilton </answer>\n\nNow answer this question the same way: search first, then answer."
    "\nQuestion: {problem}")

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(text: str) -> str:
    """Search-R1's (SQuAD's) answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def extract_answer(response) -> str | None:
    """The text of the last ``<answer>...</answer>``, or None."""
    if not isinstance(response, str):
        return None
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else None


def exact_match(answer: str | None, golds) -> bool:
    """Whether ``answer`` equals one of ``golds`` after :func:`normalize_answer`."""
    if answer is None:
        return False
    a = normalize_answer(answer)
    return any(a == normalize_answer(g) for g in golds)


class SearchQA(Task):
    """A QA task answered with the search tool (``tools = ("search",)``): +1 / -1 exact-match reward. Without
    ``own_corpus`` the search tool needs ``tools.search.url`` or ``tools.search.index`` (Wikipedia)."""

    kind = "search_general"
    tools = ("search",)
    own_corpus = False
    template = SEARCH_TEMPLATE

    def score(self, response: str, row: dict) -> Score:
        got = extract_answer(response)
        golds = json.loads(row["gold"]) if str(row["gold"]).startswith("[") else [row["gold"]]
        ok = exact_match(got, golds)
        return Score(1.0 if ok else -1.0, ok, got)

    def same_answer(self, a, b) -> bool:
        return a is b if a is None or b is None else normalize_answer(a) == normalize_answer(b)

    def rows_from(self, records: list, where: str, name: str, template: str | None = None) -> list[dict]:
        rows = []
        for i, rec in enumerate(records):
            try:
                q = str(rec["question"])
                golds = rec.get("golden_answers") or rec.get("answers") or rec["answer"]
                golds = [str(g) for g in (golds if isinstance(golds, (list, tuple)) else [golds])]
            except (KeyError, TypeError):
                raise ValueError(f"{where}:{i + 1}: a QA record needs question and golden_answers") from None
            if not golds:
                raise ValueError(f"{where}:{i + 1}: no gold answer")
            rows.append({"id": str(rec.get("id", i)), "problem": q, "prompt": self.render(q, template),
                         "gold": json.dumps(golds), "task": name})
        return rows


FLASHRAG = "RUC-NLPIR/FlashRAG_datasets"


class FlashRAGBenchmark(SearchQA):
    """One of Search-R1's evaluation sets in FlashRAG's release (hub split ``hub_split``) or a local JSONL."""

    hub_split = "test"

    def load(self, split: str, cfg) -> list[dict]:
        data_dir, limit = cfg.get("data_dir"), cfg.get("max_prompts")
        if data_dir:
            path = Path(data_dir) / self.name / "test.jsonl"
            records, where = read_jsonl(path), str(path)
        else:
            from datasets import load_dataset

            records, where = list(load_dataset(FLASHRAG, self.name, split=self.hub_split)), f"{FLASHRAG}/{self.name}[{self.hub_split}]"
        rows = self.rows_from(records, where, self.name)
        return rows[: int(limit)] if limit else rows

    def validate(self, cfg, role: str) -> None:
        data_dir = cfg.get("data_dir")
        if role == "eval" and data_dir and not (Path(data_dir) / self.name / "test.jsonl").is_file():
            raise ValueError(f"eval.data_dir={data_dir!r}: no {self.name}/test.jsonl there")


for _name, _kind, _split in (("nq", "search_general", "test"), ("triviaqa", "search_general", "test"),
                             ("popqa", "search_general", "test"), ("hotpotqa", "search_multihop", "dev"),
                             ("2wikimultihopqa", "search_multihop", "dev"), ("musique", "search_multihop", "dev"),
                             ("bamboogle", "search_multihop", "test")):
    register_task(type(f"FlashRAG_{_name}", (FlashRAGBenchmark,), {"name": _name, "kind": _kind, "hub_split": _split}))


@register_task
class SearchTrain(SearchQA):
    """Search-R1's training mix (``data=search_train``): the ``train`` splits of ``datasets`` (NQ and HotpotQA) from
    FlashRAG's release, or ``source=local`` with ``path`` a JSONL of ``question`` / ``golden_answers`` records;
    shuffled by ``seed``; the first ``n_eval`` are held out (the benchmark ``search_train``)."""

    name = "search_train"
    config = {**HUB_KEYS, "datasets": L(S(min_len=1), min_len=1)}
    heldout_from_data = True

    def load(self, split: str, cfg) -> list[dict]:
        if cfg.get("source") == "local":
            rows = self.rows_from(read_jsonl(cfg.path), str(cfg.path), self.name)
        else:
            from datasets import load_dataset

            rows = []
            for ds in cfg.get("datasets", ["nq", "hotpotqa"]):
                rows += self.rows_from(list(load_dataset(FLASHRAG, str(ds), split="train")), f"{FLASHRAG}/{ds}[train]", self.name)
        random.Random(int(cfg.get("seed", 0))).shuffle(rows)
        held, train = rows[: int(cfg.get("n_eval", 0) or 0)], rows[int(cfg.get("n_eval", 0) or 0):]
        if cfg.get("max_prompts"):
            train = train[: int(cfg.max_prompts)]
        return train if split == "train" else held

    def validate(self, cfg, role: str) -> None:
        if role == "data" and cfg.get("source") == "local" and not (cfg.get("path") and Path(str(cfg.path)).is_file()):
            raise ValueError(f"data.path={cfg.get('path')!r}: data.source=local needs a JSONL file of QA records")


# ------------------------------------------------------------------------------ the generated CPU world

_SYL = ["zor", "vath", "quil", "len", "trel", "mont", "bras", "kov", "ilda", "phen", "dor", "uxa", "mer", "ros",
        "taln", "vey", "okri", "sul", "ban", "thar", "esk", "ovi", "lum", "gard"]
_FACTS = [("born in", "Where was {e} born?", "city"), ("works as", "What does {e} work as?", "job"),
          ("founded", "What did {e} found?", "org"), ("owns a pet named", "What is the name of {e}'s pet?", "pet")]
_JOBS = ["glassblower", "cartographer", "beekeeper", "luthier", "astronomer", "tanner", "falconer", "typesetter"]


def _word(rng: random.Random, k: int = 2) -> str:
    return "".join(rng.choice(_SYL) for _ in range(k)).capitalize()


def make_world(n_entities: int = 40, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(passages, questions) of a generated world: ``n_entities`` invented people, each with four facts (home city,
    job, an organisation they founded, a pet's name), one passage per fact (``"Name"\\nName was born in X.``) and one
    distractor passage per person; one question per fact with its single gold answer. Deterministic in ``seed``."""
    rng = random.Random(f"search-demo:{seed}")
    names, seen = [], set()
    while len(names) < int(n_entities):
        nm = f"{_word(rng)} {_word(rng, 3)}"
        if nm not in seen:
            seen.add(nm)
            names.append(nm)
    passages, questions = [], []
    for e in names:
        values = {"city": _word(rng) + "ton", "job": rng.choice(_JOBS), "org": f"the {_word(rng)} Guild",
                  "pet": _word(rng)}
        for rel, question, key in _FACTS:
            passages.append({"id": f"p{len(passages)}", "contents": f'"{e}"\n{e} {rel} {values[key]}.'})
            questions.append({"id": f"q{len(questions)}", "question": question.format(e=e), "golden_answers": [values[key]]})
        passages.append({"id": f"p{len(passages)}", "contents": f'"{e}"\n{e} is known in the valley for long walks.'})
    return passages, questions


@register_task
class SearchDemo(SearchQA):
    """The generated world as a task (``data=search_demo``; ``n_entities``, ``seed``, ``n_eval``, ``max_prompts``,
    ``response_prefix``): its corpus is written to the cache on first use (:meth:`corpus`), named by every row, and
    indexed by the search tool. Its prompt carries one worked example; ``response_prefix`` (default ``<search>``) is
    put where the response starts, so a 135M model's first move is a query (SmolLM2-135M without it never
    searched in our trials; with it about half its episodes call the tool). The prefix is prompt, not policy text:
    it gets no loss."""

    name = "search_demo"
    config = {"n_entities": I(1), "seed": I(0), "n_eval": I(0), "max_prompts": I(1, null=True),
              "response_prefix": S(null=True)}
    heldout_from_data = True
    template = DEMO_TEMPLATE
    own_corpus = True  # its rows name the corpus the search tool indexes

    def load(self, split: str, cfg) -> list[dict]:
        _, questions = make_world(int(cfg.get("n_entities", 40)), int(cfg.get("seed", 0)))
        corpus, prefix = str(self.corpus(cfg)), str(cfg.get("response_prefix", "<search>") or "")
        rows = [dict(r, corpus=corpus, response_prefix=prefix) for r in self.rows_from(questions, "search_demo", self.name)]
        random.Random(int(cfg.get("seed", 0))).shuffle(rows)
        n_eval = int(cfg.get("n_eval", 0) or 0)
        held, train = rows[:n_eval], rows[n_eval:]
        if cfg.get("max_prompts"):
            train = train[: int(cfg.max_prompts)]
        return train if split == "train" else held

    def corpus(self, cfg) -> Path:
        """The world's corpus as a JSONL file (written once per world under ``$RLVR_CACHE/search_demo``)."""
        import os

        from core.models import cache_root

        passages, _ = make_world(int(cfg.get("n_entities", 40)), int(cfg.get("seed", 0)))
        folder = cache_root() / "search_demo"
        path = folder / f"world-{int(cfg.get('n_entities', 40))}-{int(cfg.get('seed', 0))}.jsonl"
        if not path.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text("".join(json.dumps(p) + "\n" for p in passages), encoding="utf-8")
            tmp.replace(path)
        return path

    def validate(self, cfg, role: str) -> None:
        if role != "data":
            return
        for key in ("n_entities", "n_eval"):
            v = cfg.get(key)
            if not isinstance(v, int) or v < (1 if key == "n_entities" else 0):
                raise ValueError(f"data.{key}={v!r}: expected an integer >= {1 if key == 'n_entities' else 0}")
        if 4 * int(cfg.get("n_entities")) <= int(cfg.get("n_eval")):
            raise ValueError(f"data.n_eval={cfg.get('n_eval')}: the world has only {4 * int(cfg.get('n_entities'))} questions")
