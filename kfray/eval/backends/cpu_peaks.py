"""The CPU's ceilings, measured once per machine: copy bandwidth and fp32 FMA peak.

They are what the CPU summary reports each best against (as the GPU's measured copy bandwidth and
fp32 rate are), for the thread count the kernels get (`eval.threads`). A small C++ probe, built
once per compiler into the compile cache, measures them with OpenMP on that many threads:

- copy bandwidth: the best of a plain and a non-temporal-store copy (read + write bytes), over 4
  rotated pairs of 64 MiB arrays, so neither pair is found in the cache by the next copy;
- FMA peak: 12 independent chains of fused multiply-adds per thread, in the widest vectors the
  compiler targets (AVX-512, AVX2, else scalar).

Each figure is the best of several runs, PROBE_RUNS probes a little apart (a busy machine only
ever lowers it). The result is kept under <cache>/devices, one file per CPU model, thread count
and compiler, unless the machine was busy (the threads' FMA rate short of the thread count times
one thread's: other work held cores), when it serves that run only; a failed probe gives no figures.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from kfray.eval.native_build import build_once

PROBE = r"""
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <omp.h>
#include <unistd.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// y = x over n floats (a multiple of 16) on the OpenMP threads, plain or non-temporal stores.
static void copy_once(const float* x, float* y, long n, bool nt) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i += 16) {
#if defined(__AVX512F__)
        __m512 v = _mm512_load_ps(x + i);
        if (nt) _mm512_stream_ps(y + i, v); else _mm512_store_ps(y + i, v);
#elif defined(__AVX2__)
        __m256 v0 = _mm256_load_ps(x + i), v1 = _mm256_load_ps(x + i + 8);
        if (nt) { _mm256_stream_ps(y + i, v0); _mm256_stream_ps(y + i + 8, v1); }
        else { _mm256_store_ps(y + i, v0); _mm256_store_ps(y + i + 8, v1); }
#else
        for (int j = 0; j < 16; ++j) y[i + j] = x[i + j];
#endif
    }
#if defined(__AVX512F__) || defined(__AVX2__)
    _mm_sfence();
#endif
}

static double copy_gbps(bool nt) {
    const long n = 16L << 20, pairs = 4;                        // 64 MiB of floats per array
    float* a[pairs]; float* b[pairs];
    for (int p = 0; p < pairs; ++p) {
        a[p] = (float*)aligned_alloc(64, n * 4); b[p] = (float*)aligned_alloc(64, n * 4);
        if (!a[p] || !b[p]) return 0.0;
        std::memset(a[p], 1, n * 4); std::memset(b[p], 0, n * 4);
    }
    double best = 1e30;
    for (int r = 0; r < 3 * pairs; ++r) {
        const float* x = a[r % pairs]; float* y = b[r % pairs];
        double t0 = now();
        copy_once(x, y, n, nt);
        double t = now() - t0;
        if (r >= pairs && t < best) best = t;                   // the first round only warms up
    }
    for (int p = 0; p < pairs; ++p) { free(a[p]); free(b[p]); }
    return 2.0 * n * 4 / best / 1e9;
}

