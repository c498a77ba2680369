"""The documentation: the README as a front door (at most about 250 lines, every link to a docs page resolving), the
site in docs/ built by MkDocs in strict mode (a broken link, a missing anchor, a page outside the navigation or a
docstring mkdocstrings cannot read fails it), and every preset file under sweeps/ listed in the docs' tables."""
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

DOCS = REPO / "docs"


def test_readme_is_a_front_door_whose_links_resolve():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "    python -m pytest -q" in readme  # the test command .ci/run runs
    assert "    bash scripts/install.sh && . .venv/bin/activate && python sweep.py -m algo=quatro,gspo delta=0.01,0.1" in readme
    links = re.findall(r"\]\(((?:docs/)[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 15
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, missing


@pytest.mark.slow
def test_mkdocs_build_strict_passes(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra; scripts/install.sh installs it)")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1",
                          "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    site = tmp_path / "site"
    # every page of the navigation was written, the API pages with the registered functions' docstrings in them
    for page in ["performance", "evaluation", "cluster", "verl", "experiments", "extending", "api/training"]:
        assert (site / page / "index.html").is_file(), page
    api = (site / "api" / "training" / "index.html").read_text()
    assert "quatro_advantages" in api and "RECONSTRUCTED" in api


def _table_rows(text):
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_every_preset_file_is_listed_in_the_docs_tables():
    """The config tree's table lists every option of every group (a file under sweeps/<group>/ is an option); the
    algorithm tables (docs and README) list every algorithm preset, the paper-experiment tables every full paper preset."""
    config_rows = _table_rows((DOCS / "config.md").read_text())
    groups = sorted({p.parent.relative_to(REPO / "sweeps").as_posix() for p in (REPO / "sweeps").rglob("*.yaml")} - {"."})
    assert {"algo", "model", "data", "eval", "engine", "experiment", "hydra/launcher"} <= set(groups)
    for group in groups:
        [row] = [r for r in config_rows if r.startswith(f"| `{group}` |")] or [None]
        assert row is not None, f"docs/config.md has no row for the group {group}"
        for f in (REPO / "sweeps" / group).glob("*.yaml"):
            assert f"`{f.stem}`" in row, f"sweeps/{group}/{f.name} is not listed in docs/config.md"
    for page in (DOCS / "algorithms.md", REPO / "README.md"):
        algo_rows = "\n".join(_table_rows(page.read_text()))
        for f in (REPO / "sweeps" / "algo").glob("*.yaml"):
            assert f"`{f.stem}`" in algo_rows, f"sweeps/algo/{f.name} is not in {page.name}'s algorithm table"
    for page in (DOCS / "experiments.md", REPO / "README.md"):
        exp_rows = "\n".join(_table_rows(page.read_text()))
        for f in (REPO / "sweeps" / "experiment").glob("*.yaml"):
            if not f.stem.endswith("_cpu") and f.stem != "verl_smoke":
                assert f"`{f.stem}`" in exp_rows, f"sweeps/experiment/{f.name} is not in {page.name}'s preset table"
    assert "`verl_smoke`" in (DOCS / "verl.md").read_text() or "experiment=verl_smoke" in (DOCS / "verl.md").read_text()
