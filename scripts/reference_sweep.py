"""Every suite reference as its own kernel: kfray's check that its harness agrees with itself before
any model is involved (issue 25). KernelBench levels 1-3 and a robust-kbench task folder, each
problem's own reference submitted as the kernel, on one GPU or a Ray cluster:

    python scripts/reference_sweep.py --kernelbench PATH/KernelBench --rkb PATH/robust-kbench
    python scripts/reference_sweep.py --kernelbench PATH/KernelBench --levels 1 --address auto --set eval.timeout_s=60

The kernels are the seeds an offline sweep starts from (kfray.tasks.suite_form.seeds): KernelBench's
`ModelNew(Model)`, robust-kbench's `forward_fn` inside an extension; a robust-kbench backward task has
no reference in kernel form, so it runs the backward kernel the suite publishes for it, and is listed
apart where there is none. They are judged as a sweep judges them: the tasks a sweep finds
(kfray.sweep.plan), the backend it picks (torch_ext_cuda where the cluster has GPUs, one evaluator
per GPU; else torch_ext_cpu), its evaluator actors and their queue (kfray.eval.evaluator,
kfray.eval.queue), the suite's verdict with kfray's checks on top. Each problem goes to the pool as
soon as it is planned (a level of full-size models takes a minute to load), while the pool starts,
and the levels follow each other through the one pool with no pause between them.

Per level (level1, level2, level3, rkb) it prints correct / total, the time to verdict (from when
its evaluator could start it, its build done, to its result) median and max, the wall time and
problems per hour, and every problem that failed with its reason; it writes all of it, per problem
too, to
scripts/results/reference_sweep_<gpu>.json (--out FILE elsewhere). A KernelBench problem that
does not load counts as failed (the benchmark is all 250); a robust-kbench ref that does not load is
listed under `not_loaded` and not counted (the target is every ref that loads).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.errors import KfrayError  # noqa: E402
# Imported here, not in the functions that use them: the planning thread imports kfray.sweep.plan
# while the main thread starts the pool, and two threads importing the same modules at once can
# deadlock (Python raised _DeadlockError on kfray.sweep.plan in a test run).
from kfray.cluster import connect  # noqa: E402
from kfray.eval.evaluator import make_evaluators  # noqa: E402
from kfray.eval.queue import EvalQueue  # noqa: E402
from kfray.sweep.cli import gpu_evaluators_default  # noqa: E402
from kfray.sweep.plan import plan_iter  # noqa: E402
from kfray.tasks import load_task  # noqa: E402

REFERENCE_SEEDS = ("reference_module", "reference_function")
GPU_BACKENDS = ("cuda", "torch_ext_cuda")


def reference_kernel(ref: str):
    """(seed name, source) of the kernel that stands for a task's reference, or None."""
    seeds = load_task(ref).seeds_for("suite")
    for s in seeds:
        if s.name in REFERENCE_SEEDS:
            return s.name, s.source
    return (seeds[0].name, seeds[0].source) if seeds else None


def problem_name(ref: str) -> str:
    """The problem's file or folder name; under a level folder (robust-kbench's
    kernelbench/level_2/task_11) with the level, as two levels share their task names."""
    tail = ref.split(":", 1)[-1]
    path, _, direction = tail.partition("#")
    p = Path(path)
    name = f"{p.parent.name}/{p.name}" if re.fullmatch(r"level_?\d+", p.parent.name) and not p.suffix else p.name
    return name + (f"#{direction}" if direction else "")


def rkb_tasks_folder(root: Path) -> Path:
    return root / "tasks" if (root / "tasks").is_dir() else root


