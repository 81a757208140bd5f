"""Content-addressed compile cache: a build is keyed by everything that can change its bytes.

Builds are written to a temporary name and renamed into place, so a crash never leaves a half
file under a valid key, and concurrent evaluators (or nodes sharing the folder) can race safely;
the long builds (torch extensions) also take the key's lock (`building`), so that a second
process waits for the first one's build instead of making it again.
Across the nodes of a cluster, a `CacheServer` actor holds every build the run made: a node that
misses locally fetches it from there before it compiles, so nothing is compiled twice anywhere.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import shutil
import subprocess
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from kfray.eval import isolation
from kfray.eval.native_build import cache_root


COMPILER_NICE = 10      # builds run beside timings (evaluators build ahead): they take what timing leaves
_NICE = shutil.which("nice")


def default_root() -> Path:
    """KFRAY_CACHE, or ~/.cache/kfray."""
    return cache_root()


def run_compiler(cmd: list[str], timeout: float, plan: dict | None = None) -> tuple[int, str]:
    """(exit code, stderr + stdout) of a compiler run in its own session, so a timeout kills every
    process it started (nvcc's cicc and ptxas, g++'s cc1plus), not only the driver. A timeout is a
    CompileError; a compiler that cannot be started is a BackendError. With an isolation `plan`
    (kfray.eval.isolation.compile_plan) it runs inside its namespaces: a hostile #include finds
    no home folder, and nothing but its output folder is writable."""
    from kfray.errors import BackendError
    from kfray.eval.backends.base import CompileError

    env = None
    if plan is not None:
        cmd, env = isolation.wrap(cmd, plan), isolation.scrubbed_env(os.environ)
    if _NICE:             # a build ahead yields the cores to a kernel being timed (its whole tree)
        cmd = [_NICE, "-n", str(COMPILER_NICE), *cmd]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env=env)
    except OSError as e:
        raise BackendError(f"cannot run {cmd[0]}: {e}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            proc.kill()
        proc.communicate()
        raise CompileError(f"{Path(cmd[0]).name} timed out after {timeout:.0f} s") from None
    return proc.returncode, (err + "\n" + out).strip()


class CompileCache:
    def __init__(self, root: str | Path | None = None, server: str = "", isolation_mode: str = "namespaces"):
        self.root = Path(root) if root else default_root()
        self.isolation = isolation.check_mode(isolation_mode)   # eval.isolation: how compilers run
        self.root.mkdir(parents=True, exist_ok=True)
        self.server_name = server
        self._server = None
        self.hits = 0
        self.remote_hits = 0
        self.misses = 0

    def _remote(self):
        if self.server_name and self._server is None:
            import ray
            try:
                self._server = ray.get_actor(self.server_name)
            except ValueError:
                self.server_name = ""            # no server (yet): work locally
        return self._server

    @staticmethod
    def key(**parts) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def lookup(self, key: str, suffix: str) -> Path | None:
        p = self.path(key, suffix)
        if p.exists():
            self.hits += 1
            return p
        server = self._remote()
        if server is not None:
            import ray
            for sfx, data in (ray.get(server.get.remote(key)) or {}).items():
                tmp = self.temp_path(key, sfx)
                tmp.write_bytes(data)
                os.replace(tmp, self.path(key, sfx))
            if p.exists():
                self.remote_hits += 1
                return p
        self.misses += 1
        return None

    @contextlib.contextmanager
    def building(self, key: str, suffix: str):
        """One build of `key` at a time in this folder. Yields the artifact if another process made it
        while this one waited (no count as a hit or miss: the lookup before counted), else None:
        build it. Two evaluators, or the tests' background prebuild and a test, built the same
        torch extension side by side, 15-20 CPU-s each."""
        p = self.path(key, ".lock")
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError:           # a filesystem without locks: builds may overlap, as before
                pass
            done = self.path(key, suffix)
            yield done if done.exists() else None

    def temp_path(self, key: str, suffix: str) -> Path:
        p = self.path(key, suffix)
        p.parent.mkdir(parents=True, exist_ok=True)
        # Unique per process and thread (a GPU evaluator compiles on several threads); suffix last:
        # compilers read it.
        return p.with_name(f".{key}.{os.getpid()}.{threading.get_ident()}.tmp{suffix}")

    def compile_source(self, key: str, source: str, src_suffix: str, command: Callable[[Path, Path], list[str]],
                       timeout: float) -> tuple[Path, int, str]:
        """Compile `source` to a temporary `.so` beside its key: `command(src, out)` is the compiler's
        argument list (never a shell string: nothing from a model reaches a shell). Returns the
        artifact, for the caller to `commit` once it is good; the exit code; and the compiler's
        output, the temporary source named `kernel<src_suffix>` in it. After a failed compile
        the artifact does not exist."""
        src = self.temp_path(key, src_suffix)
        src.write_text(source)
        out = self.temp_path(key, ".so")
        cmd = command(src, out)
        try:
            rc, text = run_compiler(cmd, timeout, self.compile_plan(cmd, out.parent))
        except BaseException:
            out.unlink(missing_ok=True)
            raise
        finally:
            src.unlink(missing_ok=True)
        if rc != 0 or not out.exists():
            out.unlink(missing_ok=True)
        return out, rc, text.replace(str(src), "kernel" + src_suffix).replace(src.name, "kernel" + src_suffix)

    def compile_plan(self, cmd: list[str], out_dir: Path, writable: list[str] = ()) -> dict | None:
        """The isolation a compiler of this cache runs under (None: eval.isolation none, or unavailable):
        it writes `out_dir` and the `writable` folders (a compiler's own cache) only."""
        if not isolation.active(self.isolation):
            return None
        return isolation.compile_plan(cmd, out_dir, self.root, writable)

    def commit(self, tmp: Path, key: str, suffix: str) -> Path:
        final = self.path(key, suffix)
        os.replace(tmp, final)
        server = self._remote()
        if server is not None:
            server.put.remote(key, suffix, final.read_bytes())     # fire and forget
        return final

    def stats(self) -> dict:
        hits = self.hits + self.remote_hits
        total = hits + self.misses
        return {"hits": self.hits, "remote_hits": self.remote_hits, "misses": self.misses,
                "hit_rate": hits / total if total else 0.0}


class CacheServer:
    """The run's shared compile cache (a Ray actor): key -> {suffix: bytes}, oldest dropped first."""

    def __init__(self, max_bytes: int = 2 << 30):
        self.entries: OrderedDict[str, dict[str, bytes]] = OrderedDict()
        self.max_bytes = max_bytes
        self.bytes = 0
        self.gets = 0
        self.served = 0
        self.puts = 0

    def get(self, key: str) -> dict[str, bytes] | None:
        self.gets += 1
        entry = self.entries.get(key)
        if entry is not None:
            self.served += 1
            self.entries.move_to_end(key)
        return entry

    def put(self, key: str, suffix: str, data: bytes) -> None:
        self.puts += 1
        entry = self.entries.setdefault(key, {})
        self.bytes += len(data) - len(entry.get(suffix, b""))
        entry[suffix] = data
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, old = self.entries.popitem(last=False)
            self.bytes -= sum(len(v) for v in old.values())

    def stats(self) -> dict:
        return {"entries": len(self.entries), "bytes": self.bytes, "gets": self.gets, "served": self.served,
                "puts": self.puts}
