#!/usr/bin/env python3
"""Issue 26's build targets, measured: how long kfray's build of a typical KernelBench CUDA
ModelNew takes (the file imported once in a build process of its own, as the torch_ext_cuda
backend does: its `load_inline` runs nvcc and the host compiler there, for the evaluator's one GPU
architecture), one at a time and with every core building.

Each build is a different file (a constant in its kernel differs), so no build reuses another's.

    python scripts/bench_modelnew_build.py                       # 3 builds alone, then cores-wide
    python scripts/bench_modelnew_build.py --alone 5 --together 32 --workers 16

Prints the median build alone, the builds a minute with `--workers` at once, and writes JSON with --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A ModelNew as KernelBench's own example writes them: C++ declaration, CUDA kernel and a wrapper
# that takes and returns torch::Tensor, bound by load_inline.
MODELNEW = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void scaled_relu_kernel(const float* x, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        float v = x[idx] * SCALE;
        out[idx] = v > 0.f ? v : 0.f;
    }
}

torch::Tensor scaled_relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    int size = x.numel();
    const int block = 256;
    scaled_relu_kernel<<<(size + block - 1) / block, block>>>(x.data_ptr<float>(), out.data_ptr<float>(), size);
    return out;
}
"""

cpp_source = "torch::Tensor scaled_relu_cuda(torch::Tensor x);"

scaled_relu = load_inline(name="scaled_relu_NAME", cpp_sources=cpp_source, cuda_sources=cuda_source,
                          functions=["scaled_relu_cuda"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.op = scaled_relu

    def forward(self, x):
        return self.op.scaled_relu_cuda(x)
'''


def one_build(i: int, work: Path, arch: str) -> float:
    from kfray.eval.backends.torch_ext import _MODELNEW_BUILD

    d = work / f"b{i}"
    d.mkdir()
    src = d / "model_new.py"
    src.write_text(MODELNEW.replace("SCALE", f"{1 + i / 1000:.4f}f").replace("NAME", str(i)))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _MODELNEW_BUILD, str(src), str(d / "out.py"), str(d / "ext"), arch],
                       capture_output=True, text=True)
    s = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"build {i} failed:\n{(p.stdout + p.stderr)[-2000:]}")
    print(f"  build {i}: {s:.1f} s", flush=True)
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alone", type=int, default=3, help="builds one at a time (the median is reported)")
    ap.add_argument("--together", type=int, default=-1, help="builds with --workers at once (default 2x workers; 0: none)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--arch", default="", help="TORCH_CUDA_ARCH_LIST (default: the GPU's own, as the backend does)")
    ap.add_argument("--out", help="JSON to write")
    a = ap.parse_args()
    arch = a.arch
    if not arch:
        try:
            import torch
            major, minor = torch.cuda.get_device_capability(0)
            arch = f"{major}.{minor}"
        except Exception:        # no GPU here: torch's own default
            arch = ""
    together = 2 * a.workers if a.together < 0 else a.together
    with tempfile.TemporaryDirectory(prefix="kfray-mnb-") as tmp:
        work = Path(tmp)
        alone = [one_build(i, work, arch) for i in range(a.alone)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(a.workers) as pool:
            many = list(pool.map(lambda i: one_build(i, work, arch), range(a.alone, a.alone + together)))
        wall = max(time.perf_counter() - t0, 1e-9)
        many = many or [0.0]
    out = {"cores": os.cpu_count(), "arch": arch or "torch default", "alone_s": [round(s, 2) for s in alone],
           "alone_median_s": round(statistics.median(alone), 2) if alone else None, "workers": a.workers, "together": together,
           "together_wall_s": round(wall, 1), "together_median_s": round(statistics.median(many), 2),
           "builds_per_minute": round(60 * together / wall, 1)}
    print(f"KernelBench-style CUDA ModelNew builds, kfray's build step, {out['cores']} cores, arch {out['arch']}")
    if alone:
        print(f"  alone:    median {out['alone_median_s']} s over {a.alone} builds {out['alone_s']}  (target <= 10 s)")
    if together:
        print(f"  together: {together} builds on {a.workers} workers in {out['together_wall_s']} s: "
              f"{out['builds_per_minute']} a minute (target >= 60), median {out['together_median_s']} s each")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
