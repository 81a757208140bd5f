"""Diagnostic (issue 25): does a block of timed calls read differently by its place (first or
second) or by what fills the gap between calls (idle sleep, as the reference's paced calls; GPU
work, as the candidate's runner's clone and copy)? One process, the reference model against itself."""
import importlib.util, statistics, sys, time
import torch

L2 = 256 << 20
def flush():
    torch.empty(L2 // 8, dtype=torch.int64, device="cuda").fill_(42)

def load(path):
    spec = importlib.util.spec_from_file_location("p", path); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    torch.manual_seed(0)
    model = m.Model(*m.get_init_inputs()).cuda()
    xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in m.get_inputs()]
    return model, xs

def block(model, xs, n, gap, period):
    st, sp = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out, last = [], None
    t_prev = time.perf_counter()
    for _ in range(n):
        if gap == "sleep":
            until = t_prev + period
            if until - time.perf_counter() > 2e-4: time.sleep(until - time.perf_counter() - 2e-4)
            while time.perf_counter() < until: pass
        elif gap == "busy":
            c = [x.clone() for x in xs if isinstance(x, torch.Tensor)]
            if last is not None: _ = last.clone()
            torch.cuda.synchronize(); del c
            u = time.perf_counter() + 2e-4
            while time.perf_counter() < u: pass
        t_prev = time.perf_counter()
        torch.cuda.synchronize(); flush()
        st.record(); last = None; last = model(*xs); sp.record(); sp.synchronize()
        out.append(st.elapsed_time(sp))
    return statistics.mean(out)

root = sys.argv[1]
names = sys.argv[2:]
with torch.no_grad():
    for nm in names:
        model, xs = load(f"{root}/{nm}")
        for _ in range(10): model(*xs)
        torch.cuda.synchronize()
        base = block(model, xs, 100, "busy", 0)
        period = 3 * base / 1e3
        seq = [("busy", 0), ("busy", 0), ("sleep", period), ("sleep", period), ("busy", 0), ("sleep", period), ("none", 0), ("none", 0)]
        res = [(g, block(model, xs, 100, g, p)) for g, p in seq]
        print(f"{nm[:34]:34s} base {base:8.3f} ms  " + "  ".join(f"{g}:{m/base:.3f}" for g, m in res), flush=True)
        del model, xs; torch.cuda.empty_cache()
