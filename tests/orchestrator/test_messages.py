"""Issue 56: every message true, said once, and every refusal one line with exit 2 before any work starts (no run
folder, no store row, no traceback). The sweep's pre-flight runs in this process (``check_command_line``, what
``sweep.py`` calls first), so the cases share one process; the store kinds include one held out of the issue's list
(a store path under a file)."""
from __future__ import annotations

import pytest

from orchestrator.checks.preflight import check_command_line


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
    assert "/proc cannot hold files (a virtual filesystem" in line and "disk full" not in line
    line = _refused(["tracking.uri=sqlite:////proc/nope/x.db"], tmp_path, monkeypatch, capsys)
    assert "/proc cannot hold files" in line and "disk full" not in line


def test_several_values_without_multirun_say_to_add_it(tmp_path, monkeypatch, capsys):
    """It passed pre-flight, printed the plans, then stopped with Hydra's 6-line "Ambiguous value"."""
    line = _refused(["algo=grpo,gspo", "train.steps=2"], tmp_path, monkeypatch, capsys)
    assert line == ("error: algo=grpo,gspo gives several values, which makes a sweep: add -m "
                    "(python sweep.py -m algo=grpo,gspo train.steps=2)")
    line = _refused(["train.lr=range(1,3)"], tmp_path, monkeypatch, capsys)  # the hint pastes into a shell as it is
    assert line.endswith("(python sweep.py -m 'train.lr=range(1,3)')")


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


@pytest.mark.parametrize("argv,fragment", [
    (["-m", "hydra/launcher=slurmm"], "hydra/launcher=slurmm: no such launcher (did you mean slurm?); the launchers: "),
    (["~train"], "the point ~train cannot be checked: ConfigAttributeError: Key 'train' is not in struct"),
    (["tracking.artifact_root=mlflow-artifacts:/"], "artifacts served by an MLflow server need the store to be that"),
    (["-m", "algo=quatro,gspo", "algo.policy_loss.clip_ratio_high=0.3"],  # a key of other algorithms: the point named
     "algo.policy_loss.clip_ratio_high: no such setting; the settings"),
])
def test_more_refusals_found_by_trying_to_break_them(tmp_path, monkeypatch, capsys, argv, fragment):
    """Found by a second pair of eyes on issue 56's messages: a launcher typo, a removed group, an artifact root
    only a server can hold, a key only some points of the sweep have (named with its point, no wrong suggestion)."""
    line = _refused(argv, tmp_path, monkeypatch, capsys)
    assert fragment in line, line
    if "clip_ratio_high" in fragment:
        assert "(sweep point algo=quatro " in line and "did you mean" not in line


def test_files_that_are_not_what_a_setting_needs_are_named(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("my notes\n")
    line = _refused([f"tracking.uri=sqlite:///{tmp_path}/notes.txt"], tmp_path, monkeypatch, capsys)
    assert "notes.txt is not an SQLite database" in line
    line = _refused([f"tracking.artifact_root={tmp_path}/notes.txt"], tmp_path, monkeypatch, capsys)
    assert "notes.txt is a file; the artifact root is a folder" in line
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_a_refusal_after_the_store_check_leaves_no_store(tmp_path, monkeypatch, capsys):
    """The store was created before the output folder was checked: a refusal there left mlflow.db behind."""
    line = _refused(["-m", "hydra.sweep.dir=/proc/sweep", "seed=1,2"], tmp_path, monkeypatch, capsys)
    assert "hydra.sweep.dir=/proc/sweep" in line and "cannot hold files" in line


def test_the_evaluate_command_reads_its_overrides_as_the_sweep_does(tmp_path, monkeypatch, capsys):
    """``eval.n=4`` named a key the user never typed (``eval.eval.n``); ``nn=4`` had no suggestion; a checkpoint
    folder without weights passed pre-flight and ended in a traceback after making a store."""
    from orchestrator.evaluate import main

    monkeypatch.chdir(tmp_path)
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    for argv, fragment in (
            (["nn=4"], "eval.nn: no such setting (did you mean eval.n?)"),
            (["n=4,8"], "eval.n=4,8 gives several values, which makes a sweep: an evaluation takes one value"),
            (["eval.n=4"], f"--checkpoint={ck}: has config.json but no weights"),  # eval.n read as n: no error there
            (["--tracking-uri", "sqlite:///nodir/x.db"], "the folder nodir does not exist")):
        capsys.readouterr()
        assert main(["--checkpoint", str(ck), "--eval", "smoke", *argv]) == 2, argv
        [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert fragment in line, (argv, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_clean_matches_a_moved_project_to_its_store_and_lists_nothing_from_a_store_of_no_runs(tmp_path, monkeypatch):
    """A copied or moved project folder: its records name the old absolute paths; a store with no runs (another
    folder's, an empty one): every checkpoint would look unnamed. Neither may list a finished run's checkpoint."""
    import contextlib
    import io

    from mlflow.tracking import MlflowClient

    from orchestrator.clean import main as clean
    from orchestrator.store import tracking

    root = tmp_path / "moved"
    named = root / "multirun" / "rlvr" / "2026-12-06_10-00-00" / "0"
    (named / "checkpoint").mkdir(parents=True)
    (named / "checkpoint" / "model.safetensors").write_bytes(b"w" * 64)
    stray = root / "multirun" / "rlvr" / "2026-12-06_10-00-00" / "7" / "checkpoint"
    stray.mkdir(parents=True)
    (stray / "model.safetensors").write_bytes(b"s" * 32)
    uri = f"sqlite:///{root}/mlflow.db"
    tracking.ensure_store(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("rlvr")
    run = client.create_run(exp, tags={"rlvr.kind": "trained", "rlvr.config_hash": "h",
                                       "rlvr.run_dir": "/the/old/place/multirun/rlvr/2026-12-06_10-00-00/0"})
    client.set_terminated(run.info.run_id, "FINISHED")
    monkeypatch.chdir(root)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert clean(["--dry-run"]) == 0
    assert str(stray) in out.getvalue() and str(named / "checkpoint") not in out.getvalue(), out.getvalue()
    empty = f"sqlite:///{tmp_path}/empty.db"
    tracking.ensure_store(empty)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert clean(["--tracking-uri", empty, "--root", str(root), "--remove"]) == 0
    assert "checkpoints were not searched" in out.getvalue() and "nothing to remove" in out.getvalue()
    assert (named / "checkpoint" / "model.safetensors").is_file() and stray.is_dir()
