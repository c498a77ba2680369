"""A Python that has already imported what a sweep imports, for the tests' ``sweep.py`` and ``python -m`` commands.

Every sweep a test starts (about a hundred in the suite) spends 5-10 s of a CPU core importing torch, transformers,
MLflow, Hydra and the suite before it does anything (``python -X importtime -c "import sweep"``). This module is a
fork server: one process per pytest worker imports all that once (:data:`WARM`), then forks a child for each command;
the child takes the caller's environment, working folder, arguments and standard streams and runs the command's own
code (``runpy``, as ``__main__``), so the sweep is the same code as ``python sweep.py ...`` started fresh, only
without the imports.

Use :func:`python` in place of ``[sys.executable]``: ``subprocess.run([*python(), "sweep.py", ...])``. What it starts
is a small client process (this file, a few standard modules) that behaves as the command would for the test: its
exit status is the command's (``-N`` when a signal ended it), a signal sent to it is sent on to the command, and
when the client is killed (``kill -9``, a timeout) the command is killed with it. A command is run by a fresh
interpreter in the forked child (``exec``) instead when it could differ from one started fresh: its environment
changes a variable read at import (:func:`_import_time_change`) or it asks for ``--verbose``; and when no server
can be reached, the client runs the command itself.
"""
from __future__ import annotations

import json
import os
import socket
import sys

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
SOCKET_ENV = "RLVR_TEST_PREWARMED"
# what the server imports once: sweep.py's own imports (which quiet the libraries first) and what its points load
WARM = ("sweep", "transformers:AutoTokenizer,AutoModelForCausalLM", "training.engines.local", "evaluation.pipeline",
        "orchestrator.point.run_evaluation", "reports.build", "mlflow.store.tracking.sqlalchemy_store", "peft")
# environment variables read when a module is imported (by the suite or a library the server imports): a command
# whose environment changes one of these is run by a fresh interpreter. vLLM's (``VLLM_*``, which an in-process vLLM
# engine of a test sets, core/vllm_engine.py) count only if the server imported vLLM, which it does not
IMPORT_TIME = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "MKL_", "KMP_", "CUDA",
               "TOKENIZERS_", "PYTHON", "LD_", "RLVR_BASE_STALE_S", "RLVR_LEASE_SETTLE_S", "RLVR_VERBOSE")
# set by core.console.quiet_libraries, which sweep.py and the suite's commands call first, in the child too: the same
# values whether the caller's process had called it or not
QUIETING = ("VLLM_CONFIGURE_LOGGING", "MLFLOW_CONFIGURE_LOGGING", "HF_HUB_DISABLE_PROGRESS_BARS",
            "TRANSFORMERS_NO_ADVISORY_WARNINGS")
_server = None
_socket = None  # this process's server's socket (:func:`reserve`)


def reserve() -> None:
    """Name this process's fork server's socket in the environment (``RLVR_TEST_PREWARMED``), so that an environment
    a test copies before its first :func:`python` call still reaches it (tests/conftest.py calls this at import).
    Each process has its own: a pytest worker does not use the one its parent named."""
    global _socket
    if _socket is None:
        import tempfile

        _socket = os.environ[SOCKET_ENV] = os.path.join(tempfile.mkdtemp(prefix="rlvr-prewarmed-"), "socket")


def python() -> list[str]:
    """The argument list to put before a script or ``-m module`` and its arguments, in place of ``[sys.executable]``:
    the client of this process's fork server (started on first use, stopped when this process exits)."""
    global _server
    reserve()
    os.environ[SOCKET_ENV] = _socket
    if _server is None:
        import atexit
        import subprocess

        _server = subprocess.Popen([sys.executable, HERE, "--serve", _socket], cwd=REPO,
                                   stdin=subprocess.DEVNULL)
        atexit.register(_stop)
    return [sys.executable, HERE]


def _stop() -> None:
    import shutil

    _server.kill()
    shutil.rmtree(os.path.dirname(_socket), ignore_errors=True)


# ---- the client: started by the test, stands for the command ----

