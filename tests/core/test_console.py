"""Issue 56: the console is the suite's. The screen filter, the libraries' own handlers, output written straight to
the process's descriptors during a library's start, and the progress lines' rate and time left."""
from __future__ import annotations

import logging
import os

from core import console, progress


def _record(name: str, level=logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, "msg", None, None)


def test_the_screen_admits_the_suites_loggers_and_verbose_admits_all(monkeypatch):
    f = console.SuiteOnly()
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    assert f.filter(_record("rlvr")) and f.filter(_record("rlvr.tables")) and f.filter(_record("HYDRA"))
    for lib in ("vllm.model_executor.models.utils", "transformers.modeling_utils", "mlflow.store", "py.warnings",
                "alembic.runtime.migration", "rlvrx"):
        assert not f.filter(_record(lib)), lib
    monkeypatch.setenv(console.VERBOSE_ENV, "1")
    assert f.filter(_record("vllm.engine"))


def test_library_records_reach_the_log_file_not_the_screen(tmp_path, monkeypatch, capsys):
    """transformers writes to stderr through its own handler and stops propagation; after quiet_libraries its
    records, like vLLM's and Python warnings, reach the root logger: the file, not the screen."""
    import warnings

    from transformers.utils import logging as tl

    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    root = logging.getLogger()
    level = root.level
    try:
        console.setup(tmp_path / "run.log")
        tl.get_logger("transformers.modeling_utils").warning("a transformers warning")
        logging.getLogger("vllm.engine").warning("a vllm warning")
        with warnings.catch_warnings():  # pytest records warnings itself; a sweep's process has logging's hook
            warnings.simplefilter("always")
            warnings.showwarning = logging._showwarning
            warnings.warn("a python warning", FutureWarning)
        logging.getLogger("rlvr").info("the suite's line")
    finally:
        for h in list(root.handlers):
            if getattr(h, "_rlvr_console", False):
                root.removeHandler(h)
                h.close()
        root.setLevel(level)
        logging.captureWarnings(False)
    out = capsys.readouterr()
    assert "the suite's line" in out.out and "warning" not in out.out + out.err
    text = (tmp_path / "run.log").read_text()
    assert all(m in text for m in ("a transformers warning", "a vllm warning", "a python warning", "the suite's line"))


def test_what_a_library_writes_to_the_descriptors_during_its_start_goes_to_the_log(tmp_path, monkeypatch, capfd):
    """vLLM's engine start prints torch's C++ NUMA note and its own progress bars straight to file descriptor 2."""
    monkeypatch.delenv(console.VERBOSE_ENV, raising=False)
    log = tmp_path / "sweep.log"
    handler = logging.FileHandler(str(log))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with console.libraries_speaking():
            os.write(2, b"[W utils.cpp:68] Warning: NUMA binding\n")
            os.write(1, b"Loading safetensors checkpoint shards: 100%\n")
        os.write(2, b"after\n")
    finally:
        root.removeHandler(handler)
        handler.close()
    out = capfd.readouterr()
    assert "NUMA" not in out.err + out.out and "Loading safetensors" not in out.out and "after" in out.err
    assert "NUMA binding" in log.read_text() and "checkpoint shards" in log.read_text()


def test_progress_lines_give_the_rate_and_the_time_left(monkeypatch):
    clock = iter([0.0, 30.0, 60.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(progress, "interactive", lambda: False)
    p = progress.LineProgress("train grpo", 4)
    p.close()  # no still-under-way reminders reading the clock beside this test (tested below)
    assert p.update(1, reward=0.5) == "train grpo: step 1/4, reward 0.5, 30.0 s/step, elapsed 0:30, ETA 1:30"
    assert p.update(2) == "train grpo: step 2/4, 30.0 s/step, elapsed 1:00, ETA 1:00"
    clock = iter([0.0, 0.5, 0.5, 0.5])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    lines = []
    monkeypatch.setattr(progress.log, "info", lines.append)
    assert list(progress.track(["a", "b"], "memory plans", unit="preset")) == ["a", "b"]
    assert lines == ["memory plans: preset 1/2, 2.0 presets/s, elapsed 0:00, ETA 0:00",
                     "memory plans: preset 2/2, 4.0 presets/s, elapsed 0:00, ETA 0:00"]


def test_a_long_unit_is_said_to_be_under_way_until_the_progress_closes(monkeypatch):
    """Issue 70: no silent stretch longer than ``QUIET_S`` in a log file while a unit (a first step, an evaluation
    chunk) runs; the reminders stop when the progress is closed, completes, or its owner drops it."""
    import gc
    import time

    monkeypatch.setattr(progress, "QUIET_S", 0.2)
    monkeypatch.setattr(progress, "interactive", lambda: False)
    lines = []
    monkeypatch.setattr(progress.log, "info", lines.append)
    with progress.LineProgress("eval sampling (hf)", 3, unit="prompt") as p:
        time.sleep(2.5)  # the reminder thread looks every min(QUIET_S, 1 s)
        p.update(1)
    said = len(lines)
    assert lines[0].startswith("eval sampling (hf): prompt 1/3 still under way, elapsed 0:0")
    assert said >= 3 and lines[-1].startswith("eval sampling (hf): prompt 1/3, ")
    time.sleep(1.5)
    assert len(lines) == said  # closed: nothing more
    dropped = progress.LineProgress("train grpo", 2)
    del dropped
    gc.collect()
    time.sleep(1.5)
    assert len(lines) == said  # dropped by its owner: nothing more