static double fma_gflops(int threads) {
#if defined(__AVX512F__)
    typedef __m512 V; const int W = 16;
#define SET(x) _mm512_set1_ps(x)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define SUM(v) _mm512_reduce_add_ps(v)
#elif defined(__AVX2__)
    typedef __m256 V; const int W = 8;
#define SET(x) _mm256_set1_ps(x)
#define FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define SUM(v) _mm256_cvtss_f32(v)
#else
    typedef float V; const int W = 1;
#define SET(x) (x)
#define FMA(a, b, c) ((a) * (b) + (c))
#define SUM(v) (v)
#endif
    const long iters = 4000000;
    double best = 1e30;
    volatile float sink = 0.f;
    for (int r = 0; r < 5; ++r) {
        double t0 = now();
        #pragma omp parallel num_threads(threads)
        {
            V acc[12];
            for (int j = 0; j < 12; ++j) acc[j] = SET(1.0f + j * 1e-3f);
            const V m = SET(0.9999999f), c = SET(1e-7f);
            for (long i = 0; i < iters; ++i) {
                #pragma GCC unroll 12
                for (int j = 0; j < 12; ++j) acc[j] = FMA(acc[j], m, c);
            }
            float s = 0.f;
            for (int j = 0; j < 12; ++j) s += SUM(acc[j]);
            #pragma omp atomic
            sink += s;
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    return 2.0 * 12 * W * iters * threads / best / 1e9;
}

// One shape's copy timed as the harness times a kernel: `sets` rotated pairs of n floats, each call
// timed on its own, `gap_us` idle between calls (the kernel's own cadence: a copy timed back to back
// keeps the memory system streaming, 1.7x the rate of one called as the harness calls a kernel on
// a 2-core VM), the median call counted (read + write bytes).
static double copy_median_gbps(long n, int sets, bool nt, long gap_us) {
    n = (n + 15) / 16 * 16;
    float** a = new float*[sets]; float** b = new float*[sets];
    for (int p = 0; p < sets; ++p) {
        a[p] = (float*)aligned_alloc(64, n * 4); b[p] = (float*)aligned_alloc(64, n * 4);
        if (!a[p] || !b[p]) return 0.0;
        std::memset(a[p], 1, n * 4); std::memset(b[p], 0, n * 4);
    }
    const int calls = sets * (60 / sets + 1);
    double* t = new double[calls];
    for (int r = -sets; r < calls; ++r) {                        // one round over the sets warms up
        const float* x = a[(r + sets) % sets]; float* y = b[(r + sets) % sets];
        double t0 = now();
        copy_once(x, y, n, nt);
        if (r >= 0) t[r] = now() - t0;
        if (gap_us > 0) usleep(gap_us);
    }
    std::sort(t, t + calls);
    double med = t[calls / 2];
    for (int p = 0; p < sets; ++p) { free(a[p]); free(b[p]); }
    delete[] a; delete[] b; delete[] t;
    return 2.0 * n * 4 / med / 1e9;
}

int main(int argc, char** argv) {
    if ((argc == 4 || argc == 5) && !std::strcmp(argv[1], "copy")) {
        long n = std::atol(argv[2]); int sets = std::atoi(argv[3]); long gap = argc == 5 ? std::atol(argv[4]) : 0;
        if (n <= 0 || sets <= 0 || gap < 0) return 2;
        printf("{\"copy_plain_gbps\": %.2f, \"copy_nt_gbps\": %.2f}\n",
               copy_median_gbps(n, sets, false, gap), copy_median_gbps(n, sets, true, gap));
        return 0;
    }
    double plain = copy_gbps(false), nt = copy_gbps(true);
    double one = fma_gflops(1), peak = fma_gflops(omp_get_max_threads());
    printf("{\"copy_plain_gbps\": %.2f, \"copy_nt_gbps\": %.2f, \"fma_peak_gflops\": %.1f, \"fma_one_gflops\": %.1f}\n",
           plain, nt, peak, one);
    return 0;
}
"""
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17"]
PROBE_RUNS = 3          # probe runs, each the best of its own rounds; the best of each figure is kept
PROBE_GAP_S = 0.5       # (a run measured 21 GB/s copy where the machine's is 36-41: other work held it)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:80]


def _probe(cxx: str, version: str, root: Path) -> Path | None:
    """The probe's executable, built once per compiler into root/native; None when it cannot be."""
    import hashlib

    key = hashlib.sha256("\0".join([version, *_FLAGS, PROBE]).encode()).hexdigest()[:16]
    folder = Path(root) / "native"
    src = folder / f"cpu_peaks-{key}.cpp"
    exe = folder / f"cpu_peaks-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not src.exists():
            src.write_text(PROBE)
    except OSError:
        return None
    return exe if build_once([cxx, *_FLAGS, str(src)], exe) else None


def _run_probe(exe: Path, threads: int, *args: str) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "false"}
    try:
        proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env)
        got = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}
    return got if got and min(got.values()) > 0 else {}