def plan_levels(kb_root: str | None, rkb_root: str | None, levels: list[int], wanted: str | None,
                done: set = frozenset()):
    """The sweep's own planning, one problem at a time as each loads (kfray.sweep.plan.plan_iter),
    so that the evaluators start on the first while the rest load. Yields ("level", name, entry)
    as a level begins (its entry, {"failed", "not_loaded", "no_reference"}, fills as it plans),
    ("job", name, (ref, seed name, source)) for each problem to judge, ("skipped", name, problem)
    for one judged correct before (`done`: (level, problem) pairs), and ("end", name, None)."""
    suites = [(f"level{n}", kb_root, n) for n in levels] if kb_root else []
    if rkb_root:
        suites.append(("rkb", str(rkb_tasks_folder(Path(rkb_root))), None))
    for name, root, level in suites:
        entry = {"failed": {}, "not_loaded": {}, "no_reference": {}}
        yield "level", name, entry
        try:
            for ref, why in plan_iter(root, level, wanted, "suite", offline=True):
                if why and "seed kernel" in why:
                    entry["no_reference"][problem_name(ref)] = "no reference in kernel form, and the suite publishes none"
                elif why and name == "rkb":
                    entry["not_loaded"][problem_name(ref)] = why
                elif why:
                    entry["failed"][problem_name(ref)] = f"does not load: {why}"
                elif (name, problem_name(ref)) in done:
                    yield "skipped", name, problem_name(ref)
                else:
                    kernel = reference_kernel(ref)
                    if kernel is None:
                        entry["no_reference"][problem_name(ref)] = "no reference in kernel form"
                    else:
                        yield "job", name, (ref, *kernel)
        except KfrayError as e:                   # no such level folder, --tasks matches nothing here
            print(f"{name}: {e}", file=sys.stderr)
        yield "end", name, None


