"""Diagnostic (issue 25): does a block of timed calls read differently by its place (first or
second) or by what fills the gap between calls (idle sleep, as the reference's paced calls; GPU
work, as the candidate's runner's clone and copy)? --order: the runner's order (clone, synchronize,
spin, flush) against the judge's (clone, synchronize, flush) and one with the flush queued behind
the clone (nosync). On the H200 the three read alike within 0.1-0.3 %, one run read nosync
0.4-0.8 % faster. One process, the reference model against itself."""
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

def block(model, xs, n, gap, period, after="", xs2=None):
    """`after`: "copy" copies each output into a slot made once, as the runner does for the judge;
    xs2: a second input set the clones alternate with, as the runner's timed calls do."""
    st, sp = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out, last, slot = [], None, None
    t_prev = time.perf_counter()
    for _ in range(n):
        if gap == "sleep":
            until = t_prev + period
            if until - time.perf_counter() > 2e-4: time.sleep(until - time.perf_counter() - 2e-4)
            while time.perf_counter() < until: pass
        elif gap in ("runner", "nosync"):   # the candidate's runner: clone, sync, spin, flush; nosync:
            c = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]   # the flush queued behind the clone
            if gap == "runner": torch.cuda.synchronize()
            u = time.perf_counter() + 2e-4
            while time.perf_counter() < u: pass
        elif gap == "judge":          # the judge's paced reference: clone, sync, flush
            c = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
        elif gap == "busy":
            src = xs2 if xs2 is not None and len(out) % 2 else xs
            c = [x.clone() if isinstance(x, torch.Tensor) else x for x in src]
            if last is not None: _ = last.clone()
            torch.cuda.synchronize()
            u = time.perf_counter() + 2e-4
            while time.perf_counter() < u: pass
        t_prev = time.perf_counter()
        if gap != "nosync":
            torch.cuda.synchronize()
        flush()
        ins = c if gap in ("busy", "runner", "nosync", "judge") else xs
        st.record(); last = None; last = model(*ins); sp.record(); sp.synchronize()
        out.append(st.elapsed_time(sp))
        if after == "copy":
            if slot is None and isinstance(last, torch.Tensor):
                slot = torch.empty_like(last)
            if slot is not None: slot.copy_(last); torch.cuda.synchronize()
    return statistics.mean(out)

args = [a for a in sys.argv[1:] if not a.startswith("--")]
root, names = args[0], args[1:]
with torch.no_grad():
    for nm in names:
        model, xs = load(f"{root}/{nm}")
        for _ in range(10): model(*xs)
        torch.cuda.synchronize()
        base = block(model, xs, 100, "busy", 0)
        period = 3 * base / 1e3
        if "--order" in sys.argv:      # the runner's order against the judge's, alternating blocks
            seq = ["judge", "runner", "nosync"] * 3
            res = [(g, block(model, xs, 100, g, 0)) for g in seq]
        elif "--variants" in sys.argv:
            xs2 = [x.clone().uniform_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
            seq = [("busy", "", None), ("busy+copy", "copy", None), ("busy+rotate", "", xs2), ("busy+both", "copy", xs2),
                   ("busy", "", None), ("busy+copy", "copy", None)]
            res = [(g, block(model, xs, 100, "busy", 0, a, x2)) for g, a, x2 in seq]
        else:
            seq = [("busy", 0), ("busy", 0), ("sleep", period), ("sleep", period), ("busy", 0), ("sleep", period),
                   ("none", 0), ("none", 0)]
            res = [(g, block(model, xs, 100, g, p)) for g, p in seq]
        print(f"{nm[:34]:34s} base {base:8.3f} ms  " + "  ".join(f"{g}:{m/base:.3f}" for g, m in res), flush=True)
        del model, xs; torch.cuda.empty_cache()
