"""``git_dirty`` reads tracked files only (issue 46: any untracked file marked every run dirty and the report opened
with a warning about it; ``git describe --dirty`` and MLflow's git tag ignore untracked files)."""
import subprocess


def test_an_untracked_file_does_not_make_the_checkout_dirty(tmp_path, monkeypatch):
    from orchestrator.point import provenance

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one")
    monkeypatch.setattr(provenance, "CHECKOUT", tmp_path)
    assert provenance.environment()["git_dirty"] == "false"
    (tmp_path / "results.csv").write_text("untracked\n")
    assert provenance.environment()["git_dirty"] == "false"
    assert "# untracked: results.csv" in provenance.git_diff()  # still listed in the logged patch
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=tmp_path, capture_output=True, text=True)
    assert not described.stdout.strip().endswith("-dirty")  # git's own reading agrees
    (tmp_path / "code.py").write_text("x = 2\n")
    assert provenance.environment()["git_dirty"] == "true"
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=tmp_path, capture_output=True, text=True)
    assert described.stdout.strip().endswith("-dirty")


def test_point_names_carry_no_hydra_escapes():
    """Issue 46: MLflow showed the basic sweeper's escapes (``eval.benchmarks=\\[math500\\,aime24\\]``). The name is
    Hydra's override_dirname, unescaped; a name over MLflow's limit is shortened elsewhere (orchestrator.point.run, the full
    one in the rlvr.point tag)."""
    from hydra._internal.grammar.utils import escape_special_characters  # what the basic sweeper writes per job

    from orchestrator.point.identity import point_name

    escaped = f"algo=quatro,eval.benchmarks={escape_special_characters('[math500,aime24]')},train.lr=1e-6"
    assert "\\," in escaped
    assert point_name(escaped) == "algo=quatro,eval.benchmarks=[math500,aime24],train.lr=1e-6"
