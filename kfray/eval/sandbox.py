"""The sandbox: the judge process and, under it, one fresh runner process per candidate.

The judge (this module's worker) makes the inputs, runs and times the reference, and compares
outputs; it never loads a candidate. The candidate is loaded in a runner forked for it from a
clean zygote (kfray.eval.spawner): it works on buffers the judge shares with it and answers over a
data-only wire (kfray.eval.wire). The judge answers the evaluator over the same kind of wire, so
nothing that comes out of the sandbox is ever unpickled. A kernel that crashes or hangs ends its
runner; the judge reports one failed evaluation. Forms that cannot run apart yet (backends with
`Backend.split` False: SYCL) load the candidate in
the judge, which is recycled when the candidate changed its state (kfray.eval.state_check;
kfray.eval.defences lists which defences each path has).
With `eval.isolation` on (kfray.eval.isolation), judge and runners also run in their own user,
mount, network, IPC and PID namespaces: no network, the home folders and /tmp hidden, the rest
read-only; as its PID namespace's init the judge kills whatever a kernel left running once each
job is done.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import traceback

from kfray.candidate import TIER_RUNTIME_ERROR
from kfray.eval import isolation, wire
from kfray.eval.compile_cache import default_root
from kfray.eval.fastcheck import ensure_built
from kfray.eval.isolation import scrubbed_env  # noqa: F401  (kfray.eval.sandbox.scrubbed_env, as before)
from kfray.eval.spawner import end_strays


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


def _worker_main(sock: socket.socket, backend_name: str, cfg, memory_mb: int) -> None:
    """The judge's loop: per job, a fresh runner for the candidate, the checks and timing here."""
    from kfray.eval.spawner import Spawner, limit_memory, not_dumpable

    spawner = None
    torch_form = backend_name.startswith("torch_ext")
    if _splits(backend_name):        # before any device, OpenMP pool or thread exists in this process
        import numpy  # noqa: F401  (imported once, here: the zygote is forked with it)
        if torch_form:
            import torch  # noqa: F401  (an import starts no thread pool and no CUDA context)
        spawner = Spawner([], memory_mb)
    not_dumpable()
    limit_memory(memory_mb)
    _die_with_parent()
    from kfray.eval.backends.base import get_backend
    from kfray.eval.shared import Arena
    from kfray.tasks import load_task

    backend = get_backend(backend_name, cfg)
    backend.open_device()
    warm = getattr(backend, "warm_request", None)
    if spawner is not None and warm is not None:
        from kfray.eval.spares import Spares
        spawner.spares = Spares(spawner, warm())
    arena = Arena()
    wire.send(sock, {"ready": True})
    while True:
        try:
            job = wire.recv(sock)
        except (EOFError, OSError, wire.WireError):
            return
        if job.get("op") == "exit":
            return
        seq = job.pop("seq", None)
        def extend(seconds: float, seq=seq) -> None:        # a slow reference: more time for this job
            wire.send(sock, {"extend_s": float(seconds), "seq": seq})

        job["extend"] = extend
        result = _run_one(backend, spawner, arena, job, load_task)
        spares = getattr(spawner, "spares", None)
        end_strays(spawner.pid if spawner else 0, spares.pids() if spares is not None else frozenset())
        try:
            wire.send(sock, {**result, "seq": seq})
        except (TypeError, ValueError, wire.WireError) as e:
            wire.send(sock, {"tier": TIER_RUNTIME_ERROR, "reason": f"the judge's result could not be sent ({e})",
                             "seq": seq})