def copy_like_a_kernel(cxx: str, version: str, threads: int, root: Path, nbytes: int, sets: int,
                       gap_us: float = 0.0) -> float:
    """GB/s of a copy of one shape's footprint (nbytes read + written) timed as the harness times a
    kernel: `sets` rotated input sets, every call timed, `gap_us` idle between calls (the kernel's
    own: its facts' idle_us), the median call. A kernel's figure is its median call at the harness's
    cadence, so this is the copy it is fair to hold it against; the machine's copy bandwidth above
    is the best call of a 64 MiB copy, a ceiling no median reaches. 0.0 when it cannot run."""
    exe = _probe(cxx, version, root)
    args = [str(max(16, nbytes // 8)), str(max(1, sets))] + ([str(int(round(gap_us)))] if gap_us > 0 else [])
    got = _run_probe(exe, threads, "copy", *args) if exe else {}
    return max(got.values()) if got else 0.0


def measure(cxx: str, version: str, threads: int, root: Path) -> dict[str, Any]:
    """Run the probe (built once into root/native) on `threads` threads; {} when it cannot run."""
    exe = _probe(cxx, version, root)
    if exe is None:
        return {}
    out: dict[str, float] = {}
    for attempt in range(PROBE_RUNS):      # a ceiling: the best of runs spread over a few seconds, so
        if attempt:                        # that one moment of other work does not set it
            time.sleep(PROBE_GAP_S)
        got = _run_probe(exe, threads)
        if not got:
            return {}
        out = {k: max(v, out.get(k, 0.0)) for k, v in got.items()}
    return {"machine_copy_gbps": max(out["copy_plain_gbps"], out["copy_nt_gbps"]),
            "machine_copy_plain_gbps": out["copy_plain_gbps"], "fp32_fma_peak_gflops": out["fma_peak_gflops"],
            "peaks_threads": threads,
            # the threads' FMA rate short of threads x one thread's: other work held cores (not kept)
            "peaks_busy": out["fma_peak_gflops"] < 0.8 * threads * out["fma_one_gflops"]}


def cpu_peaks(cxx: str, version: str, cpu_name: str, threads: int, root: Path,
              measure_now: bool = True) -> dict[str, Any]:
    """The machine's measured copy bandwidth and FMA peak on `threads` threads, kept under
    root/devices: measured the first time when `measure_now` (a failed measurement is not kept),
    else {} until a run has measured them."""
    path = Path(root) / "devices" / f"cpu-{_slug(cpu_name)}-{os.cpu_count()}c-t{threads}-{_slug(version)}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    facts = measure(cxx, version, threads, root) if measure_now else {}
    if facts and not facts["peaks_busy"]:        # a busy machine's figures serve this run only
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(facts))
            os.replace(tmp, path)
        except OSError:
            pass
    return facts


def cache_root(cfg) -> Path:
    """Where an eval config's compile cache (and so the measured peaks) lives."""
    from kfray.eval.compile_cache import default_root

    return Path(cfg.cache_dir) if getattr(cfg, "cache_dir", "") else default_root()


def roofline_entry(task, times: dict[str, float], peaks: dict[str, Any],
                   same_way: dict[str, float] | None = None) -> dict[str, Any]:
    """A best's share of the machine's copy bandwidth and FMA peak, per shape and as the mean over
    shapes, with the bound the task's arithmetic intensity puts it under; {} without figures.
    `same_way` (shape -> GB/s of `copy_like_a_kernel`) adds its share of a copy of the same footprint
    timed the same way, which is then the memory bound's share (the best-call figure stays beside it)."""
    bw, peak = float(peaks.get("machine_copy_gbps") or 0), float(peaks.get("fp32_fma_peak_gflops") or 0)
    if bw <= 0 or peak <= 0 or not times:
        return {}
    per, intensity = {}, []
    for shape, t in times.items():
        if not t or t <= 0 or shape not in task.shapes:
            continue
        nbytes, flops = task.cost(shape)
        g, f = nbytes / t / 1e9, flops / t / 1e9
        per[shape] = {"gbps": round(g, 2), "gflops": round(f, 1), "of_copy_bw": round(g / bw, 3),
                      "of_fma_peak": round(f / peak, 3)}
        if (same_way or {}).get(shape, 0) > 0 and nbytes > 0:
            per[shape].update(copy_gbps_same_way=round(same_way[shape], 2), of_copy_same_way=round(g / same_way[shape], 3))
        if nbytes > 0:
            intensity.append(flops / nbytes)
    if not per:
        return {}
    mean = (lambda k: round(sum(p[k] for p in per.values()) / len(per), 3))
    bound = "memory" if intensity and sum(intensity) / len(intensity) < peak / bw else "compute"
    out = {"machine_copy_gbps": bw, "fp32_fma_peak_gflops": peak, "threads": peaks.get("peaks_threads"),
           "bound": bound, "share_of_copy_bw": mean("of_copy_bw"), "share_of_fma_peak": mean("of_fma_peak"),
           "share_of_bound": mean("of_copy_bw" if bound == "memory" else "of_fma_peak"), "per_shape": per}
    if all("of_copy_same_way" in p for p in per.values()):
        out["share_of_copy_same_way"] = mean("of_copy_same_way")
        if bound == "memory":
            out["share_of_bound"] = out["share_of_copy_same_way"]
    return out
