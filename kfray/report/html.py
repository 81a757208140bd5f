"""`kfray report`: report.html plus its PNGs (in a `report/` folder next to it)."""
from __future__ import annotations

import difflib
import json
import os
import re
import time
from html import escape
from pathlib import Path

from kfray.candidate import TIER_NAMES
from kfray.eval.profile_facts import profile_text
from kfray.report.status import llm_requests_line
from kfray.report import plots
from kfray.report.data import Run, archive_cells, load_run
from kfray.report.roofline import ceilings, shape_rows

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1180px;
 padding:1em 2em;color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:right} th{background:#f4f4f4}
td.l,th.l{text-align:left} .muted{color:#777} img{max-width:100%;border:1px solid #eee;margin:.4em 0}
pre{background:#f8f8f8;border:1px solid #e4e4e4;padding:.6em;overflow:auto;font-size:.82em;max-height:40em}
pre .add{color:#116329;background:#e6ffec;display:inline-block;min-width:100%} pre .del{color:#82071e;background:#ffebe9;display:inline-block;min-width:100%}
pre .hunk{color:#0550ae;display:inline-block;min-width:100%} pre .head{color:#555;font-weight:bold;display:inline-block;min-width:100%}
.step{border-left:4px solid #2ca02c;padding:.1em .9em;margin:1em 0} .step.fail{border-color:#d62728}
details summary{cursor:pointer;color:#0550ae} nav a{margin-right:1em}
"""


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _table(head: list[str], rows: list[list], left: int = 1) -> str:
    cls = lambda i: ' class="l"' if i < left else ""  # noqa: E731
    out = ["<table><tr>" + "".join(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(head)) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td{cls(i)}>{escape(str(v))}</td>" for i, v in enumerate(r)) + "</tr>")
    return "\n".join(out) + "</table>"


def _img(src: Path, html_dir: Path, alt: str) -> str:
    rel = Path(os.path.relpath(src, html_dir)).as_posix()
    return f'<img src="{escape(rel)}" alt="{escape(alt)}">'


def _with_params(source: str, params: dict) -> list[str]:
    head = [f"// @params {json.dumps(params, sort_keys=True)}"] if params else []
    return head + source.splitlines()


def diff_html(run: Run, parent: dict, child: dict) -> str:
    """Unified diff (source plus parameters) from parent to child, escaped and coloured."""
    a, b = _with_params(*run.source(parent["id"])), _with_params(*run.source(child["id"]))
    lines = list(difflib.unified_diff(a, b, fromfile=f"{parent['id']} (parent)", tofile=f"{child['id']}",
                                      lineterm="", n=3))
    if not lines:
        return '<p class="muted">same source and parameters as the parent (re-timed copy)</p>'
    cls = lambda s: "head" if s.startswith(("---", "+++")) else "hunk" if s.startswith("@@") else \
        "add" if s.startswith("+") else "del" if s.startswith("-") else "ctx"  # noqa: E731
    body = "".join((f'<span class="{cls(s)}">{escape(s)}</span>' if cls(s) != "ctx" else escape(s)) + "\n"
                   for s in lines)
    return f'<pre class="diff">{body}</pre>'


def _prompt_html(run: Run, prompt_id: str | None) -> str:
    p = next((p for p in run.prompts if p["id"] == prompt_id), None)
    if not prompt_id:
        return "none"
    if p is None:
        return f"{escape(prompt_id)} <span class='muted'>(not in the prompts table)</span>"
    secs = "\n\n".join(f"[{k}]\n{v}" for k, v in p["sections"].items())
    return (f"<details><summary>{escape(p['id'])}: generation {p['generation']}, mean score {p['mean']:.3f} "
            f"over {p['reports']} reports, hints {escape(', '.join(p['hints']) or '-')}</summary>"
            f"<pre>{escape(secs)}</pre></details>")


def _describe(c: dict) -> str:
    val = f"speedup {c['speedup']:.3f}x" if c["tier"] == 5 else f"{TIER_NAMES.get(c['tier'], c['tier'])}"
    isl = "seed" if c["island"] < 0 else f"island {c['island']}"
    return (f"<b>{escape(c['id'])}</b> · {escape(c['origin'] or '?')} · {isl} · generation {c['generation']} · "
            f"cell {escape(str(list(c['cell'])))} · {escape(val)} · fitness {c['fitness']:.3f}")


def lineage_html(run: Run, chain: list[dict]) -> str:
    out = []
    for k, c in enumerate(chain):
        fail = "" if c["tier"] == 5 else " fail"
        out.append(f'<div class="step{fail}"><div>{k}. {_describe(c)}</div><div>meta-prompt: '
                   f'{_prompt_html(run, c["prompt_id"])}</div>')
        if k == 0:
            out.append('<p class="muted">root of the lineage (no parent recorded)</p>')
        else:
            out.append(diff_html(run, chain[k - 1], c))
        if c["tier"] != 5 and c["reason"]:
            out.append(f"<pre>{escape(c['reason'][:2000])}</pre>")
        out.append("</div>")
    return "\n".join(out)


def _fmt_ms(t: float | None) -> str:
    return f"{t * 1e3:.4g} ms" if t else "-"


def timings_html(run: Run, best: dict) -> tuple[str, list[dict]]:
    ceil = ceilings(run.meta.get("device_facts"))
    rows = shape_rows(best, run.meta.get("device_facts"))
    table = [[r["shape"], _fmt_ms(r["time"]), _fmt_ms(r["ref"]), f"{r['speedup']:.3f}x" if r["speedup"] else "-",
              f"{r['bytes'] / 1e6:.3g} MB", f"{r['flops'] / 1e6:.3g} MFLOP", f"{r['gbps']:.1f}", f"{r['gflops']:.1f}",
              _fmt_ms(r["roof"]), f"{r['of_roof'] * 100:.1f} %" if r["of_roof"] else "-", r["bound"] or "-"]
             for r in rows]
    head = ["shape", "kernel", "reference", "speedup", "bytes", "flops", "GB/s", "GFLOP/s", "roofline",
            "of roofline", "bound"]
    if ceil["gbps"] or ceil["gflops"]:
        note = "Roofline time = max(bytes / bandwidth, flops / rate) with " + ", ".join(
            f"{k} = {v[1]:.4g} {'GB/s' if k == 'gbps' else 'GFLOP/s'} (device fact <code>{escape(v[0])}</code>)"
            for k, v in ceil.items() if v) + "."
    else:
        note = ("The device facts carry no bandwidth or flop-rate figure, so no roofline; "
                "the achieved GB/s and GFLOP/s are shown instead.")
    return _table(head, table) + f'<p class="muted">{note}</p>', rows


def _summary_rows(run: Run) -> list[list]:
    rows = []
    for task in run.tasks:
        cs = [c for c in run.cands if c["task"] == task]
        best = run.best(task)
        cells = {cell for i in run.island_ids(task) for cell in archive_cells(run, task, i)}
        rounds = len({m["round"] for m in run.migrations if m["task"] == task})
        rows.append([task, len(cs), sum(c["tier"] == 5 for c in cs),
                     f"{best['speedup']:.3f}x" if best and best["tier"] == 5 else "-",
                     best["id"] if best else "-", len(run.island_ids(task)), len(cells), rounds])
    return rows


def cross_hardware_rows(run: Run) -> list[list]:
    """Migrants timed again on other hardware (origin migrant:<class>), beside their original timing."""
    by_id = {c["id"]: c for c in run.cands}
    rows = []
    for c in run.cands:
        src = by_id.get(c.get("parent_id") or "")
        if str(c.get("origin", "")).startswith("migrant:") and src is not None:
            rows.append([c["task"], src["id"], src["hardware"], f"{src['speedup']:.3f}x", c["hardware"],
                         f"{c['speedup']:.3f}x", c["tier"]])
    return rows


def write_report(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Write the HTML report and its PNGs; returns (html path, png paths)."""
    run = load_run(run_dir)
    html_path = Path(out) if out else Path(run_dir) / "report.html"
    html_path.parent.mkdir(parents=True, exist_ok=True)
    img_dir = html_path.parent / "report"
    img_dir.mkdir(exist_ok=True)
    here = html_path.parent
    pngs: list[Path] = []

    def fig(fn, name, *a):
        pngs.append(fn(*a, img_dir / name))
        return _img(pngs[-1], here, name)

    m = run.meta
    dur = (m.get("finished") or max([c["created"] for c in run.cands] + [run.t0])) - run.t0
    body = [f"<h1>kfray report: {escape(str(m.get('name', run.run_dir.name)))}</h1>",
            f"<p>status <b>{escape(str(m.get('status', '?')))}</b> · hardware {escape(str(m.get('hardware', '?')))} · "
            f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.t0))} · {dur:.0f} s · "
            f"{len(run.cands)} candidates · {len({(x['task'], x['round']) for x in run.migrations})} migration rounds · "
            f"{len({p['generation'] for p in run.prompts})} prompt generations</p>",
            "<nav>" + "".join(f'<a href="#task-{escape(_slug(t))}">{escape(t)}</a>' for t in run.tasks) + "</nav>"]
    requests = llm_requests_line(run.con)            # LLM runs: what the model was asked, and what for
    if requests:
        body.insert(2, f"<p>{escape(requests)}</p>")
    body.append("<h2>Summary</h2>" + _table(
        ["task", "candidates", "correct", "best speedup", "best candidate", "islands", "cells filled",
         "migration rounds"], _summary_rows(run)))
    body.append("<details><summary>device facts and configuration</summary><pre>"
                + escape(json.dumps({"device_facts": m.get("device_facts"), "config": m.get("config")}, indent=1))
                + "</pre></details>")
    cross = cross_hardware_rows(run)
    if cross:
        body.append("<h2>Across hardware: kernels tuned on A, timed on B</h2>" + _table(
            ["task", "kernel", "tuned on", "speedup there", "timed on", "speedup there", "tier there"], cross))
    if not run.cands:
        body.append('<p class="muted">No candidate has been evaluated yet.</p>')
    else:
        body.append("<h2>Search progress</h2>" + fig(plots.curves_figure, "best_fitness.png", run, run.tasks))
        body.append(fig(plots.tiers_figure, "tiers.png", run))
        body.append("<h2>Meta-prompts</h2>" + fig(plots.prompts_figure, "prompts.png", run))
    for task in run.tasks:
        s = _slug(task)
        body.append(f'<h2 id="task-{escape(s)}">{escape(task)}</h2><h3>MAP-Elites archives</h3>')
        body.append(fig(plots.archive_figure, f"archive_{s}.png", run, task))
        best = run.best(task)
        if best is None:
            continue
        src, params = run.source(best["id"])
        body.append(f"<h3>Best kernel</h3><p>{_describe(best)}<br>parameters: "
                    f"<code>{escape(json.dumps(params))}</code></p>")
        if (best.get("facts") or {}).get("profile"):
            body.append(f"<p>Nsight Compute: {escape(profile_text(best['facts']['profile']))}</p>")
        if best["times"]:
            tab, rows = timings_html(run, best)
            body.append(tab + fig(plots.timings_figure, f"timings_{s}.png", task, rows))
        body.append(f"<details open><summary>source</summary><pre>{escape(src)}</pre></details>")
        chain = run.lineage(best["id"])
        body.append(f'<h3 id="lineage-{escape(s)}">Lineage of the best kernel ({len(chain)} steps, root first)</h3>')
        body.append(fig(plots.lineage_figure, f"lineage_{s}.png", task, chain))
        body.append(f'<div class="lineage">{lineage_html(run, chain)}</div>')
    page = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>kfray report: {escape(str(m.get('name', '')))}</title><style>{CSS}</style></head>"
            f"<body>\n" + "\n".join(body) + "\n</body></html>\n")
    html_path.write_text(page, encoding="utf-8")
    run.con.close()
    return html_path, pngs
