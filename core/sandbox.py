"""Run model-written Python in a sandbox: a separate process per program, isolated by bubblewrap.

What one :func:`run_tests` call does:

- writes the program (candidate code) and the tests to a fresh temporary folder, which is the only writable
  place the program sees (``/`` is mounted read-only, ``/tmp`` and ``/dev`` are fresh and discarded);
- starts ``bwrap`` (Debian/Ubuntu package ``bubblewrap``) with new user, network, PID, IPC, UTS and cgroup
  namespaces (``--unshare-all``: no network interface but loopback, no other process visible), a new
  session, ``--die-with-parent``; when this process runs as root the sandbox runs as an unused uid of its own
  (no account, no group, no file it could write but its folder);
- limits, set before the program starts (``prlimit``): CPU seconds, address space (bytes), processes (the
  sandbox's own uid under root; otherwise the user's processes plus a margin), size of any file written, open
  files; and a wall-clock timeout after which the sandbox's whole process group is killed (its PID namespace
  dies with it);
- runs ``python -I -S`` (isolated: no site-packages, no environment variables read, no user site) on a small
  trusted harness that executes the candidate, then each test, counting passes; the harness prints one
  result line tagged with a random nonce it reads from its standard input. The evaluating process never
  imports or executes model code.

What it does not guarantee: it is not a security boundary against a determined attacker with a kernel
exploit; a program that deliberately inspects the harness's frames can read the nonce and forge its own
score (the reward can be hacked by adversarial code, not the machine); memory is limited per process
(address space), not per sandbox; CPU time is limited per process, the wall-clock timeout bounds the rest.
Without ``bwrap`` (or with user namespaces disabled) nothing runs: :func:`sandbox_missing` says why, and the
code tasks refuse to start.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CPU_S = 10            # CPU seconds per process
WALL_S = 20.0         # wall-clock seconds for the whole program
MEMORY_BYTES = 2 << 30  # address space per process
NPROC = 64            # processes of the sandbox's user
FILE_BYTES = 16 << 20  # largest file the program may write
NOFILE = 256

HARNESS = r'''
import json, sys
nonce = sys.stdin.readline().strip()
try:  # site_packages: this suite's installed packages on the path (read-only, as the rest of the root)
    sys.path[0:0] = json.load(open("paths.json"))
except OSError:
    pass
src = open("program.py").read()
tests = json.load(open("tests.json"))
passed, err = 0, None
ns = {"__name__": "__main__"}
try:
    exec(compile(src, "program.py", "exec"), ns)
except BaseException as e:
    err = "program: " + type(e).__name__
else:
    for t in tests:
        try:
            exec(compile(t, "test", "exec"), ns)
            passed += 1
        except BaseException as e:
            err = err or "test: " + type(e).__name__
sys.stdout.write("\n" + nonce + " " + json.dumps({"passed": passed, "total": len(tests), "error": err}) + "\n")
sys.stdout.flush()
'''


@dataclass(frozen=True)
class TestResult:
    """passed / total tests; ``status``: ``ok`` (the harness reported), ``timeout``, ``crashed`` (killed by a
    limit, or no result line), with ``detail`` (the first error, or the tail of stderr)."""

    passed: int
    total: int
    status: str
    detail: str = ""

    @property
    def all_passed(self) -> bool:
        return self.status == "ok" and self.total > 0 and self.passed == self.total

    @property
    def share(self) -> float:
        return self.passed / self.total if self.status == "ok" and self.total else 0.0


_CHECKED: dict = {}


def _others_can_run(path: str) -> bool:
    """``path`` (resolved) and every folder above it are executable by any user (the sandbox runs as an
    unprivileged uid when this process is root)."""
    real = os.path.realpath(path)
    if not os.path.isfile(real) or not os.stat(real).st_mode & 0o001:
        return False
    d = os.path.dirname(real)
    while True:
        if not os.stat(d).st_mode & 0o001:
            return False
        parent = os.path.dirname(d)
        if parent == d:
            return True
        d = parent


def sandbox_python() -> str | None:
    """The interpreter run inside the sandbox (only its standard library is used): this process's own when the
    sandbox user can reach it, else the system's ``python3`` (e.g. a pyenv under a private /root); None if neither."""
    candidates = [sys.executable, shutil.which("python3") or "", "/usr/bin/python3"]
    as_root = os.geteuid() == 0
    for c in candidates:
        if c and os.path.exists(c) and (not as_root or _others_can_run(c)):
            return os.path.realpath(c)
    return None


