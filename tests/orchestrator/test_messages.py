"""Issue 56: every message true, said once, and every refusal one line with exit 2 before any work starts (no run
folder, no store row, no traceback). The sweep's pre-flight runs in this process (``check_command_line``, what
``sweep.py`` calls first), so the cases share one process; the store kinds include one held out of the issue's list
(a store path under a file)."""
from __future__ import annotations

import pytest

from orchestrator.preflight import check_command_line


def _refused(argv, tmp_path, monkeypatch, capsys) -> str:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        check_command_line(argv)
    out = capsys.readouterr()
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and out.out == "", out.err
    assert lines[0].startswith("error: ") and "Traceback" not in out.err
    made = sorted(p.name for p in tmp_path.iterdir())
    assert not any(n in made for n in ("mlflow.db", "multirun", "outputs", "mlartifacts")), made  # no work started
    return lines[0]


def test_a_store_in_a_folder_that_does_not_exist_is_refused_not_created(tmp_path, monkeypatch, capsys):
    """It used to create a new, empty store there and train (de-duplication saw no earlier runs)."""
    line = _refused(["tracking.uri=sqlite:///no_such_dir/mlflow.db"], tmp_path, monkeypatch, capsys)
    assert "the folder no_such_dir does not exist" in line and "mkdir -p no_such_dir" in line
    assert not (tmp_path / "no_such_dir").exists()


def test_a_store_path_under_a_file_names_the_file(tmp_path, monkeypatch, capsys):
    """It ended in a FileExistsError traceback."""
    (tmp_path / "afile").write_text("x")
    line = _refused([f"tracking.uri=sqlite:///{tmp_path}/afile/x.db"], tmp_path, monkeypatch, capsys)
    assert f"{tmp_path}/afile is a file, so {tmp_path}/afile/x.db cannot be made under it" in line
    art = _refused([f"tracking.artifact_root={tmp_path}/afile/art"], tmp_path, monkeypatch, capsys)
    assert "tracking.artifact_root=" in art and "is a file" in art


def test_an_unwritable_location_is_not_called_a_full_disk(tmp_path, monkeypatch, capsys):
    """``/proc`` has 0 bytes free and cannot be written: it was reported as "disk full: 0.0 MB free"."""
    line = _refused(["tracking.artifact_root=/proc/nope/art"], tmp_path, monkeypatch, capsys)
    assert "/proc is not writable" in line and "disk full" not in line
    line = _refused(["tracking.uri=sqlite:////proc/nope/x.db"], tmp_path, monkeypatch, capsys)
    assert "/proc is not writable" in line and "disk full" not in line


def test_several_values_without_multirun_say_to_add_it(tmp_path, monkeypatch, capsys):
    """It passed pre-flight, printed the plans, then stopped with Hydra's 6-line "Ambiguous value"."""
    line = _refused(["algo=grpo,gspo", "train.steps=2"], tmp_path, monkeypatch, capsys)
    assert line == ("error: algo=grpo,gspo gives several values, which makes a sweep: add -m "
                    "(python sweep.py -m algo=grpo,gspo train.steps=2)")


@pytest.mark.parametrize("argv,key,near", [
    (["train.stpes=2"], "train.stpes", "train.steps"),
    (["-m", "algo=grpo,gspo", "trian.steps=2"], "trian.steps", "train.steps"),
    (["eval.temprature=0.5"], "eval.temprature", "eval.temperature"),
])
def test_a_typo_in_a_key_names_the_nearest_key(tmp_path, monkeypatch, capsys, argv, key, near):
    """Hydra's hint was to append the typo (``+train.stpes=2``)."""
    line = _refused(argv, tmp_path, monkeypatch, capsys)
    assert line.startswith(f"error: {key}: no such setting (did you mean {near}?)") and "docs/config.md" in line


def test_an_unknown_eval_preset_lists_the_presets(tmp_path, monkeypatch, capsys):
    from orchestrator.evaluate import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["--checkpoint", str(tmp_path), "--eval", "smok"]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert line.startswith("error: --eval smok: no such preset (did you mean smoke?); the presets in sweeps/eval/: ")
    assert "quick" in line and "paper" in line and list(tmp_path.iterdir()) == []


def test_warnings_are_printed_once_after_every_check_passed_and_never_before_an_error(tmp_path, monkeypatch, capsys):
    """The precision warning printed once per point and again before every pre-flight error; now each warning once
    (naming the points it concerns), after all checks, and an error is its one line alone."""
    from core import console

    monkeypatch.setattr(console, "_said", set())
    monkeypatch.chdir(tmp_path)
    warn = "algo=tr_grpo_literal"  # a preset whose printed formulas pre-flight warns about
    line = _refused(["-m", f"{warn},grpo", "model=tiny-random", "tracking.uri=sqlite:///gone/mlflow.db"],
                    tmp_path, monkeypatch, capsys)
    assert "gone does not exist" in line
    monkeypatch.setattr(console, "_said", set())
    n = check_command_line(["-m", f"{warn},grpo", "model=tiny-random", "eval=smoke"])
    err = capsys.readouterr().err
    assert n == 2
    said = [ln for ln in err.splitlines() if ln.startswith("WARNING")]
    assert said and len(said) == len(set(said)) and all(f"({warn}" in ln or "(every point)" in ln for ln in said)
    # the point's run in this process does not say them again
    assert not any(console.once(ln.split(": ", 1)[1]) for ln in said if "(every point)" not in ln)


def test_said_once_per_process():
    from core.console import once

    assert once("issue 56: a warning") and not once("issue 56: a warning") and once("issue 56: another")
