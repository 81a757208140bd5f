"""Where a PyTorch-extension build's time goes (issue 26), measured on this machine, one build at a
time, each from a cold folder:

- `load_inline` as a suite's file runs it (a fresh process; TORCH_EXTENSIONS_DIR empty): the
  Python and torch import, then each ninja edge (the host pass of main.cpp, the .cu, the link)
  from ninja's own log, and ninja's overhead (its wall time less its edges);
- kfray's build of the same source in the extension form (g++ with a precompiled
  torch/extension.h): the precompiled header's one-time build, a build that uses it, and a build
  into another cache that reuses it;
- with --cuda and nvcc on PATH: nvcc's phases on a CUDA source (`nvcc --time`: the host
  preprocessing, cudafe, cicc, ptxas, fatbinary and the host compile), with and without
  torch/types.h (the header load_inline puts ahead of every .cu).

    python scripts/bench_build.py            # the CPU rows (2 cores: a few minutes)
    python scripts/bench_build.py --cuda     # and nvcc's phases (compile only: no GPU needed)
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXTENSION = """#include <torch/extension.h>

torch::Tensor forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    float* b = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"""
CUDA_KERNEL = """
__global__ void relu_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
void relu(const float* x, float* y, long n) { relu_kernel<<<(n + 255) / 256, 256>>>(x, y, n); }
"""
PROBLEM = ROOT / "tests" / "data" / "kernelbench" / "level1" / "1_Relu.py"

LOAD_INLINE = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from torch.utils.cpp_extension import load_inline
t1 = time.perf_counter()
src = open(sys.argv[1]).read()
load_inline(name="kf_bench_inline", cpp_sources=[src], verbose=False)
print(json.dumps({"import_s": t1 - t0, "build_s": time.perf_counter() - t1}))
"""


def ninja_edges(folder: Path) -> list[tuple[str, float]]:
    """(target, seconds) of each edge in ninja's log."""
    log = folder / ".ninja_log"
    out = []
    for line in log.read_text().splitlines()[1:] if log.exists() else []:
        start, end, _, target, *_ = line.split("\t")
        out.append((target, (int(end) - int(start)) / 1e3))
    return out


def load_inline_rows(source: str) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "ext.cpp"
        src.write_text(source)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(Path(d) / "ext")}
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", LOAD_INLINE, str(src)], capture_output=True, text=True, env=env,
                           timeout=1800)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"load_inline failed:\n{p.stderr[-2000:]}")
        got = json.loads(p.stdout.strip().splitlines()[-1])
        edges = ninja_edges(Path(d) / "ext" / "kf_bench_inline")
    rows = [("load_inline: process start, Python and torch import", got["import_s"])]
    rows += [(f"load_inline: ninja edge {t}", s) for t, s in edges]
    rows.append(("load_inline: ninja, lock and loading (build less its edges)", got["build_s"] - sum(s for _, s in edges)))
    rows.append(("load_inline: whole, process included", wall))
    return rows


@contextlib.contextmanager
def environ(**values: str):
    """os.environ with these values set for the block, as it was after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def kfray_rows(source: str) -> list[tuple[str, float]]:
    from kfray.config import EvalConfig
    from kfray.eval.backends.torch_ext import TorchExtCpuBackend
    from kfray.tasks import load_task

    task = load_task(f"kernelbench:{PROBLEM}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        runs = (("the precompiled header's first build, then the extension", "a", "1"),
                ("the extension, the precompiled header reused (another cache)", "b", "1"),
                ("the extension, no precompiled header", "c", "0"))
        for label, cache, pch in runs:
            with environ(KFRAY_PCH_DIR=str(Path(d) / "pch"), KFRAY_TORCH_PCH=pch):
                be = TorchExtCpuBackend(EvalConfig(cache_dir=str(Path(d) / cache), isolation="none"))
                t0 = time.perf_counter()
                b = be.compile(source, {}, task)
                seconds = time.perf_counter() - t0
            if pch == "1" and not b.facts.get("pch"):
                label += " (no precompiled header: g++ missing or it failed)"
            rows.append((f"kfray torch_ext_cpu: {label}", seconds))
    return rows


def nvcc_rows() -> list[tuple[str, float]]:
    from kfray.eval.backends.torch_ext import torch_build_info

    info = torch_build_info()
    inc = [f"-I{p}" for p in info["includes"]]
    rows = []
    for label, prelude in (("a .cu as load_inline writes it (torch/types.h first)", "#include <torch/types.h>\n"
                            "#include <cuda.h>\n#include <cuda_runtime.h>\n"),
                           ("the same kernel, CUDA headers alone", "#include <cuda_runtime.h>\n")):
        with tempfile.TemporaryDirectory() as d:
            cu, times = Path(d) / "k.cu", Path(d) / "t.csv"
            cu.write_text(prelude + CUDA_KERNEL)
            t0 = time.perf_counter()
            p = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-Xcompiler", "-fPIC", *inc, "--time",
                                str(times), "-c", str(cu), "-o", str(Path(d) / "k.o")], capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                rows.append((f"nvcc, {label}: failed ({p.stderr.strip()[-200:]})", wall))
                continue
            phases: dict[str, float] = {}
            with open(times) as f:
                for r in csv.reader(f):    # ..., phase name, ..., metric, unit (ms)
                    if len(r) >= 3 and r[-1].strip() == "ms" and r[1].strip() != "nvcc (driver)":
                        phases[r[1].strip()] = phases.get(r[1].strip(), 0.0) + float(r[-2]) / 1e3
            rows += [(f"nvcc, {label}: {name}", s) for name, s in phases.items()]
            rows.append((f"nvcc, {label}: whole", wall))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", action="store_true", help="also nvcc's phases on a CUDA source")
    ap.add_argument("--out", help="write the rows as JSON here too")
    args = ap.parse_args(argv)
    rows = load_inline_rows(EXTENSION) + kfray_rows(EXTENSION)
    if args.cuda:
        rows += nvcc_rows()
    inline = next(s for n, s in rows if n.startswith("load_inline: whole"))
    width = max(len(n) for n, _ in rows)
    print(f"{'step (' + str(os.cpu_count()) + ' cores)':{width}s}  seconds  share of load_inline")
    for name, s in rows:
        print(f"{name:{width}s}  {s:7.2f}  {s / inline:6.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