SETUP_ALLOWANCE_S = 120.0
# The judge's allocator never splits a block over this size, so such a tensor is alone in its
# allocation and a runner can be given its IPC handle as it is; smaller ones are shared as copies
# from a pool of their own (kfray.eval.tensor_wire.export_tensor).
JUDGE_ALLOC_CONF = "max_split_size_mb:64"
# glibc's heap, held steady in the judge (and the runners it forks): a reference that allocates its result
# and temporaries on every call (numpy's a * x + b, 4 MiB each) had them mapped afresh and the heap trimmed
# after every call, so each call paid ~1,000 page faults: axpb's numpy reference took 4.0 ms at n = 1M
# instead of 0.42 ms, 7.1 instead of 2.6 ms at 4M, and every CPU speedup over such a reference was inflated
# by that much. Below 32 MiB (glibc's ceiling for this setting) blocks come from the heap, kept, not trimmed.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def _splits(backend_name: str) -> bool:
    from kfray.eval.backends.base import backend_class

    return bool(getattr(backend_class(backend_name), "split", False))


def _run_one(backend, spawner, arena, job: dict, load_task) -> dict:
    """One candidate: loaded in its own runner (or, for a form that cannot split, here, with this
    judge recycled if the candidate changed its state), then checked and timed."""
    from kfray.eval.remote import RunnerFailed
    from kfray.eval.spares import new_runner
    from kfray.eval.state_check import changes, fingerprint, tampered
    from kfray.tasks.suite_spec import suite_task

    runner = fn = None
    t0 = job["started"] = time.perf_counter()
    if spawner is not None and job.get("extend") and job.get("call_deadline_s"):
        # Loading the task here and the candidate in its runner is not the kernel's time (the runner's
        # requests have deadlines of their own); the kernel's limit starts once both are loaded.
        job["extend"](float(job["call_deadline_s"]) + SETUP_ALLOWANCE_S)
    try:
        task = suite_task(job["suite_task"]) if job.get("suite_task") else load_task(job["task_ref"])
        loads = {"load_task": time.perf_counter() - t0}
        if spawner is not None:
            runner = new_runner(spawner, float(job.get("call_deadline_s", 600.0)))
            loads["runner_start"] = time.perf_counter() - t0 - sum(loads.values())
            try:
                fn = backend.load_remote(runner, arena, job["artifact"], task)
            finally:                          # the next job's runners, forked now (kfray.eval.spares)
                if getattr(spawner, "spares", None) is not None:
                    spawner.spares.refill()
            if fn is None:                    # this task's form cannot run apart yet
                runner.close()
                runner = None
        in_judge = fn is None
        if in_judge:                          # fingerprinted first: what it changes recycles this judge
            before = fingerprint()
            fn = backend.load(job["artifact"], task)
        if job.get("extend") and job.get("call_deadline_s"):   # loading is not the kernel's time
            job["extend"](time.perf_counter() - t0 + float(job["call_deadline_s"]))
        loads["load_kernel"] = time.perf_counter() - t0 - sum(loads.values())
        result = backend.run_job(fn, task, job)     # below: the judge's own stages, beside the job's
        result.setdefault("stage_seconds", {}).update({k: round(v, 4) for k, v in loads.items()})
        if runner is not None:
            result.setdefault("facts", {})["runner_round_trip_us"] = round(runner.round_trip[0] * 1e6, 1)
            result["facts"]["runner_forked_ahead"] = runner.spare
        elif getattr(backend, "split_note", None):    # this machine cannot run the form apart
            result.setdefault("facts", {})["in_judge_because"] = backend.split_note
        if in_judge:
            changed = changes(before, fingerprint(), lambda m: m.startswith(("kf_ext_", "kfray_user_")))
            if changed:
                result["recycle"] = True
                result.setdefault("facts", {})["state_changed"] = changed[:5]
            if tampered(changed):
                result = {"tier": TIER_RUNTIME_ERROR, "recycle": True, "facts": {"state_changed": changed[:5]},
                          "reason": f"the kernel changed the judge's state while it was judged ({tampered(changed)[0]}): "
                                    "its verdict is void [kfray rule: state check]"}
    except RunnerFailed as e:
        result = {"tier": TIER_RUNTIME_ERROR, "reason": str(e)}
    except MemoryError:
        result = {"tier": TIER_RUNTIME_ERROR, "reason": "out of memory in the sandbox", "recycle": True}
    except Exception as e:  # the kernel's failure, reported as one evaluation
        sticky = backend.check_sticky_error()
        result = {"tier": TIER_RUNTIME_ERROR, "recycle": bool(sticky) or runner is None,
                  "reason": sticky or f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=2)[-800:]}"}
    finally:
        if runner is not None:
            t_end = time.perf_counter()
            runner.close()
            for gone in (getattr(fn, "runner_gone", None), getattr(backend, "runner_gone", None)):
                if gone is None:
                    continue
                try:                                  # device memory it had open may be freed now
                    gone()
                except Exception as e:                # a device that cannot free is this judge's end
                    result["recycle"] = True
                    result.setdefault("facts", {})["runner_gone_error"] = f"{type(e).__name__}: {e}"[:300]
            result.setdefault("stage_seconds", {})["unload"] = round(time.perf_counter() - t_end, 4)
    return result