def _client(argv: list[str]) -> None:
    import signal
    import time

    path = os.environ.get(SOCKET_ENV)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 120  # the server may still be importing
    while True:
        try:
            conn.connect(path)
            break
        except (OSError, TypeError):
            if path is None or time.monotonic() > deadline:
                os.execv(sys.executable, [sys.executable, *argv])  # no server: run the command here
            time.sleep(0.05)
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [len(request).to_bytes(8, "big") + request], [0, 1, 2])
    reader = conn.makefile("rb")
    pid = int(reader.readline())

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    while True:
        try:
            status = reader.readline()
            break
        except InterruptedError:
            continue
    if not status:  # the server went away
        sys.exit("tests/prewarmed.py: the fork server ended before the command did")
    kind, value = status.split()
    if kind == b"signal":
        signal.signal(int(value), signal.SIG_DFL)
        os.kill(os.getpid(), int(value))
        time.sleep(5)
    os._exit(int(value))


# ---- the server: one per pytest worker ----

def _import_time_change(before: dict, env: dict) -> str | None:
    """The first variable read at import that ``env`` sets otherwise than the server's imports saw, else None."""
    prefixes = IMPORT_TIME + (("VLLM_",) if "vllm" in sys.modules else ())
    for key in sorted(set(before) | set(env)):
        if key.startswith(prefixes) and key not in QUIETING and before.get(key) != env.get(key):
            return key
    return None


def _run_child(request: dict, fds: list[int], listener: socket.socket, before: dict | None) -> None:
    """In the forked child: become the command (``before``: the server's environment before its imports; None: every
    command runs fresh)."""
    import runpy
    import tempfile

    listener.close()
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(request["cwd"])
    argv, env = request["argv"], request["env"]
    why = "threads in the server" if before is None else _import_time_change(before, env) or (
        "--verbose" if "--verbose" in argv else None)
    if why:  # said in a file beside the socket, not on the command's output, which tests read
        with open(os.path.join(os.path.dirname(env.get(SOCKET_ENV) or "/tmp/x"), "fresh.log"), "a") as f:
            f.write(f"{why}: {' '.join(argv)[:200]}\n")
        os.execve(sys.executable, [sys.executable, *argv], env)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR as the command's environment says
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = request["cwd"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(argv[0])
        sys.argv = [script, *argv[1:]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def _serve(path: str) -> None:
    """Import :data:`WARM`, then fork a child per connection, send the client its pid, then its exit status; kill it
    when the client goes away first. Exits when the worker that started it does."""
    import importlib
    import select
    import threading

    before = dict(os.environ)
    sys.path[0] = REPO  # as for ``python sweep.py``: the script's folder first, not this file's
    for spec in WARM:
        module, _, names = spec.partition(":")
        try:
            mod = importlib.import_module(module)
            for name in filter(None, names.split(",")):
                getattr(mod, name)
        except ImportError:
            pass
    if threading.active_count() != 1:  # a fork of a process with threads is not safe: every command runs fresh
        before = None
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    listener.listen(16)
    children: dict[int, socket.socket] = {}  # pid: its client's connection
    watched: dict[socket.socket, int] = {}  # the connections of clients still there: pid
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, *watched], [], [], 0.05)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                head, fds, _, _ = socket.recv_fds(conn, 8, 3)
                body = b""
                while len(body) < int.from_bytes(head, "big"):
                    body += conn.recv(1 << 20)
                pid = os.fork()
                if pid == 0:
                    for other in children.values():
                        other.close()
                    conn.close()
                    _run_child(json.loads(body), fds, listener, before)
                for fd in fds:
                    os.close(fd)
                conn.sendall(f"{pid}\n".encode())
                children[pid] = conn
                watched[conn] = pid
            elif not sock.recv(1):  # the client went away: its command goes with it
                pid = watched.pop(sock)
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = children.pop(pid)
                watched.pop(conn, None)
                sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
                try:
                    conn.sendall(f"signal {sig}\n".encode() if sig else f"exit {os.WEXITSTATUS(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        _serve(sys.argv[2])
    else:
        _client(sys.argv[1:])
