"""The sandbox: a child process where generated code runs, with a timeout and resource limits.

A kernel that crashes, hangs or poisons its device context kills only this process; the parent
(the evaluator actor) reports one failed evaluation and starts a fresh worker for the next one.
"""
from __future__ import annotations

import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

from kfray.candidate import TIER_RUNTIME_ERROR
from kfray.eval.fastcheck import ensure_built


def _limit_resources(memory_mb: int) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb > 0:
            lim = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    except (ImportError, ValueError, OSError):
        pass


_SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.I)


def scrubbed_env(env) -> dict[str, str]:
    """The environment minus anything that looks like a secret (API keys, tokens, passwords, the
    SSH agent): generated code has no business with them."""
    return {k: v for k, v in env.items() if not _SECRET.search(k)}


def _die_with_parent() -> None:
    """A worker whose evaluator died (killed, node lost) exits too, even in the middle of a hung
    kernel: a daemon thread watches the parent process id."""
    import threading

    ppid = os.getppid()

    def watch():
        while os.getppid() == ppid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="kfray-parent-watch").start()


def _worker_main(conn, backend_name: str, cfg, memory_mb: int) -> None:
    """Worker loop: load the kernel, run correctness and timing, send back a plain dict."""
    _limit_resources(memory_mb)
    _die_with_parent()
    from kfray.eval.backends.base import get_backend
    from kfray.tasks import load_task

    backend = get_backend(backend_name, cfg)
    backend.open_device()
    conn.send({"ready": True})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            task = load_task(job["task_ref"])
            fn = backend.load(job["artifact"], task)
            result = backend.run_job(fn, task, job)
        except MemoryError:
            result = {"tier": TIER_RUNTIME_ERROR, "reason": "out of memory in the sandbox", "recycle": True}
        except Exception as e:  # the kernel's failure, reported as one evaluation
            sticky = backend.check_sticky_error()
            result = {"tier": TIER_RUNTIME_ERROR, "recycle": bool(sticky),
                      "reason": sticky or f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=2)[-800:]}"}
        conn.send(result)


class Sandbox:
    """One long-lived worker process, restarted after any crash, hang or poisoned context."""

    def __init__(self, backend_name: str, cfg, env: dict[str, str] | None = None):
        self.backend_name = backend_name
        self.cfg = cfg
        self.env = env or {}
        self.proc = None
        self.conn = None
        self.restarts = 0

    def _start(self) -> None:
        # A fresh interpreter (not multiprocessing), so it works inside Ray workers and scripts
        # alike; its own session, so a kill takes every thread and child it made.
        parent, child = socket.socketpair()
        env = {**scrubbed_env(os.environ), **self.env}
        helper = ensure_built(getattr(self.cfg, "cache_dir", None) or None)    # the checks' native helper
        if helper is not None:
            env["KFRAY_FASTCHECK_LIB"] = str(helper)
        memory_mb = self.cfg.memory_limit_mb if self.backend_name in ("cpu", "torch_ext_cpu") else 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kfray.eval.sandbox", str(child.fileno())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=[child.fileno()], env=env, start_new_session=True)
        child.close()
        self.proc.stdin.write(pickle.dumps((self.backend_name, self.cfg, memory_mb)))
        self.proc.stdin.close()
        self.conn = Connection(parent.detach())
        if not self.conn.poll(120) or not self.conn.recv().get("ready"):
            self.kill()
            raise RuntimeError("sandbox worker did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                self.proc.kill()
            self.proc.wait(5)
        if self.conn is not None:
            self.conn.close()
        self.proc, self.conn = None, None

    def run(self, job: dict, timeout: float) -> dict:
        """Run one job; any way the worker can fail becomes a tier-2 result with the reason."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self.kill()
            self._start()
        t0 = time.perf_counter()
        self.conn.send(job)
        try:
            ready = self.conn.poll(timeout)
            if not ready:
                self.kill()
                return {"tier": TIER_RUNTIME_ERROR, "reason": f"timeout: no result after {timeout:.0f} s "
                        "(the kernel hangs or is far too slow)", "recycled": True}
            result = self.conn.recv()
        except (EOFError, ConnectionResetError, BrokenPipeError, OSError):
            try:
                code = self.proc.wait(2)
            except subprocess.TimeoutExpired:
                code = None
            self.kill()
            if code is not None and code < 0:
                try:
                    sig = signal.Signals(-code).name
                except ValueError:
                    sig = f"signal {-code}"
                why = f"the kernel crashed the sandbox process with {sig}"
            else:
                why = f"the sandbox process exited with code {code}"
            return {"tier": TIER_RUNTIME_ERROR, "reason": why, "recycled": True,
                    "stage_seconds": {"correctness": time.perf_counter() - t0}}
        if result.pop("recycle", False):
            self.kill()
            result["recycled"] = True
        return result

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            try:
                self.conn.send(None)
                self.proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


if __name__ == "__main__":
    _fd = int(sys.argv[1])
    _backend, _cfg, _mem = pickle.loads(sys.stdin.buffer.read())
    _worker_main(Connection(_fd), _backend, _cfg, _mem)
