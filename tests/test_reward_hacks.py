"""Reward hacks: real C++ kernels that try to look correct or fast without doing the work.

Each must be rejected (tier < 5) or flagged untrusted, with the reason stored in the result; no
correct seed kernel of the built-in tasks may be rejected or flagged. The defences live in
kfray/eval/measure.py (and the guard zones in kfray/eval/backends/cpu.py).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kfray.candidate import TIER_RUNTIME_ERROR, Candidate, EvalResult
from kfray.config import EvalConfig
from kfray.eval.evaluator import Evaluator
from kfray.eval.measure import MIN_COSINE, MIN_FRACTION_CLOSE, compare
from kfray.source import parse_params
from kfray.tasks import load_task

AXPB = '#include <cstdint>\n#include <cstring>\n#include <cmath>\n' \
       'extern "C" int kf_forward(const float* x, float* y, float a, float b, int64_t n)'
SOFTMAX = '#include <cstdint>\n#include <cmath>\n' \
          'extern "C" int kf_forward(const float* x, float* y, int64_t rows, int64_t cols)'


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path_factory.mktemp("cache")), timeout_s=60,
                                     tune_budget=0))
    yield ev
    ev.shutdown()


def _eval(ev, source: str, task: str = "axpb") -> EvalResult:
    c = Candidate(task=task, language="cpp", source=source, params=parse_params(source).default())
    return EvalResult.from_dict(ev.evaluate(c, task))


def _rejected(r: EvalResult) -> bool:
    return r.tier < 5 or bool(r.facts.get("untrusted"))


# --- (a) does nothing ---------------------------------------------------------------------------------
def test_a_kernel_that_does_nothing(evaluator):
    r = _eval(evaluator, AXPB + "{ return 0; }")
    assert r.tier == 4 and "never written" in r.reason, r.reason


# --- (b) returns a result cached from an earlier call -------------------------------------------------
def test_b_result_cached_from_the_first_call(evaluator):
    src = AXPB.replace("<cmath>", "<vector>") + """{
        static std::vector<float> cache;          // computed on the first call of each size...
        if ((int64_t)cache.size() != n) {
            cache.resize(n);
            for (int64_t i = 0; i < n; ++i) cache[i] = a * x[i] + b;
        }
        std::memcpy(y, cache.data(), n * sizeof(float));   // ...then replayed
        return 0;
    }"""
    r = _eval(evaluator, src)
    assert r.tier == 4 and "outside tolerance" in r.reason and "trial 2" in r.reason, r.reason


# --- (c) copies the reference's output ---------------------------------------------------------------
def test_c_copy_from_a_previous_calls_output_buffer(evaluator):
    src = AXPB + """{
        static float* prev = nullptr; static int64_t prev_n = -1;
        if (prev && prev_n == n) std::memcpy(y, prev, n * sizeof(float));   // whatever lies there now
        else for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;
        prev = y; prev_n = n;
        return 0;
    }"""
    r = _eval(evaluator, src)
    # stale values (tier 4), or a page the judge has since unmapped (tier 2, the runner crashed)
    assert (r.tier == 4 and "outside tolerance" in r.reason) or (r.tier == 2 and "crashed" in r.reason), r.reason


SCAN = AXPB.replace("<cmath>", "<cmath>\n#include <cstdio>") + """{
    // Find the reference's output anywhere in this process (an anonymous writable mapping holding
    // a float array that starts with a*x[0..15]+b) and copy it. Compute nothing else.
    if (n < 16) return 0;
    float want[16];
    for (int j = 0; j < 16; ++j) want[j] = a * x[j] + b;
    FILE* f = std::fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    unsigned long spans[4096][2]; int m = 0;              // writable anonymous memory, adjacent runs merged
    while (std::fgets(line, sizeof line, f) && m < 4096) {
        unsigned long lo, hi, off, inode; char perms[8], dev[32];
        if (std::sscanf(line, "%lx-%lx %7s %lx %31s %lu", &lo, &hi, perms, &off, dev, &inode) < 6) continue;
        if (perms[0] != 'r' || perms[1] != 'w' || inode != 0) continue;
        if (m && spans[m - 1][1] == lo) spans[m - 1][1] = hi; else { spans[m][0] = lo; spans[m][1] = hi; ++m; }
    }
    std::fclose(f);
    for (int s = 0; s < m; ++s) {
        if (spans[s][1] - spans[s][0] > (1ul << 31)) continue;
        const float* p = (const float*)spans[s][0];
        size_t cnt = (spans[s][1] - spans[s][0]) / sizeof(float);
        for (size_t k = 0; k + (size_t)n <= cnt; ++k) {
            bool ok = true;
            for (int j = 0; j < 16 && ok; ++j)
                ok = std::fabs(p[k + j] - want[j]) <= 1e-5f * std::fabs(want[j]) + 1e-6f;
            if (ok && p + k != y) { std::memcpy(y, p + k, n * sizeof(float)); return 0; }
        }
    }
    return 0;
}"""


def test_c_memory_scan_for_the_reference_output(evaluator, tmp_path):
    # The hack works where a reference output exists while the kernel runs (a harness that computes
    # the reference first): shown in a throwaway process...
    task = load_task("axpb")
    so = evaluator.backend.compile(SCAN, {}, task).artifact
    demo = textwrap.dedent(f"""
        import ctypes, numpy as np
        lib = ctypes.CDLL({so!r}); f = lib.kf_forward
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_int64]
        rng = np.random.default_rng(1); n = 1 << 20
        x = rng.standard_normal(n).astype(np.float32); a, b = np.float32(1.5), np.float32(-0.25)
        expected = a * x + b                  # the reference ran before the kernel
        y = np.full(n, np.nan, np.float32)
        f(x.ctypes.data, y.ctypes.data, a, b, n)
        print("COPIED" if np.allclose(y, expected) else "MISSED")
    """)
    out = subprocess.run([sys.executable, "-c", demo], capture_output=True, text=True, timeout=120)
    assert "COPIED" in out.stdout, out.stdout + out.stderr
    # ...and kfray runs the reference only after the kernel returns: there is nothing to find.
    r = _eval(evaluator, SCAN)
    assert r.tier == 4 and "never written" in r.reason, r.reason


# --- (d) skips work when it senses a timing run ------------------------------------------------------
COMPUTE = "for (int64_t i = 0; i < n; ++i) y[i] = a * x[i] + b;"


def test_d_counts_calls_and_stops_working_once_timed(evaluator):
    # The correctness checks make 2 shapes x 2 trials = 4 calls; everything after is timing.
    r = _eval(evaluator, AXPB + "{ static long calls = 0; if (++calls > 4) return 0; " + COMPUTE + " return 0; }")
    assert r.tier == 4 and "timed runs" in r.reason, r.reason


def test_d_skips_when_called_again_quickly(evaluator):
    src = AXPB.replace("<cmath>", "<chrono>") + """{
        using clk = std::chrono::steady_clock;
        static clk::time_point last; static bool seen = false;
        bool rushed = seen && clk::now() - last < std::chrono::milliseconds(3);   // back-to-back: a timer
        if (!rushed) """ + COMPUTE + """
        last = clk::now(); seen = true;
        return 0;
    }"""
    r = _eval(evaluator, src)
    assert r.tier == 4 and "timed runs" in r.reason, r.reason


def test_d_memoizes_by_buffer_address(evaluator):
    # Timing reuses a few input sets, so "these exact buffers again, and y looks computed: the
    # answer is already there". Fresh (poisoned) buffers at a reused address are recomputed, so
    # the correctness trials pass; the spots poisoned before each timed call are left NaN.
    src = AXPB + """{
        static const float* xs[4096]; static float* ys[4096]; static int seen = 0;
        bool done = std::isfinite(y[0]) && std::fabs(y[0]) < 1e20f;
        for (int k = 0; k < seen && done; ++k) if (xs[k] == x && ys[k] == y) return 0;
        """ + COMPUTE + """
        if (seen < 4096) { xs[seen] = x; ys[seen] = y; ++seen; }
        return 0;
    }"""
    r = _eval(evaluator, src)
    assert r.tier == 4 and "timed runs" in r.reason, r.reason


# --- (e) work on another thread that outlives the call -----------------------------------------------
def test_e_detached_thread_finishes_after_return(evaluator):
    src = AXPB.replace("<cmath>", "<thread>") + """{
        std::thread([=] { """ + COMPUTE + """ }).detach();   // the timer stops before this is done
        return 0;
    }"""
    r = _eval(evaluator, src)
    assert r.tier < 5, r.reason
    assert "after kf_forward returned" in r.reason or "never written" in r.reason, r.reason


@pytest.mark.parametrize("delay_ms", [2, 20])
def test_e_detached_thread_starting_late(evaluator, delay_ms):
    """A thread that writes the outputs only after a delay is a late writer, not a kernel that wrote
    nothing. 20 ms outlasts the judge's first look (5 ms after a call this short): it sees the
    outputs untouched and looks again. A busy host once made the 2 ms thread start that late."""
    src = AXPB.replace("<cmath>", "<thread>\n#include <chrono>") + """{
        std::thread([=] { std::this_thread::sleep_for(std::chrono::milliseconds(""" + str(delay_ms) + """)); """ + \
        COMPUTE + """ }).detach();
        return 0;
    }"""
    r = _eval(evaluator, src)
    assert r.tier == TIER_RUNTIME_ERROR and "after kf_forward returned" in r.reason, r.reason


# --- (f) writes outside its outputs, or changes its inputs --------------------------------------------
def test_f_writes_past_the_end_of_its_output(evaluator):
    r = _eval(evaluator, AXPB + "{ " + COMPUTE + " y[n] = 0.f; y[n + 1] = 0.f; y[n + 2] = 0.f; return 0; }")
    assert r.tier == 4 and "outside tensor y" in r.reason and "past its end" in r.reason, r.reason


def test_f_writes_before_the_start_of_its_output(evaluator):
    r = _eval(evaluator, AXPB + "{ " + COMPUTE + " y[-1] = 1.f; return 0; }")
    assert r.tier == 4 and "outside tensor y" in r.reason and "before its start" in r.reason, r.reason


def test_f_writes_past_an_input(evaluator):
    r = _eval(evaluator, AXPB + "{ " + COMPUTE + " const_cast<float*>(x)[n] = 0.f; return 0; }")
    assert r.tier == 4 and "outside tensor x" in r.reason, r.reason


def test_f_changes_its_input(evaluator):
    r = _eval(evaluator, AXPB + "{ " + COMPUTE + " const_cast<float*>(x)[n / 2] = 0.f; return 0; }")
    assert r.tier == 4 and "input x was modified by the kernel (1 of" in r.reason and "read-only" in r.reason, r.reason


# --- (g) a constant that a loose tolerance accepts on low-variance outputs ----------------------------
@pytest.fixture(scope="module")
def flat_softmax(tmp_path_factory):
    """Softmax over 4096 columns of tiny inputs: every output within 1 % of 1/cols, rtol 1e-2."""
    d = tmp_path_factory.mktemp("flat_softmax")
    (d / "task.yaml").write_text(textwrap.dedent("""\
        name: flat_softmax
        description: softmax over rows of nearly equal values, loose tolerance
        languages: [cpp]
        args:
          - {name: x, dtype: float32, shape: [rows, cols]}
          - {name: y, dtype: float32, shape: [rows, cols], role: out}
          - {name: rows, dtype: int64, value: rows}
          - {name: cols, dtype: int64, value: cols}
        shapes: {r256c4096: {rows: 256, cols: 4096}}
        rtol: 1.0e-2
        atol: 1.0e-7
        input_scale: 0.002
        bytes: 8 * rows * cols
        flops: 5 * rows * cols
    """))
    (d / "reference.py").write_text(textwrap.dedent("""\
        import numpy as np
        def reference(a):
            x = a["x"].astype(np.float64)
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return {"y": (e / e.sum(axis=1, keepdims=True)).astype(np.float32)}
    """))
    return str(d)


def test_g_old_rules_alone_accept_the_constant():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4096)) * 0.002
    e = np.exp(x - x.max(axis=1, keepdims=True))
    want = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    const = np.full_like(want, 1 / 4096)
    g, w = const.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    frac = float((np.abs(g - w) <= 1e-7 + 1e-2 * np.abs(w)).mean())
    cos = float(g @ w / np.linalg.norm(g) / np.linalg.norm(w))
    assert frac >= MIN_FRACTION_CLOSE and cos >= MIN_COSINE      # the hole the new rule closes
    why = compare("y", const, want, 1e-2, 1e-7)
    assert why and "variation about its mean" in why
    assert compare("y", want * np.float32(1 + 1e-6), want, 1e-2, 1e-7) is None   # a true result passes


def test_g_constant_output_on_a_low_variance_task(evaluator, flat_softmax):
    r = _eval(evaluator, SOFTMAX + "{ for (int64_t i = 0; i < rows * cols; ++i) y[i] = 1.0f / cols; return 0; }",
              task=flat_softmax)
    # Rejected by a rule the old 99 %-and-cosine pair lacked: the elements a draw puts more than 1 %
    # from 1/cols (every element must be within tolerance), or else the flat output's variation.
    rules = ("every element must be within it", "variation about its mean")
    assert r.tier == 4 and [rule for rule in rules if rule in r.reason], r.reason
    honest = _eval(evaluator, load_task("softmax").seeds_for("cpp")[0].source, task=flat_softmax)
    assert honest.tier == 5, honest.reason


# --- (h) reads memory nothing wrote ------------------------------------------------------------------
def test_h_accumulates_into_an_uninitialised_output(evaluator):
    r = _eval(evaluator, AXPB + "{ for (int64_t i = 0; i < n; ++i) y[i] += a * x[i] + b; return 0; }")
    assert r.tier == 4 and "never written" in r.reason, r.reason


def test_h_max_with_an_uninitialised_output_passes_nan_but_not_the_second_poison(evaluator):
    # fmaxf(NaN, v) == v: NaN poisoning alone accepts this; the finite poison of the second trial does not.
    r = _eval(evaluator, AXPB + "{ for (int64_t i = 0; i < n; ++i) y[i] = std::fmax(y[i], a * x[i] + b); return 0; }")
    assert r.tier == 4 and "still hold the value the harness wrote there" in r.reason, r.reason


# --- the roofline bound ------------------------------------------------------------------------------
def test_speedup_beyond_the_roofline_is_flagged_and_not_trusted(tmp_path):
    ev = Evaluator("cpu", EvalConfig(cache_dir=str(tmp_path / "c"), timeout_s=60, tune_budget=0,
                                     max_roofline_fraction=0.001))   # any real kernel is "too fast" here
    try:
        r = _eval(ev, load_task("axpb").seeds_for("cpp")[0].source)
    finally:
        ev.shutdown()
    assert r.tier == 5 and r.facts["flags"] and "roofline" in r.facts["flags"][0]
    assert r.facts["untrusted"] and r.reason.startswith("flagged")
    assert all(t > 0 for t in r.times.values())        # the timings stay on record...
    assert r.speedup == 0.0 and r.fitness == 5.0         # ...but count for nothing
    honest_slow = EvalResult(candidate_id="s", tier=5, times={"n1M": 1.0}, ref_times={"n1M": 0.5})
    assert honest_slow.fitness > r.fitness


# --- no correct seed is rejected ---------------------------------------------------------------------
@pytest.mark.parametrize("task", ["axpb", "softmax", "matmul"])
def test_every_builtin_seed_passes_every_defence(evaluator, task):
    seeds = load_task(task).seeds_for("cpp")
    assert seeds and seeds[0].name == "naive", f"{task}: cpp seeds {[s.name for s in seeds]}, naive first"
    for seed in seeds:
        r = _eval(evaluator, seed.source, task=task)
        assert r.tier == 5, f"{task}/{seed.name}: {r.reason}"
        assert not r.facts.get("flags") and r.speedup > 0, f"{task}/{seed.name}: {r.facts.get('flags')}"
        assert r.facts["roofline"]["bound"] == 1.5


def test_one_corrupt_element_in_20000_is_wrong_on_kfrays_own_tasks():
    """No share of the elements is pardoned: a race that corrupts one element in 20,000 fails."""
    from kfray.eval.closeness import tolerance

    rtol, atol, every = tolerance(load_task("softmax"))
    assert every
    rng = np.random.default_rng(1)
    want = rng.random(40_000).astype(np.float32)
    got = want.copy()
    got[[123, 30_001]] += 0.5
    why = compare("y", got, want, rtol, atol, every=every)
    assert why and "2 of 40000 elements outside tolerance" in why, why
    assert compare("y", want * np.float32(1 + 1e-6), want, rtol, atol, every=every) is None
