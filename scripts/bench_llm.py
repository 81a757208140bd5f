"""How good is a model as kfray's proposer? N proposals per task and edit mode, each evaluated.

    scripts/local_llm.sh start
    python scripts/bench_llm.py --base-url http://127.0.0.1:8080/v1 --model qwen2.5-coder-1.5b --n 4

For each task (the CPU built-ins and one KernelBench-format task) and each mode (rewrite: a whole
file; diff: SEARCH/REPLACE blocks), the model improves the same parent (the task's baseline seed,
evaluated first) N times. Each proposal is compiled, checked and timed by kfray's CPU evaluator; one
that fails to compile or check goes back once with its diagnostics (the repair step), as in a run.
The proposals go one at a time, as the endpoint's limit of one request in flight would send them.

Reported per task and mode, and in all: proposals per minute, the share of answers that parse
(a code block, or edits that apply), compile before and after repair, are correct before and after
repair, the best speedup over the reference, prompt and completion tokens per request, and seconds
per proposal (repair included). Writes scripts/results/llm_local_<date>.md and .json.

`python scripts/bench_llm.py run [--base-url URL --model NAME]` instead runs a whole search with the
model and checks issue 29's targets on it (scripts/bench_llm_run.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kfray.candidate import Candidate, EvalResult  # noqa: E402
from kfray.config import EvalConfig, ProposerConfig  # noqa: E402
from kfray.proposal import Elite, ProposalContext  # noqa: E402
from kfray.proposers.llm import LLMProposer  # noqa: E402
from kfray.tasks import load_task  # noqa: E402

KB_TASK = "kernelbench:" + str(ROOT / "tests" / "data" / "kernelbench" / "level1" / "2_Linear_bias.py")
# KernelBench tasks come without a kf_forward seed; both modes improve this plain one
KB_SEED = """\
// out = x @ fc_weight^T + fc_bias, one output at a time.
#include <cstdint>

