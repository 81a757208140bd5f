"""The judge's side of a candidate's runner: requests over the data-only wire, the judge's own
clock around each one, and the kf_forward kernel as a callable that runs in the runner.

Every answer is untrusted: it is parsed as JSON, held to a schema and bounds, and a runner that
hangs past its deadline, dies or answers out of form is killed, and the candidate charged one
evaluation with the reason. A call's claimed seconds are kept beside the judge's own measure of
the same request (`log`), for kfray.eval.defences.clock_check, with the time the OS scheduler
says the judge and the runner's request thread stood waiting for a CPU during it, less the CPU its
other threads used meanwhile (`waits_allowed`).
"""
from __future__ import annotations

import os
import signal
import statistics
import time

from kfray.eval import wire
from kfray.eval.cpu_clock import cpu_snapshot, waits_allowed  # noqa: F401  (waits_allowed: kfray.eval.remote's, as before)
from kfray.tasks.base import Tensor

MAX_ANSWER = 1 << 16            # bytes: an answer is a return code and a time, or an error's text
PINGS = 8


class RunnerFailed(Exception):
    """The runner died, hung, or answered out of form; the message says which."""


class RemoteRunner:
    def __init__(self, spawner, deadline_s: float = 600.0):
        self.spawner = spawner
        self.sock, self.pid = spawner.spawn()
        self.zygote_pid = spawner.pid
        self.deadline_s = deadline_s
        self.known: set[int] = set()        # buffer ids this runner has mapped
        self.round_trip = (0.0, 0.0)        # median and 90th percentile of an empty request, seconds
        self.log: list[tuple[float, float, float]] = []  # (judge's seconds, claimed, run-queue wait) per call
        self.before_next = None             # reads a request posted earlier (a load) before the next is sent
        self.spare = False                  # forked ahead, its device opened before its job (kfray.eval.spares)
        self.owed: list[int] = []           # requests whose answers are read, and dropped, before the next one's
        self.calibrate()

    def request(self, obj: dict, fds=(), timeout: float | None = None) -> dict:
        ans, _ = self.request_fds(obj, fds, timeout, want_fds=False)
        return ans

    def request_fds(self, obj: dict, fds=(), timeout: float | None = None, want_fds: bool = True):
        """(answer, the descriptors that came with it)."""
        return self.answer(self.post(obj, fds), timeout, want_fds)

    def post(self, obj: dict, fds=()) -> int:
        """Send a request without waiting for its answer (read later with `answer`); its number.
        An earlier request's answer still owed (`before_next`) is read first, so answers never cross."""
        if self.before_next is not None:
            settle, self.before_next = self.before_next, None
            settle()
        if self.sock is None:
            raise RunnerFailed("the candidate's process is gone")
        seq = int.from_bytes(os.urandom(6), "little")     # echoed: an answer written ahead is out of turn
        try:
            wire.send(self.sock, {**obj, "seq": seq}, fds)
        except OSError:
            why = self._exit_reason()
            self.close()
            raise RunnerFailed(why) from None
        return seq

    def answer(self, seq: int, timeout: float | None = None, want_fds: bool = True):
        """The answer to request `seq`, held to its form: (answer, the descriptors that came with it).
        Answers still owed from before it (`owed`: a spare's warm-up) are read first, and dropped."""
        while self.owed and self.owed[0] != seq:
            self._read(self.owed.pop(0), timeout, False)
        return self._read(seq, timeout, want_fds)

    def _read(self, seq: int, timeout: float | None, want_fds: bool):
        if self.sock is None:
            raise RunnerFailed("the candidate's process is gone")
        got: list[int] = []
        try:
            if want_fds:
                ans, got = wire.recv(self.sock, timeout=timeout or self.deadline_s, max_bytes=MAX_ANSWER,
                                     want_fds=True)
            else:
                ans = wire.recv(self.sock, timeout=timeout or self.deadline_s, max_bytes=MAX_ANSWER)
        except TimeoutError:
            self.close()
            raise RunnerFailed(f"timeout: no result after {timeout or self.deadline_s:.0f} s from the kernel's "
                               "process, which was killed (the kernel hangs or is far too slow; eval.timeout_s "
                               "raises the limit)") from None
        except wire.WireError as e:
            self.close()
            raise RunnerFailed(f"the kernel's process wrote to the judge's wire out of form ({e}); the answer "
                               "was refused unread [kfray rule: data-only wire]") from None
        except (EOFError, OSError):
            why = self._exit_reason()
            self.close()
            raise RunnerFailed(why) from None
        if ans.get("seq") != seq:
            for fd in got:
                os.close(fd)
            self.close()
            raise RunnerFailed("the kernel's process answered out of turn (an answer that was not the one asked "
                               "for: something in it wrote to the judge's wire); refused [kfray rule: data-only wire]")
        if "error" in ans:
            for fd in got:
                os.close(fd)
            raise RunnerFailed(wire.text(ans["error"], "error", 2000))
        return ans, got

    def _exit_reason(self) -> str:
        status = self.spawner.exit_status(self.pid)
        if status is not None and os.WIFSIGNALED(status):
            try:
                name = signal.Signals(os.WTERMSIG(status)).name
            except ValueError:
                name = f"signal {os.WTERMSIG(status)}"
            return f"the kernel crashed its process with {name}"
        return "the kernel's process ended in the middle of a request (crashed or exited)"

    def calibrate(self) -> None:
        """The wire's round trip, measured before any candidate code is loaded."""
        self.round_trip = self._pings()

    def _pings(self) -> tuple[float, float]:
        ts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            self.request({"op": "ping"}, timeout=30)
            ts.append(time.perf_counter() - t0)
        ts.sort()
        return statistics.median(ts), ts[int(0.9 * (len(ts) - 1))]

    def quiet_round_trip(self) -> tuple[float, float]:
        """The wire's round trip at its quietest: the calibration, or pings now where faster. A
        calibration taken while the machine was busy (a 2-core host starting actors) allowed so
        much jitter that faked times passed the outside clock; a candidate can slow a ping, never
        speed one up, so the lower figure is safe to use."""
        try:
            now = self._pings()
        except (RunnerFailed, OSError):
            return self.round_trip
        self.round_trip = (min(self.round_trip[0], now[0]), min(self.round_trip[1], now[1]))
        return self.round_trip

    def share(self, arena, arrays) -> list:
        """Map into the runner the arena buffers of these arrays it has not seen; drop freed ones."""
        new, refs = [], []
        for a in arrays:
            buf, off, fd = arena.locate(a)
            refs.append(["p", buf, off])
            if buf not in self.known and all(buf != b for b, _ in new):
                new.append((buf, fd))
        freed = [b for b in arena.take_freed() if b in self.known]
        if freed:
            self.known.difference_update(freed)
            self.request({"op": "drop", "ids": freed}, timeout=30)
        for i in range(0, len(new), wire.MAX_FDS):
            part = new[i:i + wire.MAX_FDS]
            ids = [b for b, _ in part]
            if hasattr(arena, "map_request"):         # device memory: IPC handles, no descriptors
                req, fds = arena.map_request(ids)
            else:
                req, fds = {"op": "map", "ids": ids}, [fd for _, fd in part]
            self.request(req, fds, timeout=30)
            self.known.update(ids)
        return refs

    def timed(self, obj: dict, timeout: float | None = None) -> tuple[dict, list[int]]:
        """A call request with the judge's clock around it, logged beside the time it claims:
        (answer, the descriptors that came with it)."""
        w0 = cpu_snapshot(self.pid, self.zygote_pid)
        t0 = time.perf_counter()
        ans, fds = self.request_fds(obj, timeout=timeout)
        outside = time.perf_counter() - t0
        self.log.append((outside, claimed(ans), waits_allowed(w0, cpu_snapshot(self.pid, self.zygote_pid))))
        return ans, fds

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class RemoteKernel:
    """kf_forward loaded in a runner, called like the in-process one: fn(device_args) -> rc."""

    def __init__(self, runner: RemoteRunner, arena, artifact: str, task):
        self.runner, self.arena, self.task = runner, arena, task
        self.names = [a.name for a in task.args]
        self.tensors = {a.name for a in task.args if isinstance(a, Tensor)}
        kinds = ["ptr" if isinstance(a, Tensor) else a.dtype for a in task.args]
        runner.request({"op": "load_cdll", "artifact": artifact, "kinds": kinds}, timeout=60)

    def payload(self, args: dict) -> list:
        """kf_forward's arguments as the runner takes them: shared buffers by reference, scalars."""
        refs = iter(self.runner.share(self.arena, [args[n] for n in self.names if n in self.tensors]))
        return [next(refs) if n in self.tensors else ["s", _scalar(args[n])] for n in self.names]

    def __call__(self, args: dict) -> int:
        payload = self.payload(args)
        ans, _ = self.runner.timed({"op": "call", "args": payload})    # a call answer carries no descriptors
        self.last_answer = ans
        return wire.integer(ans.get("rc"), "kf_forward's return code", -(1 << 31), (1 << 31) - 1)


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def claimed(ans: dict) -> float:
    """The seconds an answer claims for its call; one that no clock could give is refused."""
    try:
        return wire.number(ans.get("s"), "claimed seconds", 0.0, 1e6)
    except wire.WireError as e:
        raise RunnerFailed(f"the kernel's process claimed an impossible time for a call ({e}) "
                           "[kfray rule: outside clock]") from None


def claimed_times(fn) -> list | None:
    """The (judge's, claimed, run-queue wait) seconds log of a kernel that runs in a runner,
    emptied; else None."""
    runner = getattr(fn, "runner", None)
    if runner is None:
        return None
    runner.log.clear()
    return runner.log


class paused:
    """Stop the candidate's processes (its runner, and under the judge's PID namespace everything
    but the judge and the zygote) while the judge times its reference: a kernel that left threads
    or children loading the machine cannot slow the reference down. `spare`: processes to leave
    running (the reference's own runner)."""

    def __init__(self, fn, spare=()):
        from kfray.eval.spawner import others_in_namespace

        runner = getattr(fn, "runner", None)
        self.pids: list[int] = []
        if runner is not None and runner.pid:
            self.pids = others_in_namespace(runner.zygote_pid) if os.getpid() == 1 else [runner.pid]
            self.pids = [p for p in self.pids if p not in spare]

    def _signal(self, sig) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def __enter__(self):
        self._signal(signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        self._signal(signal.SIGCONT)
        return False