def sandbox_missing() -> str | None:
    """Why model code cannot run here (None when it can): ``bwrap`` missing or failing to start."""
    if "result" in _CHECKED:
        return _CHECKED["result"]
    reason = None
    if shutil.which("bwrap") is None or shutil.which("prlimit") is None:
        reason = ("bubblewrap (bwrap) or prlimit is not installed: code tasks run model-written programs only inside "
                  "the sandbox (apt-get install bubblewrap util-linux)")
    elif sandbox_python() is None:
        reason = "no Python interpreter an unprivileged sandbox user can execute (install the system python3)"
    else:
        res = run_tests("x = 1", ["assert x == 1"], wall_s=15)
        if not res.all_passed:
            reason = f"bubblewrap cannot start a sandbox here ({res.status}: {res.detail[-300:]})"
    _CHECKED["result"] = reason
    return reason


def _prlimit_args(nproc: int) -> list[str]:
    """``prlimit`` (util-linux) options for the limits: set in the child before bwrap starts, without a Python
    ``preexec_fn`` (unsafe in a threaded process, and code tasks score programs from a thread pool)."""
    return [f"--cpu={CPU_S}", f"--as={MEMORY_BYTES}", f"--nproc={nproc}", f"--fsize={FILE_BYTES}",
            f"--nofile={NOFILE}", "--core=0"]


_UID_LOCK = __import__("threading").Lock()
_UID_NEXT = [0]
UID_BASE = 1_600_000  # sandboxes run as uids from here (no account needed), one per concurrent program


def _sandbox_uid() -> int:
    """A uid for one sandbox when this process is root: its own, so the process limit (which counts every process
    of a uid) is the sandbox's alone, also with several sandboxes and several suite processes at once."""
    with _UID_LOCK:
        _UID_NEXT[0] = (_UID_NEXT[0] + 1) % 4096
        return UID_BASE + (os.getpid() % 4096) * 4096 + _UID_NEXT[0]


def _pids_of(uid: int) -> list[int]:
    """Live processes of ``uid`` (zombies left out: they run nothing and only their parent can reap them)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    with open(f"/proc/{d}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            out.append(int(d))
            except (OSError, IndexError):
                pass
    return out


def _reap(uid: int, timeout_s: float = 5.0) -> None:
    """Kill every process left with the sandbox's own uid (a fork bomb's children outliving their parent for a
    moment) and wait until none is left, so a run leaves nothing behind. Only under root (own uid per sandbox)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        pids = _pids_of(uid)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _user_process_count() -> int:
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                n += os.stat(f"/proc/{d}").st_uid == uid
            except OSError:
                pass
    return n