extern "C" int kf_forward(const float* x, const float* fc_weight, const float* fc_bias, float* out,
                          int64_t rows, int64_t n_in, int64_t n_out) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < n_out; ++o) {
            float acc = fc_bias[o];
            for (int64_t i = 0; i < n_in; ++i)
                acc += x[r * n_in + i] * fc_weight[o * n_in + i];
            out[r * n_out + o] = acc;
        }
    return 0;
}
"""


def evaluate(ev, cand: Candidate, task_ref: str) -> EvalResult:
    return EvalResult.from_dict(ev.evaluate(cand, task_ref))


def parent_of(ev, task_ref: str):
    task = load_task(task_ref)
    seed = task.baseline_seed("cpp")
    src = seed.source if seed is not None else KB_SEED
    from kfray.source import parse_params
    c = Candidate(task=task_ref, language="cpp", source=src, params=parse_params(src).default(), origin="seed")
    return task, Elite(c, evaluate(ev, c, task_ref))


def one(prop: LLMProposer, ev, task, task_ref: str, parent: Elite, i: int) -> dict:
    ctx = ProposalContext(task=task, language="cpp", parent=parent, inspirations=[], target_cell=None,
                          meta_prompt=None, device_facts={"cores": 2, "isa": "x86-64, AVX2"}, island=0,
                          generation=i + 1)
    t0 = time.monotonic()
    cand = prop.propose(ctx, None)
    first = dict(prop.last)
    res = evaluate(ev, cand, task_ref) if cand.source.strip() else None
    row = {"mode": first.get("mode"), "parsed": bool(cand.source.strip()),
           "no_code_reason": cand.no_code_reason[:300], "tier": res.tier if res else 0,
           "reason": (res.reason[:300] if res else ""), "speedup": res.speedup if res else 0.0,
           "prompt_tokens": first.get("prompt_tokens", 0), "completion_tokens": first.get("completion_tokens", 0),
           "request_s": first.get("request_s", 0.0), "repaired": False,
           "edit_retried": bool(first.get("edit_error")), "answers": first.get("answers", [])}
    final = res
    if res is not None and 1 <= res.tier < 5:
        rctx = ProposalContext(task=task, language="cpp", parent=Elite(cand, res), inspirations=[],
                               target_cell=None, meta_prompt=None, device_facts=ctx.device_facts, island=0,
                               generation=i + 1, repair=True)
        fix = prop.propose(rctx, None)
        rep = dict(prop.last)
        fres = evaluate(ev, fix, task_ref) if fix.source.strip() else None
        row.update(repaired=True, repair_parsed=bool(fix.source.strip()), repair_tier=fres.tier if fres else 0,
                   repair_reason=(fres.reason[:300] if fres else fix.no_code_reason[:300]),
                   repair_prompt_tokens=rep.get("prompt_tokens", 0),
                   repair_completion_tokens=rep.get("completion_tokens", 0),
                   repair_answers=rep.get("answers", []))
        if fres is not None and fres.tier > res.tier:
            final = fres
    row["final_tier"] = final.tier if final else 0
    row["final_speedup"] = final.speedup if final else 0.0
    row["seconds"] = time.monotonic() - t0
    return row


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    if not n:
        return {}
    reqs = [(r["prompt_tokens"], r["completion_tokens"]) for r in rows]
    reqs += [(r["repair_prompt_tokens"], r["repair_completion_tokens"]) for r in rows if r["repaired"]]
    secs = sum(r["seconds"] for r in rows)
    return {
        "n": n, "per_min": 60.0 * n / secs if secs else 0.0,
        "parse": sum(r["parsed"] for r in rows) / n,
        "compile": sum(r["tier"] >= 2 for r in rows) / n,
        "compile_repaired": sum(r["final_tier"] >= 2 for r in rows) / n,
        "correct": sum(r["tier"] == 5 for r in rows) / n,
        "correct_repaired": sum(r["final_tier"] == 5 for r in rows) / n,
        "repairs": sum(r["repaired"] for r in rows),
        "edit_retries": sum(bool(r.get("edit_retried")) for r in rows),
        "best_speedup": max(r["final_speedup"] for r in rows),
        "prompt_tokens": statistics.mean(p for p, _ in reqs),
        "completion_tokens": statistics.mean(c for _, c in reqs),
        "s_per_proposal": secs / n,
    }


def table(groups: dict[str, dict]) -> str:
    head = ("| task | mode | N | proposals/min | parse | compile | compile after repair | correct | "
            "correct after repair | repairs | edit retries | best speedup | prompt tok/req | completion tok/req | s/proposal |")
    lines = [head, "|" + "---|" * 15]
    for key, s in groups.items():
        task, mode = key.split("|")
        lines.append(f"| {task} | {mode} | {s['n']} | {s['per_min']:.2f} | {s['parse']:.0%} | {s['compile']:.0%} | "
                     f"{s['compile_repaired']:.0%} | {s['correct']:.0%} | {s['correct_repaired']:.0%} | "
                     f"{s['repairs']} | {s['edit_retries']} | {s['best_speedup']:.2f}x | {s['prompt_tokens']:.0f} | "
                     f"{s['completion_tokens']:.0f} | {s['s_per_proposal']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:           # issue 29's targets on a whole run (scripts/bench_llm_run.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_llm_run import main as run_main
        return run_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--n", type=int, default=4, help="proposals per task and mode")
    ap.add_argument("--tasks", nargs="*", default=["axpb", "softmax", "matmul", KB_TASK])
    ap.add_argument("--modes", nargs="*", default=["rewrite", "diff"])
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=2400)
    ap.add_argument("--timeout", type=float, default=300.0, help="idle seconds between tokens")
    ap.add_argument("--out", default=str(ROOT / "scripts" / "results" / f"llm_local_{dt.date.today()}"))
    args = ap.parse_args(argv)

    from kfray.eval.evaluator import Evaluator

    ev = Evaluator("cpu", EvalConfig(tune_budget=0, trials=1, repeats=3, min_time_s=0.0, warmup=1, timeout_s=60))
    rows, groups = [], {}
    t_start = time.monotonic()
    for task_ref in args.tasks:
        task, parent = parent_of(ev, task_ref)
        name = task.name if not task_ref.startswith("kernelbench:") else "KB " + Path(task_ref).stem
        for mode in args.modes:
            cfg = ProposerConfig(kind="llm", base_url=args.base_url, model=args.model, edit_mode=mode, repair=True,
                                 max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
                                 timeout_s=args.timeout, max_retries=1, temperature=0.7)
            prop = LLMProposer(cfg)
            for i in range(args.n):
                r = one(prop, ev, task, task_ref, parent, i)
                r.update(task=name, arm=mode)
                rows.append(r)
                print(f"[{time.monotonic() - t_start:6.0f}s] {name} {mode} #{i + 1}: parsed={r['parsed']} "
                      f"tier={r['tier']} -> {r['final_tier']} ({r['seconds']:.0f}s, {r['prompt_tokens']}+"
                      f"{r['completion_tokens']} tok) {r['no_code_reason'][:80] or r['reason'][:80]!r}", flush=True)
            groups[f"{name}|{mode}"] = summarise([r for r in rows if r["task"] == name and r["arm"] == mode])
    for mode in args.modes:
        groups[f"all|{mode}"] = summarise([r for r in rows if r["arm"] == mode])
    groups["all|both"] = summarise(rows)
    text = (f"# LLM proposer with a local model ({dt.date.today()})\n\n"
            f"model `{args.model}` at {args.base_url}; {args.n} proposals per task and mode; "
            f"max_tokens {args.max_tokens}, prompt budget {args.prompt_tokens} tokens; one request in flight; "
            f"the CPU evaluator (g++ -O3, 1 thread); wall time {time.monotonic() - t_start:.0f} s.\n\n"
            + table(groups) + "\n\n"
            "parse: a code block with kf_forward, or SEARCH/REPLACE edits that apply to the parent. compile: "
            "tier >= 2; correct: tier 5. edit retries: diff answers with no usable code (edits that do not apply, "
            "a bare snippet), asked again once as a whole file. 'after repair': a proposal that failed to compile or check went back "
            "once with its diagnostics. s/proposal includes the repair and the evaluations.\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "summary": groups, "rows": rows}, indent=1))
    print(text)
    ev.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
