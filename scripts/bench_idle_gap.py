"""Does an idle host gap before each timed call slow a model? KernelBench's trial (sync, L2 flush,
events around one call), 100 trials per row, with nothing, a 2 ms sleep, or a 2 ms spin before
each trial; each row twice. Why it matters: the candidate's calls each wait on the wire to its
runner, so a judge that times the reference back to back measures the two sides unlike.

    python scripts/bench_idle_gap.py PATH/KernelBench/level3/9_ResNet18.py [more problem files]
"""
import importlib.util
import sys
import time

import torch


def load(path: str):
    spec = importlib.util.spec_from_file_location("problem", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mean_trial_ms(model, xs, gap: str, trials: int = 100) -> float:
    flush = torch.empty(32 << 20, dtype=torch.int64, device="cuda")
    out = []
    for _ in range(trials):
        torch.cuda.synchronize()
        if gap == "sleep":
            time.sleep(0.002)
        elif gap == "spin":
            t = time.perf_counter()
            while time.perf_counter() - t < 0.002:
                pass
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush.fill_(42)
        start.record()
        model(*xs)
        stop.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(stop))
    return sum(out) / len(out)


def main(paths: list[str]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    gaps = ("none", "sleep", "spin")
    print(f"{'problem':40s} " + " ".join(f"{g + ' ms (2 runs)':>22s}" for g in gaps))
    for path in paths:
        m = load(path)
        torch.manual_seed(0)
        xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in m.get_inputs()]
        model = m.Model(*m.get_init_inputs()).cuda().eval()
        with torch.no_grad():
            for _ in range(5):
                model(*xs)
            rows = {g: [] for g in gaps}
            for _ in range(2):
                for g in gaps:
                    rows[g].append(mean_trial_ms(model, xs, g))
        print(f"{path.split('/')[-1][:40]:40s} " + " ".join(f"{rows[g][0]:10.4f} {rows[g][1]:10.4f} " for g in gaps),
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