def run_tests(program: str, tests: list[str], wall_s: float = WALL_S, site_packages: bool = False) -> TestResult:
    """Run ``program`` then each test (Python source; a test passes when it runs without raising) in the sandbox.

    Args:
        program: the candidate's code (model output); tests: test snippets executed after it, in its namespace.
        wall_s: wall-clock limit for the whole run.
        site_packages: let the program and tests import this process's installed packages (numpy for EvalPlus's
            float comparisons): their folders go first on the sandboxed interpreter's path. The sandbox's walls
            (namespaces, read-only root, no network, resource limits) are the same; only what can be imported differs.
    Returns:
        :class:`TestResult`. Never raises on what the program does (loops, forks, allocations, sockets, writes,
        exits, output floods): those end as failed tests, ``timeout`` or ``crashed``.
    Raises:
        FileNotFoundError: ``bwrap`` is not installed.
    """
    bwrap, prlimit = shutil.which("bwrap"), shutil.which("prlimit")
    if bwrap is None or prlimit is None:
        raise FileNotFoundError("bwrap (bubblewrap) and prlimit (util-linux) are needed; model code runs only in the sandbox")
    as_root = os.geteuid() == 0
    uid = _sandbox_uid() if as_root else os.getuid()
    nproc = NPROC if as_root else _user_process_count() + 4 * NPROC  # a user's limit counts all its processes
    work = tempfile.mkdtemp(prefix="rlvr-sbx-")
    try:
        with open(os.path.join(work, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(os.path.join(work, "tests.json"), "w", encoding="utf-8") as f:
            json.dump(list(tests), f)
        with open(os.path.join(work, "harness.py"), "w", encoding="utf-8") as f:
            f.write(HARNESS)
        under_tmp = []  # site-packages under /tmp (a checkout there), shown again over the sandbox's fresh /tmp
        if site_packages:
            import site

            paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
            with open(os.path.join(work, "paths.json"), "w", encoding="utf-8") as f:
                json.dump(paths, f)
            for path in paths:
                if os.path.realpath(path).startswith("/tmp/"):
                    under_tmp += ["--ro-bind", path, path]
        if as_root:
            for name in ("", "program.py", "tests.json", "harness.py"):
                os.chown(os.path.join(work, name), uid, uid)
        os.chmod(work, 0o755)
        cmd = [prlimit, *_prlimit_args(nproc), "--", bwrap, "--ro-bind", "/", "/", "--tmpfs", "/tmp", *under_tmp, "--bind", work, work, "--chdir", work,
               "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent", "--new-session",
               "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", work,
               sandbox_python() or sys.executable, "-I", "-S", "harness.py"]
        nonce = secrets.token_hex(16)
        drop = {"user": uid, "group": uid, "extra_groups": []} if as_root else {}
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work,
                                start_new_session=True, **drop)
        try:
            out, err = _communicate(proc, nonce, wall_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            return TestResult(0, len(tests), "timeout", f"over {wall_s:g} s wall clock")
        for line in reversed(out.splitlines()):
            if line.startswith(nonce + " "):
                try:
                    r = json.loads(line[len(nonce) + 1:])
                    return TestResult(int(r["passed"]), int(r["total"]), "ok", r.get("error") or "")
                except (ValueError, KeyError, TypeError):
                    break
        return TestResult(0, len(tests), "crashed", f"exit {proc.returncode}: {err[-500:]}")
    finally:
        if as_root:
            _reap(uid)
        shutil.rmtree(work, ignore_errors=True)


MAX_OUTPUT = 1 << 20  # bytes of stdout/stderr kept; a flood beyond is drained and dropped


def _communicate(proc, nonce: str, wall_s: float):
    """Send the nonce; read both streams keeping their first :data:`MAX_OUTPUT` bytes and last 64 KiB (the
    result line comes last; a flood in between is drained and dropped); wait. TimeoutExpired after ``wall_s``."""
    import selectors
    import time

    try:
        proc.stdin.write((nonce + "\n").encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):  # the sandbox died at once; its output says why
        pass
    head = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    tail = {proc.stdout: b"", proc.stderr: b""}
    sel = selectors.DefaultSelector()
    for s in head:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + wall_s
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, wall_s)
        for key, _ in sel.select(timeout=min(left, 1.0)):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            h = head[key.fileobj]
            if len(h) < MAX_OUTPUT:
                h += chunk[:MAX_OUTPUT - len(h)]
            tail[key.fileobj] = (tail[key.fileobj] + chunk)[-65536:]
    proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def text(stream):
        return (bytes(head[stream]) + b"\n" + tail[stream]).decode(errors="replace")

    return text(proc.stdout), text(proc.stderr)


def _kill(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.kill()
    proc.wait()
