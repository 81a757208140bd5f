"""Verdict parity with robust-kbench itself: run the suite's own correctness code (its
`cuda_correct`, from a robust-kbench checkout on PYTHONPATH) on kernels, one process per kernel
with its own TORCH_EXTENSIONS_DIR, and print its verdict beside kfray's.

    PYTHONPATH=PATH/robust-kbench python scripts/rkb_parity.py --root PATH/robust-kbench \
        tasks/layernorm:backward:tasks/layernorm/backward.cu ...

Each argument is TASK_DIR:DIRECTION:KERNEL, relative to --root; single configuration mode,
atol = rtol = 1e-3 (run_kernel.py's defaults), 5 trials.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

SUITE = r"""
import json, os, sys, types
root, task_dir, direction, kernel = sys.argv[1:5]
# The package's __init__ pulls in its profilers (pycuda); its correctness code needs none of them.
pkg = types.ModuleType("robust_kbench")
pkg.__path__ = [os.path.join(root, "robust_kbench")]
sys.modules["robust_kbench"] = pkg
from torch.utils.cpp_extension import load
from robust_kbench.kernel_task import KernelTask
from robust_kbench.sandbox.correct_forward_fn import check_forward_correctness
from robust_kbench.sandbox.correct_backward_fn import check_backward_correctness
task = KernelTask(task_dir, forward=direction == "forward")
try:
    # as robust_kbench/primitives/*/cuda_correct.py builds and checks
    ext = load(name=task.task_name, sources=[kernel], extra_cuda_cflags=["-O3", "--use_fast_math"],
               with_cuda=True, verbose=False)
    correct, max_diff = True, 0.0
    for init, inp in zip(task.get_init_settings(), task.get_input_settings()):
        if direction == "forward":
            r = check_forward_correctness(task.model, task.forward_fn, ext.forward, task.get_inputs, inp, init,
                                          num_correct_trials=5, rtol=1e-3, atol=1e-3)
        else:
            r = check_backward_correctness(task.model, task.forward_fn, task.autograd_fn, ext.backward,
                                           task.get_inputs, inp, init, num_correct_trials=5, rtol=1e-3, atol=1e-3)
        correct, max_diff = correct and r.correct, max(max_diff, r.max_diff)
    res = {"correct": correct, "max_diff": max_diff}
except Exception as e:
    res = {"correct": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
print("RESULT " + json.dumps(res, default=str))
"""


def suite_verdict(root: str, task: str, direction: str, kernel: str) -> dict:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(prefix="rkb_ext_")}
    p = subprocess.run([sys.executable, "-c", SUITE, root, os.path.join(root, task), direction,
                        os.path.join(root, kernel)], capture_output=True, text=True, env=env, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"correct": False, "error": (p.stderr or p.stdout)[-400:]}


def kfray_verdict(root: str, task: str, direction: str, kernel: str) -> dict:
    from kfray.verify import verify

    ref = f"rkb:{os.path.join(root, task)}" + ("#backward" if direction == "backward" else "")
    res, _ = verify(ref, os.path.join(root, kernel), "torch_ext_cuda", ["eval.suite_perf_trials=50"])
    return {"correct": res.correct, "tier": res.tier, "reason": res.reason[:300],
            "max_diff": res.facts.get("suite", {}).get("max_diff")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--suite-only", action="store_true", help="robust-kbench's verdicts only")
    ap.add_argument("kernels", nargs="+")
    args = ap.parse_args()
    jobs = [k.split(":") for k in args.kernels]
    with ThreadPoolExecutor(len(jobs)) as pool:
        suite = list(pool.map(lambda j: suite_verdict(args.root, *j), jobs))
    print(f"{'task':28s} {'direction':9s} {'robust-kbench':14s} {'kfray':6s}  details")
    for (task, direction, kernel), s in zip(jobs, suite):
        k = {"correct": "-", "reason": ""} if args.suite_only else kfray_verdict(args.root, task, direction, kernel)
        print(f"{os.path.basename(task):28s} {direction:9s} {str(s.get('correct')):14s} {str(k['correct']):6s}  "
              f"suite max_diff {s.get('max_diff')} {s.get('error', '')[:120]} | kfray: {k['reason'][:160]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
