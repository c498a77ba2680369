"""The console is the suite's: what reaches the screen is the suite's own lines (logger ``rlvr``, Hydra's launcher
lines, the sweep summary, one-line errors); what the libraries say (vLLM, Triton, transformers, MLflow, Python
warnings) goes to the log files (a sweep point's ``<point folder>/sweep.log``, which its MLflow run also keeps as
``sweep.log``; a command's own log where it writes one) and never to the screen.

``--verbose`` on ``sweep.py`` (or ``RLVR_VERBOSE=1`` for any command) brings the libraries' output back to the
screen. Warnings the suite gives are said once per process (:func:`once`): a sweep's points that share a process
(Hydra's local launcher) see the same warning once, not once per point.

How: :func:`quiet_libraries` runs before vLLM, transformers or MLflow configure their own handlers (vLLM's
``VLLM_CONFIGURE_LOGGING=0``, MLflow's ``MLFLOW_CONFIGURE_LOGGING=false``, transformers' default handler removed and
its records propagated, tqdm bars of Hugging Face off); their records then reach the root logger, whose console
handler admits only the suite's loggers (:class:`SuiteOnly`, named in the Hydra job logging config
``sweeps/hydra/job_logging/rlvr.yaml``) and whose file handler takes everything.
"""
from __future__ import annotations

import logging
import os

VERBOSE_ENV = "RLVR_VERBOSE"
#: the loggers whose records reach the screen (and their children): the suite's own and Hydra's launcher lines
SUITE_LOGGERS = ("rlvr", "HYDRA", "hydra", "__main__")

_said: set[str] = set()


def verbose() -> bool:
    """True when the libraries' output goes to the screen too (``RLVR_VERBOSE=1``; ``sweep.py --verbose`` sets it)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class SuiteOnly(logging.Filter):
    """A handler filter that admits the suite's records (:data:`SUITE_LOGGERS`) and, under :func:`verbose`,
    everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        if verbose():
            return True
        root = record.name.split(".", 1)[0]
        return root in SUITE_LOGGERS


def quiet_libraries() -> None:
    """Keep the libraries' own handlers and progress bars off the screen (see the module docstring); their records
    propagate to the root logger's handlers. Idempotent; call it before vLLM or MLflow is imported (the environment
    variables they read at import) and again after (transformers' handler). A no-op under :func:`verbose`."""
    if verbose():
        return
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    os.environ["MLFLOW_CONFIGURE_LOGGING"] = "false"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.captureWarnings(True)  # Python warnings (FutureWarning, UserWarning) become records of ``py.warnings``
    try:
        from transformers.utils import logging as tl
    except ImportError:
        pass
    else:  # its handler writes to stderr and stops propagation; its bars (weight loading, shard writing) too
        tl.disable_default_handler()
        tl.enable_propagation()
        tl.disable_progress_bar()
    for name in ("vllm", "mlflow"):  # configured before this ran (an import in a test process): their handlers go
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lg.removeHandler(h)
        lg.propagate = True


def screen_filter_on_root() -> None:
    """Give the root logger's console handlers the :class:`SuiteOnly` filter (for commands that configure logging
    themselves with ``logging.basicConfig``, not through Hydra's job logging config)."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
            if not any(isinstance(f, SuiteOnly) for f in h.filters):
                h.addFilter(SuiteOnly())


def forget() -> None:
    """Start a new sweep's memory of what :func:`once` said (pre-flight calls it: each command line is a new sweep)."""
    _said.clear()


def once(message: str) -> bool:
    """True the first time this process is asked about ``message`` (then False): a warning the suite gives once per
    process, however many points of a sweep check the same setting."""
    if message in _said:
        return False
    _said.add(message)
    return True


def log_file() -> str | None:
    """The file the root logger writes to in this process (a sweep point's ``sweep.log``), None when there is none."""
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and h.baseFilename != os.path.realpath(os.devnull):
            h.flush()
            return h.baseFilename
    return None


class _Screen(logging.StreamHandler):
    """A handler writing to ``sys.stdout`` or ``sys.stderr`` as they are when a record comes (not when it was
    made: a test's captured stream, closed since, is never written to)."""

    def __init__(self, name: str):
        super().__init__()
        self._name = name

    @property
    def stream(self):
        import sys

        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the stream is always the current one
        pass


def setup(log_path=None, stream=None) -> None:
    """Logging for a command run outside Hydra (``python -m orchestrator.reproduce``, ``orchestrator.evaluate``,
    ``evaluation.recompute``, ``reports``, ``orchestrator.memory``): the suite's lines (INFO and up: its progress)
    on stdout, everything (the libraries' output included) to ``log_path`` when given; libraries quieted
    (:func:`quiet_libraries`); ``stream``: where the suite's lines go (default stdout; stderr for a command whose
    stdout is its result). Replaces the handlers an earlier call added (others, such as a test runner's, stay)."""
    import sys
    from pathlib import Path

    quiet_libraries()
    fmt = logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_rlvr_console", False):
            root.removeHandler(h)
            h.close()
    screen = _Screen("stderr" if stream is sys.stderr else "stdout")
    screen._rlvr_console = True
    screen.setFormatter(fmt)
    screen.addFilter(SuiteOnly())
    root.addHandler(screen)
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        f = logging.FileHandler(str(log_path))
        f._rlvr_console = True
        f.setFormatter(fmt)
        root.addHandler(f)
    root.setLevel(logging.INFO)


class libraries_speaking:
    """A context in which what the libraries write straight to the process's stdout and stderr (C++ warnings such
    as torch's NUMA binding note, progress bars vLLM draws itself) goes to this process's log file
    (:func:`log_file`; none: discarded), not the screen: file descriptors 1 and 2 are pointed there for the duration.
    A no-op under :func:`verbose`. For short, library-only stretches (a vLLM engine's start): a suite line logged
    inside goes to the file too."""

    def __enter__(self):
        import sys

        self.saved = None
        if verbose():
            return self
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            target = log_file() or os.devnull
            self.sink = open(target, "ab", buffering=0)
            self.saved = (os.dup(1), os.dup(2))
            os.dup2(self.sink.fileno(), 1)
            os.dup2(self.sink.fileno(), 2)
        except (OSError, ValueError, AttributeError):  # no real descriptors (a notebook kernel): leave them alone
            self.saved = None
        return self

    def __exit__(self, *exc):
        import sys

        if self.saved is None:
            return False
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        self.sink.close()
        return False