class Sandbox:
    """One long-lived worker process, restarted after any crash, hang or poisoned context."""

    def __init__(self, backend_name: str, cfg, env: dict[str, str] | None = None):
        self.backend_name = backend_name
        self.cfg = cfg
        self.env = env or {}
        self.isolated = isolation.active(getattr(cfg, "isolation", "namespaces"))
        self.keep: list[str] = []        # task folders the isolated worker must see (from job refs)
        self.proc = None
        self.conn = None
        self.restarts = 0

    def _start(self) -> None:
        # A fresh interpreter (not multiprocessing), so it works inside Ray workers and scripts
        # alike; its own session, so a kill takes every thread and child it made.
        parent, child = socket.socketpair()
        env = {**scrubbed_env(os.environ), **ALLOCATOR_ENV, **self.env}
        helper = ensure_built(getattr(self.cfg, "cache_dir", None) or None)    # the checks' native helper
        if helper is not None:
            env["KFRAY_FASTCHECK_LIB"] = str(helper)
        if self.backend_name == "torch_ext_cuda":
            env["PYTORCH_CUDA_ALLOC_CONF"] = JUDGE_ALLOC_CONF
        memory_mb = self.cfg.memory_limit_mb if self.backend_name in ("cpu", "torch_ext_cpu") else 0
        cmd = [sys.executable, "-m", "kfray.eval.sandbox", str(child.fileno())]
        if self.isolated:
            # inductor compiles in-process: a pool would be killed with a kernel's strays each job
            env.update(TMPDIR="/tmp", TORCHINDUCTOR_COMPILE_THREADS="1")
            cmd = isolation.wrap(cmd, isolation.sandbox_plan(self.cfg.cache_dir or default_root(), self.keep))
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=[child.fileno()], env=env, start_new_session=True)
        child.close()
        self.proc.stdin.write(pickle.dumps((self.backend_name, self.cfg, memory_mb)))   # ours, to it
        self.proc.stdin.close()
        self.conn = parent
        try:
            ok = wire.recv(self.conn, timeout=120, max_bytes=1024).get("ready") is True
        except (OSError, EOFError, TimeoutError, wire.WireError):
            ok = False
        if not ok:
            self.kill()
            raise RuntimeError("sandbox worker did not start")

    @property
    def worker_pid(self) -> int | None:
        """The process that runs the kernels: the started one, or under isolation its one child
        (the started process waits outside the worker's PID namespace)."""
        if self.proc is None:
            return None
        if not self.isolated:
            return self.proc.pid
        try:
            kids = open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read().split()
        except OSError:
            return None
        return int(kids[0]) if kids else None

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
        job = self._visible(job)
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            self.kill()
            self._start()
        t0 = time.perf_counter()
        try:
            seq = int.from_bytes(os.urandom(6), "little")
            wire.send(self.conn, {**job, "call_deadline_s": timeout, "seq": seq})
            cap = max(timeout, float(job.get("max_timeout_s") or timeout))
            deadline = t0 + timeout
            while True:         # a judge that measured a slow reference may ask for more time, up to the cap
                out = wire.recv(self.conn, timeout=max(0.0, deadline - time.perf_counter()))
                if "extend_s" not in out:
                    break
                if out.get("seq") != seq:
                    raise wire.WireError("an answer out of turn (not the one asked for)")
                deadline = t0 + min(cap, max(timeout, wire.number(out["extend_s"], "extend_s", 0.0, 1e6)))
                timeout = deadline - t0
            result = checked_result(out, seq)
        except TimeoutError:
            self.kill()
            return {"tier": TIER_RUNTIME_ERROR, "reason": f"timeout: no result after {timeout:.0f} s "
                    "(the kernel hangs or is far too slow; eval.timeout_s raises the limit, "
                    "eval.suite_time_budget_s shortens a suite task's timing)", "recycled": True}
        except wire.WireError as e:
            self.kill()
            return {"tier": TIER_RUNTIME_ERROR, "recycled": True,
                    "reason": f"the sandbox's answer was refused unread: {e} [kfray rule: data-only wire]"}
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

    def _visible(self, job: dict) -> dict:
        """The job with its task path made absolute (the isolated worker's folder is an empty
        /tmp); a task under a hidden folder that the isolated worker cannot see yet restarts it
        with that task's folder shown (its parent, so that a suite's other tasks do not restart it
        again: a restart costs an import of torch and a new CUDA context)."""
        path, ref = _task_path(job["task_ref"])
        if path is None:
            return job
        if self.isolated and not isolation.under(path, self.keep):
            folder = isolation.folder_to_keep(path)
            if folder is not None:
                self.keep.append(folder)
                self.kill()
        return {**job, "task_ref": ref}

    def close(self) -> None:
        if self.conn is not None and self.proc is not None and self.proc.poll() is None:
            try:
                wire.send(self.conn, {"op": "exit"})
                self.proc.wait(2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _task_path(ref: str) -> tuple[str | None, str]:
    """(absolute path, ref naming it absolutely) of a task ref that names a file or folder, else (None, ref)."""
    base, at, shape_set = ref.rpartition("@")
    if not at or "/" in shape_set:
        base, at, shape_set = ref, "", ""
    head, colon, rest = base.partition(":")
    if not colon or "/" in head:
        head, colon, rest = "", "", base
    rest, hash_, direction = rest.partition("#")          # rkb:DIR#backward names DIR
    if not rest or not os.path.exists(rest):
        return None, ref
    path = os.path.realpath(rest)
    return path, f"{head}{colon}{path}{hash_}{direction}{at}{shape_set}"


_RESULT_FIELDS = {"tier": int, "reason": str, "times": dict, "ref_times": dict, "noise": (int, float),
                  "facts": dict, "stage_seconds": dict, "recycle": bool}


def checked_result(out: dict, seq: int | None = None) -> dict:
    """The judge's answer held to the result's form: the job's own sequence number, known fields
    of the right types, a tier in range, times that are numbers (a forged or broken answer is
    refused, never recorded)."""
    if seq is not None and out.pop("seq", None) != seq:
        raise wire.WireError("an answer out of turn (not the one asked for)")
    wire.fields(out, _RESULT_FIELDS, "sandbox result")
    wire.integer(out.get("tier"), "tier", 0, 5)
    for key in ("times", "ref_times", "stage_seconds"):
        for k, v in out.get(key, {}).items():
            wire.number(v, f"{key}[{k[:40]}]", 0.0, 1e7)
    return out


if __name__ == "__main__":
    _fd = int(sys.argv[1])
    _backend, _cfg, _mem = pickle.loads(sys.stdin.buffer.read())     # written by the evaluator
    _worker_main(socket.socket(fileno=_fd), _backend, _cfg, _mem)