def planned_in_background(events) -> "queue.Queue":
    """The plan's events, made in a thread of their own; ("error", exception) if planning broke,
    then None."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()

    def work():
        try:
            for ev in events:
                q.put(ev)
        except BaseException as e:            # the main loop raises it
            q.put(("error", e, None))
        q.put(None)

    threading.Thread(target=work, name="reference-sweep-plan", daemon=True).start()
    return q


def correct_before(files: list[str]) -> set:
    """(level, problem) of every problem an earlier output judged correct."""
    done = set()
    for f in files:
        for r in json.loads(Path(f).read_text()).get("problems", []):
            if r.get("correct"):        # named again from its ref: older files named rkb tasks without their level
                done.add((r["level"], problem_name(r["ref"]) if r.get("ref") else r["problem"]))
    return done


def start_pool(cfg, address: str, backend_set: bool, evaluators_set: bool):
    """Ray (a cluster, or a local instance), the backend a sweep would pick, its evaluators."""
    import ray

    owned = not ray.is_initialized()
    connect(address or cfg.address, num_cpus=int(max(1, cfg.eval.evaluators) * cfg.eval.num_cpus) + 1)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if not backend_set:
        cfg.eval.backend = "torch_ext_cuda" if gpus else "torch_ext_cpu"
    gpu_evaluators_default(cfg, evaluators_set)
    e = cfg.eval
    count = e.evaluators or (gpus if e.backend in GPU_BACKENDS else 0)
    if count < 1:
        raise KfrayError(f"no evaluators: eval.evaluators is {e.evaluators} and the cluster has no GPU "
                         f"for backend {e.backend}")
    evs = make_evaluators(e.backend, e, count, f"refsweep-{os.getpid()}-{int(time.time())}")
    infos = ray.get([ev.info.remote() for ev in evs], timeout=300)
    depth = 2 if e.backend in ("cpu", "sim") else e.compile_workers + 1
    return evs, EvalQueue(evs, depth), infos, owned


class Level:
    """One level as the sweep runs it: what its plan left out, its rows, and when it began and ended."""

    def __init__(self, name: str, entry: dict):
        self.name, self.entry = name, entry
        self.rows: list[dict] = []
        self.jobs = self.skipped = 0
        self.planned = False
        self.start: float | None = None       # when its first job could start on its evaluator
        self.end: float | None = None         # its last result

    def complete(self) -> bool:
        return self.planned and len(self.rows) == self.jobs

    def wall(self, now: float) -> float:
        return max(0.0, (self.end or now) - self.start) if self.start is not None else 0.0

    def add(self, row: dict, start: float, done: float) -> None:
        self.rows.append(row)
        self.start = start if self.start is None else min(self.start, start)
        self.end = done if self.end is None else max(self.end, done)


def run_sweep(queue, events, quiet: bool, ahead: bool, on_row=None, on_level=None) -> list[Level]:
    """Every planned job through the pool as its plan arrives, the levels back to back (the next
    level's builds start while the last one's problems are judged). A level's wall time runs from
    when its first problem could start on its evaluator to its last result (on one GPU the levels'
    times add up to the sweep's, less its start); a problem's time to verdict from when its
    evaluator could start it (its build done, and the evaluator's previous evaluation finished:
    one at a time holds the device) to its result.
    `ahead`: the evaluators build while another evaluation runs (GPU backends), else one job at a
    time. `on_row(levels)` after each result, `on_level(level)` as each level completes, in order."""
    import queue as queues

    t0 = time.perf_counter()
    levels: list[Level] = []
    by_id, dispatched, last_done = {}, {}, {}
    planning, reported = True, 0
    while planning or len(queue):
        while planning:                   # what the plan has made so far; wait for it while idle
            try:
                ev = events.get(timeout=0.5) if not len(queue) else events.get_nowait()
            except queues.Empty:
                break
            if ev is None:
                planning = False
                break
            kind, name, item = ev
            if kind == "error":
                raise name
            if kind == "level":
                levels.append(Level(name, item))
            elif kind == "end":
                levels[-1].planned = True
            elif kind == "job":
                lv = levels[-1]
                ref, seed, source = item
                c = Candidate(task=ref, language="suite", source=source, origin=f"seed:{seed}")
                by_id[c.id] = (lv, ref, seed)
                lv.jobs += 1
                queue.submit(c)
            elif kind == "skipped":
                levels[-1].skipped += 1
        now = time.perf_counter()
        for cand, _ in list(queue.in_flight.values()):
            dispatched.setdefault(cand.id, now)
        for cand, res in queue.poll(0.5 if len(queue) else 0.0):
            done = time.perf_counter()
            lv, ref, seed = by_id[cand.id]
            r = row_of(lv.name, ref, seed, res)
            prev, sent = last_done.get(res.evaluator, t0), dispatched.get(cand.id, t0)
            start = max(prev, sent + r["compile_s"]) if ahead else max(prev, sent) + r["compile_s"]
            r["verdict_s"] = max(0.0, done - start)
            last_done[res.evaluator] = done
            lv.add(r, start, done)
            if on_row:
                on_row(levels)
            if not quiet:
                print(f"  {lv.name} {r['problem'][:56]:56s} {'correct' if r['correct'] else 'FAILED ':7s} "
                      f"verdict {r['verdict_s']:6.1f} s  {r['suite_speedup'] or 0:5.2f}x  "
                      f"{'' if r['correct'] else r['reason'].splitlines()[0][:400] if r['reason'] else ''}", flush=True)
        while reported < len(levels) and levels[reported].complete():
            lv = levels[reported]
            if on_level:
                on_level(lv)
            reported += 1
    return levels


def row_of(level: str, ref: str, seed: str, res: EvalResult) -> dict:
    suite = res.facts.get("suite") if isinstance(res.facts.get("suite"), dict) else {}
    reason = res.reason.strip()
    if res.facts.get("not_charged"):
        reason = f"does not fit the device: {reason}"
    return {"level": level, "problem": problem_name(ref), "ref": ref, "kernel": seed, "tier": res.tier,
            "correct": bool(res.correct), "reason": "" if res.correct else (reason or f"tier {res.tier}"),
            # correct by the suite, but kfray's own timing rules did not trust the time (kfray's speedup 0)
            "flagged": res.facts.get("untrusted", "") if res.correct else "",
            "verdict_s": 0.0, "compile_s": res.stage_seconds.get("compile", 0.0),
            "stage_seconds": {k: round(v, 4) for k, v in res.stage_seconds.items()},
            "suite_speedup": suite.get("speedup"), "kfray_speedup": res.speedup if res.correct else 0.0,
            "evaluator": res.evaluator, "hardware": res.hardware,
            "peak_device_gib": suite.get("peak_device_gib"),
            # each configuration's two sides: mean and median times, and the period between calls
            "per_shape": res.facts.get("per_shape") or {},
            # where the device time outside the stages went: the runners' load, the memory settles
            **{k: res.facts[k] for k in ("runner_load_s", "settle_s", "runner_forked_ahead") if k in res.facts},
            # where a failure leaves it, the judge's log of both processes' device memory by step
            **({"judge_memory": res.facts["judge_memory"]} if not res.correct and res.facts.get("judge_memory") else {})}


def level_figures(rows: list[dict], failed_to_load: dict, wall_s: float) -> dict:
    from kfray.sweep import fast_p

    failed = {r["problem"]: r["reason"] for r in rows if not r["correct"]}
    failed.update(failed_to_load)
    total = len(rows) + len(failed_to_load)
    v = [r["verdict_s"] for r in rows]
    slowest = max(rows, key=lambda r: r["verdict_s"])["problem"] if rows else ""
    scored = [{"correct": r["correct"], "speedup": r["suite_speedup"] or 0.0} for r in rows] + \
             [{"correct": False, "speedup": 0.0}] * len(failed_to_load)
    return {"correct": sum(r["correct"] for r in rows), "total": total, "wall_s": round(wall_s, 3),
            "problems_per_hour": round(total / wall_s * 3600, 1) if wall_s > 0 and total else 0.0,
            "verdict_s_median": round(statistics.median(v), 3) if v else 0.0,
            "verdict_s_max": round(max(v), 3) if v else 0.0, "slowest": slowest,
            "fast_p": {str(p): round(x, 4) for p, x in fast_p(scored).items()},
            "stage_s_total": stage_totals(rows), "failed": failed,
            "flagged": {r["problem"]: r["flagged"] for r in rows if r.get("flagged")}}


def stage_totals(rows: list[dict]) -> dict:
    """Each stage's seconds summed over a level's problems: where its wall time went (builds run
    ahead, beside the judge; `device_held` is each job's whole time holding the device; `size_limits`,
    the reference's one call that sizes the time limits, and `load_wait`, what was left of the
    runner's load after it, are parts of `correctness`)."""
    out: dict[str, float] = {}
    for r in rows:
        for k, v in (r.get("stage_seconds") or {}).items():
            out[k] = out.get(k, 0.0) + v
    return {k: round(v, 1) for k, v in sorted(out.items())}


def level_entry(rows: list[dict], planned: dict, wall_s: float) -> dict:
    """A level's figures with what its plan left out (no reference kernel, not loaded)."""
    return {**level_figures(rows, planned["failed"], wall_s), "no_reference": planned["no_reference"],
            "not_loaded": planned["not_loaded"]}


def print_level(name: str, f: dict, extra: dict) -> None:
    print(f"{name}: {f['correct']} / {f['total']} correct; time to verdict median {f['verdict_s_median']:.1f} s, "
          f"max {f['verdict_s_max']:.1f} s ({f['slowest'] or '-'}); wall {f['wall_s']:.0f} s, "
          f"{f['problems_per_hour']:.0f} problems per hour; fast_0.8 {f['fast_p'].get('0.8', 0):.2f}, "
          f"fast_1.0 {f['fast_p'].get('1.0', 0):.2f}", flush=True)
    if f.get("stage_s_total"):
        print("  stages (s, summed): " + ", ".join(f"{k} {v:.0f}" for k, v in f["stage_s_total"].items()))
    for prob, why in f["failed"].items():
        print(f"  failed  {prob}: {why.splitlines()[0][:300] if why else ''}")
    for prob, why in f.get("flagged", {}).items():     # the reference against itself: a rule misfired
        print(f"  flagged {prob} (correct, kfray's time not trusted): {why.splitlines()[0][:300]}")
    for key, label in (("no_reference", "no reference kernel"), ("not_loaded", "does not load (not counted)")):
        for prob, why in extra.get(key, {}).items():
            print(f"  {label}  {prob}: {why.splitlines()[0][:200]}")


def write_out(path: Path, out: dict, t0: float, partial: bool) -> None:
    """The JSON with its totals so far; `partial` while levels are still to come."""
    lv = out["levels"].values()
    out["wall_s"] = round(time.perf_counter() - t0, 3)
    out["correct"], out["total"] = sum(f["correct"] for f in lv), sum(f["total"] for f in lv)
    out["partial"] = partial
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str) + "\n")


