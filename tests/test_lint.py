"""The tree under its linter and its limits (issue 68): ruff's pyflakes family and import order clean
(``pyproject.toml``'s ``[tool.ruff]``); no path outside the repository in code or user docs; no file in training/ over 500
lines and over 600 in orchestrator/, core/, evaluation/ and reports/; no function of those five packages over 60
lines, its docstring not counted; no function over 8 parameters outside the registered plug-ins. Each test names the
offenders. The limit checks are functions of a folder, so a test plants an offender in a copy and sees it refused."""
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = {"training": 500, "orchestrator": 600, "core": 600, "evaluation": 600, "reports": 600}
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 8
#: registered plug-ins keep their papers' knobs as keyword parameters (their YAML keys): a registered policy loss,
#: advantage estimator or validator is called with the config's parameters, so its signature is its config
PLUGIN_DECORATORS = ("register_policy_loss", "register_advantage", "register_validator", "register_correction",
                     "register_table", "register_section")


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or (Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (the dev extra; scripts/install.sh installs it)")
    proc = subprocess.run([str(ruff), "check", "--no-cache", str(REPO)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]


@pytest.mark.slow
def test_no_path_outside_the_repository_in_code_or_docs():
    """The suite's code, configs and user docs name no folder beside the checkout (the tests alone read the shared
    benchmark files next to it) and no machine's own paths."""
    outside = re.compile(r"\.\./shared|/work/|shared/reference|shared/data")
    files = [p for p in REPO.rglob("*") if p.suffix in (".py", ".md", ".yaml", ".sh", ".toml") and p.is_file()
             and not {".venv", "tests", ".git", "site"} & set(p.relative_to(REPO).parts)]
    found = [f"{p.relative_to(REPO)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
             if outside.search(line)]
    assert found == []


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _body_lines(fn) -> int:
    """A function's lines, its docstring not counted."""
    lines = fn.end_lineno - fn.lineno + 1
    first = fn.body[0] if fn.body else None
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
            and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _parameters(fn) -> int:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def _is_plugin(fn) -> bool:
    return any(PLUGIN_DECORATORS.__contains__(getattr(getattr(d, "func", d), "id", getattr(getattr(d, "func", d), "attr", "")))
               for d in fn.decorator_list)


def offenders(root: Path) -> dict:
    """{"files": [...], "functions": [...], "parameters": [...]} over the five packages of ``root``: files over their
    package's limit, functions over :data:`MAX_FUNCTION_LINES` without their docstring, functions over
    :data:`MAX_PARAMETERS` parameters that are not registered plug-ins."""
    out = {"files": [], "functions": [], "parameters": []}
    for package, limit in PACKAGES.items():
        for path in sorted((root / package).rglob("*.py")):
            rel, text = path.relative_to(root), path.read_text()
            if (n := len(text.splitlines())) > limit:
                out["files"].append(f"{rel} ({n} lines > {limit})")
            for fn in _functions(ast.parse(text)):
                if (n := _body_lines(fn)) > MAX_FUNCTION_LINES:
                    out["functions"].append(f"{rel}:{fn.lineno} {fn.name} ({n} lines)")
                if (n := _parameters(fn)) > MAX_PARAMETERS and not _is_plugin(fn):
                    out["parameters"].append(f"{rel}:{fn.lineno} {fn.name} ({n} parameters)")
    return out


def test_the_tree_is_within_its_limits():
    assert offenders(REPO) == {"files": [], "functions": [], "parameters": []}


def test_the_limits_refuse_a_planted_long_function_and_a_long_file(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(59))  # with the def line 60; planted adds a return: 61
    (tmp_path / "training" / "planted.py").write_text(f'def planted(a):\n    """Doc."""\n{body}\n    return a\n')
    (tmp_path / "training" / "long.py").write_text("x = 1\n" * 501)
    (tmp_path / "core" / "fine.py").write_text("x = 1\n" * 500 + f"def ok(a):\n{body}\n")
    (tmp_path / "core" / "wide.py").write_text("def wide(a, b, c, d, e, f, g, h, i):\n    return a\n")
    got = offenders(tmp_path)
    assert got["files"] == ["training/long.py (501 lines > 500)"]
    assert got["functions"] == ["training/planted.py:1 planted (61 lines)"]
    assert got["parameters"] == ["core/wide.py:1 wide (9 parameters)"]


def test_module_aliases_are_spelled_out():
    """No module imported under a one- or two-letter capital alias (``T`` meant core.tags in some files and a tables
    module in others): a module keeps its name, or a descriptive one where the name is taken."""
    alias = re.compile(r"^\s*(?:import [\w.]+|from [\w.]* import \w+) as [A-Z]{1,2}\b", re.M)
    roots = ("core", "training", "evaluation", "orchestrator", "reports", "benchmarks", "scripts")
    found = [f"{p.relative_to(REPO)}:{m.group(0).strip()}" for root in roots for p in sorted((REPO / root).rglob("*.py"))
             for m in alias.finditer(p.read_text())]
    assert found == []
