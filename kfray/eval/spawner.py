"""A clean process to fork runners from, so that every candidate starts where no candidate ran.

The judge forks this zygote first thing, before it opens a device or runs anything (a process
that has started OpenMP pools or a CUDA context cannot give either to a fork). The zygote imports
what runners need (numpy, torch for the suite forms), never runs generated code, and on each
request forks one runner that keeps nothing of it but the socket it was handed. Nothing a
candidate changes (flags, patched functions, threads, `sys.modules`) reaches the next one.

The zygote and the judge are not dumpable (PR_SET_DUMPABLE 0): a runner of the same user cannot
ptrace them or read their memory through /proc.
"""
from __future__ import annotations

import ctypes
import importlib
import os
import signal
import socket
import time

from kfray.eval import wire

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def others_in_namespace(spare: int = 0) -> list[int]:
    """Every process of this PID namespace but its init (the judge) and `spare` (the zygote): the
    candidate's runner and whatever it started."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, spare)]


def not_dumpable() -> None:
    _prctl(PR_SET_DUMPABLE, 0)


def limit_memory(memory_mb: int) -> None:
    """No core dumps, and with memory_mb an address-space limit (RLIMIT_AS)."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb > 0:
            lim = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    except (ImportError, ValueError, OSError):
        pass


def _become_runner(fd: int, memory_mb: int) -> None:
    """In the forked child: keep only the runner's socket (as fd 3) and stdio, die with the zygote."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if fd != 3:
        os.dup2(fd, 3)
    os.closerange(4, 1 << 16)
    null = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    if null > 3:
        os.close(null)
    limit_memory(memory_mb)
    from kfray.eval.runner import runner_main

    runner_main(socket.socket(fileno=3))


def _zygote(ctl: socket.socket, preload: list[str], memory_mb: int) -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    not_dumpable()
    ended: dict[int, int] = {}                         # runner pid -> wait status, the last few

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ended[pid] = status
            while len(ended) > 64:
                ended.pop(next(iter(ended)))
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    import kfray.eval.runner  # noqa: F401
    while True:
        try:
            req, fds = wire.recv(ctl, want_fds=True)
        except (EOFError, OSError, wire.WireError):
            os._exit(0)
        reap()
        if req.get("op") == "status":                  # how a runner ended (it may be ending now)
            pid = req.get("pid")
            for _ in range(200):
                if pid in ended:
                    break
                time.sleep(0.01)
                reap()
            status = ended.get(pid)
            wire.send(ctl, {"status": status} if status is not None else {})
            continue
        if req.get("op") != "spawn" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            ctl.close()
            try:
                _become_runner(fds[0], memory_mb)
            finally:
                os._exit(1)
        os.close(fds[0])
        wire.send(ctl, {"pid": pid})


class Spawner:
    """The judge's handle on its zygote: `spawn()` gives a fresh runner's socket and pid."""

    def __init__(self, preload: list[str] = (), memory_mb: int = 0):
        self.preload, self.memory_mb = list(preload), memory_mb
        self.pid = 0
        self.ctl: socket.socket | None = None
        self.started = 0
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                os.closerange(3, theirs.fileno())
                os.closerange(theirs.fileno() + 1, 1 << 16)
                _zygote(theirs, self.preload, self.memory_mb)
            finally:
                os._exit(1)
        theirs.close()
        self.pid, self.ctl = pid, ours
        self.started += 1

    def alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def spawn(self, timeout: float = 30.0) -> tuple[socket.socket, int]:
        """A new runner: (the judge's end of its socket, its pid). A zygote that died (a runner may
        kill it) is started again."""
        for attempt in range(2):
            if not self.alive():
                self.close()
                self._start()
            ours, theirs = socket.socketpair()
            try:
                wire.send(self.ctl, {"op": "spawn"}, [theirs.fileno()])
                reply = wire.recv(self.ctl, timeout=timeout)
                return ours, wire.integer(reply.get("pid"), "runner pid", 1)
            except (OSError, EOFError, TimeoutError, wire.WireError):
                ours.close()
                self.close()
                if attempt:
                    raise RuntimeError("the runner zygote does not answer") from None
            finally:
                theirs.close()
        raise RuntimeError("unreachable")

    def exit_status(self, pid: int) -> int | None:
        """The wait status of a runner that ended (None if unknown or still running)."""
        try:
            wire.send(self.ctl, {"op": "status", "pid": pid})
            reply = wire.recv(self.ctl, timeout=5)
        except (OSError, EOFError, TimeoutError, wire.WireError, AttributeError):
            return None
        st = reply.get("status")
        return st if isinstance(st, int) and not isinstance(st, bool) else None

    def close(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = 0


def end_strays(spare: int = 0, keep: set[int] = frozenset()) -> None:
    """As the init of the sandbox's PID namespace: kill every other process in it (a kernel's
    runner and whatever it forked) but the zygote `spare` and the runners forked after the kernel's
    were gone (`keep`: kfray.eval.spares), so nothing a kernel started outlives its evaluation."""
    if os.getpid() != 1:
        return
    killed = []
    for pid in others_in_namespace(spare):
        if pid in keep:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 2.0
    while killed and time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:      # orphans are ours to reap
                pass
        except ChildProcessError:
            pass
        killed = [p for p in killed if _running(p)]
        if killed:
            time.sleep(0.001)


def process_state(pid: int) -> str:
    """The process's state letter (R, S, D running or waiting; T stopped; Z, X ended), '' if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _running(pid: int) -> bool:
    """Whether the process exists and has not ended (a zombie waits for its parent's reap)."""
    return process_state(pid) not in ("Z", "X", "")