def gpu_slug(infos: list[dict], backend: str) -> str:
    if backend not in GPU_BACKENDS:
        return "cpu"
    hw = (infos[0].get("hardware") if infos else "") or "gpu"
    hw = hw.split(":", 1)[-1].lower()
    hw = re.sub(r"^nvidia[_ ]", "", hw)
    return re.sub(r"[^a-z0-9]+", "_", hw).strip("_") or "gpu"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", metavar="ROOT", help="KernelBench's root (ROOT/levelN or ROOT/KernelBench/levelN)")
    ap.add_argument("--rkb", metavar="ROOT", help="robust-kbench's root (ROOT/tasks) or its tasks folder")
    ap.add_argument("--levels", default="1,2,3", help="KernelBench levels (default 1,2,3)")
    ap.add_argument("--tasks", help="comma list of problem names (or prefixes) to keep, as kfray sweep --tasks")
    ap.add_argument("--address", default="", help="Ray cluster address (auto, host:port); default: start locally")
    ap.add_argument("--config", help="YAML config whose eval section to use")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override, "
                    "e.g. eval.evaluators=4 or eval.timeout_s=60")
    ap.add_argument("--out", help="JSON to write (default scripts/results/reference_sweep_<gpu>.json)")
    ap.add_argument("--quiet", action="store_true", help="no line per problem")
    ap.add_argument("--skip-correct", metavar="JSON", action="append", default=[],
                    help="leave out the problems this earlier output judged correct (repeatable): a sweep "
                         "continued across calls")
    args = ap.parse_args(argv)
    if not args.kernelbench and not args.rkb:
        ap.error("give --kernelbench ROOT, --rkb ROOT, or both")

    from kfray.config import load_config

    cfg = load_config(args.config, args.set)
    sets = {s.partition("=")[0].strip() for s in args.set}
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    t0 = time.perf_counter()
    events = planned_in_background(plan_levels(args.kernelbench, args.rkb, levels, args.tasks,
                                               correct_before(args.skip_correct)))
    evs, queue, infos, owned = start_pool(cfg, args.address, "eval.backend" in sets, "eval.evaluators" in sets)
    import ray

    print(f"reference sweep on {len(evs)} {cfg.eval.backend} evaluator(s) ({infos[0]['hardware'] if infos else '?'}), "
          f"started in {time.perf_counter() - t0:.0f} s; each problem is judged as soon as it is planned", flush=True)
    out = {"gpu": gpu_slug(infos, cfg.eval.backend), "backend": cfg.eval.backend, "evaluators": len(evs),
           "hardware": sorted({i.get("hardware", "") for i in infos}), "timeout_s": cfg.eval.timeout_s,
           "torch_compile": cfg.eval.torch_compile, "start_s": round(time.perf_counter() - t0, 3), "levels": {},
           "problems": []}
    path = Path(args.out) if args.out else ROOT / "scripts" / "results" / f"reference_sweep_{out['gpu']}.json"
    done: list[Level] = []

    def so_far(levels: list[Level]) -> None:          # a cut-short run keeps what it judged
        now = time.perf_counter()
        figs = {lv.name: {**level_entry(lv.rows, lv.entry, lv.wall(now)), "partial": True}
                for lv in levels if lv not in done}
        write_out(path, {**out, "levels": {**out["levels"], **figs},
                         "problems": out["problems"] + [r for lv in levels if lv not in done for r in lv.rows]},
                  t0, partial=True)

    def level_done(lv: Level) -> None:
        fig = level_entry(lv.rows, lv.entry, lv.wall(lv.end))
        out["levels"][lv.name] = fig
        out["problems"] += lv.rows
        done.append(lv)
        print_level(lv.name, fig, lv.entry)
        write_out(path, out, t0, partial=True)

    try:
        levels_run = run_sweep(queue, events, args.quiet, cfg.eval.backend in GPU_BACKENDS, so_far, level_done)
    finally:
        try:
            ray.get([ev.shutdown.remote() for ev in evs], timeout=30)
        except Exception:
            pass
        for ev in evs:
            ray.kill(ev)
        if owned:
            ray.shutdown()
    skipped = sum(lv.skipped for lv in levels_run)
    write_out(path, out, t0, partial=False)
    print(f"all: {out['correct']} / {out['total']} correct in {out['wall_s']:.0f} s (the levels' own wall "
          f"{sum(f['wall_s'] for f in out['levels'].values()):.0f} s)"
          + (f"; {skipped} judged correct before, left out" if skipped else ""))
    print(f"wrote {path}")
    return 0 if out["correct"] == out["total"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KfrayError as e:
        print(f"reference_sweep: error: {e}", file=sys.stderr)
        sys.exit(2)
