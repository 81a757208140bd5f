"""`kfray status`: progress of a running or finished search, read from its database."""
from __future__ import annotations

import json
import sqlite3
import sys
import time
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from kfray.candidate import TIER_NAMES
from kfray.report.data import connect_ro, read_meta

WINDOW_S = 300.0   # evaluations per minute are counted over the last 5 minutes


def _island_cells(con: sqlite3.Connection) -> dict[tuple[str, int], int]:
    """Archive size per island: from the saved island states, else counted from outcomes."""
    saved = {(r[0], r[1]): len(json.loads(r[2]).get("archive", {}).get("elites", []))
             for r in con.execute("SELECT task, island, state FROM islands")}
    seeds: dict[str, set] = {}
    for task, cell in con.execute("SELECT task, cell FROM candidates WHERE island < 0"):
        seeds.setdefault(task, set()).add(cell)
    own: dict[tuple[str, int], set] = {}
    for task, isl, cell in con.execute("SELECT task, island, cell FROM candidates WHERE island >= 0 "
                                       "AND outcome IN ('new_cell', 'replaced')"):
        own.setdefault((task, isl), set()).add(cell)
    for task, dst, cell in con.execute("SELECT m.task, m.dst, c.cell FROM migrations m JOIN candidates c "
                                       "ON c.id = m.candidate_id WHERE m.accepted"):
        own.setdefault((task, dst), set()).add(cell)
    keys = set(own) | {(t, i) for t, i in con.execute("SELECT DISTINCT task, island FROM candidates "
                                                        "WHERE island >= 0")}
    return {k: saved.get(k, len(own.get(k, set()) | seeds.get(k[0], set()))) for k in keys}


def island_table(con: sqlite3.Connection) -> Table:
    cells = _island_cells(con)
    t = Table(title="islands", title_justify="left")
    for c in ("task", "island", "generations", "candidates", "correct", "best fitness", "best speedup", "cells"):
        t.add_column(c, justify="left" if c == "task" else "right", no_wrap=True)
    q = ("SELECT task, island, MAX(generation), COUNT(*), SUM(tier = 5), MAX(fitness), "
         "MAX(CASE WHEN tier = 5 THEN speedup END) FROM candidates GROUP BY task, island ORDER BY task, island")
    for task, isl, gen, n, ok, fit, sp in con.execute(q):
        t.add_row(task, "seeds" if isl < 0 else str(isl), "-" if isl < 0 else str(gen or 0), str(n),
                  str(ok or 0), f"{fit:.3f}" if fit is not None else "-", f"{sp:.2f}x" if sp else "-",
                  "-" if isl < 0 else str(cells.get((task, isl), 0)))
    return t


def task_table(con: sqlite3.Connection) -> Table:
    t = Table(title="tasks", title_justify="left")
    for c in ("task", "candidates", "correct", "best speedup", "best candidate", "migration rounds"):
        t.add_column(c, justify="left" if c in ("task", "best candidate") else "right", no_wrap=True)
    rounds = dict(con.execute("SELECT task, COUNT(DISTINCT round) FROM migrations GROUP BY task").fetchall())
    for task, n, ok in con.execute("SELECT task, COUNT(*), SUM(tier = 5) FROM candidates GROUP BY task ORDER BY task"):
        best = con.execute("SELECT id, speedup, origin FROM candidates WHERE task = ? AND tier = 5 "
                           "ORDER BY speedup DESC LIMIT 1", (task,)).fetchone()
        t.add_row(task, str(n), str(ok or 0), f"{best[1]:.2f}x" if best else "-",
                  f"{best[0]} ({best[2]})" if best else "-", str(rounds.get(task, 0)))
    return t


def activity(con: sqlite3.Connection, meta: dict, now: float | None = None) -> Text:
    """Evaluations per minute, failures by tier, migrations, prompt generations, elapsed time."""
    running = meta.get("status") == "running"
    first, last, total = con.execute("SELECT MIN(created), MAX(created), COUNT(*) FROM candidates").fetchone()
    end = (now or time.time()) if running else (meta.get("finished") or last or 0.0)
    start = meta.get("started") or first or end
    window = max(1.0, min(WINDOW_S, end - start))
    recent = con.execute("SELECT COUNT(*) FROM candidates WHERE created >= ?", (end - window,)).fetchone()[0]
    tiers = dict(con.execute("SELECT tier, COUNT(*) FROM candidates GROUP BY tier").fetchall())
    rounds = con.execute("SELECT COUNT(DISTINCT task || '/' || round) FROM migrations").fetchone()[0]
    gens, nprompts = con.execute("SELECT COUNT(DISTINCT generation), COUNT(*) FROM prompts").fetchone()
    out = Text()
    out.append(f"{total} evaluated, {recent / window * 60:.1f} evaluations/min over the last "
               f"{window / 60:.1f} min; elapsed {end - start:.0f} s")
    if running and last:
        out.append(f"; last evaluation {max(0.0, end - last):.0f} s ago")
    out.append("\ntiers: ")
    parts = [f"{TIER_NAMES.get(k, k)} {tiers.get(k, 0)}" for k in sorted(set(TIER_NAMES) | set(tiers))]
    out.append(", ".join(parts))
    fails = sum(n for k, n in tiers.items() if k != 5)
    out.append(f"  (failures: {fails})", style="red" if fails else "green")
    out.append(f"\nmigrations: {rounds} rounds; prompt generations: {gens} ({nprompts} meta-prompts)")
    line = llm_requests_line(con)
    if line:
        out.append("\n" + line)
    return out


def llm_requests_line(con: sqlite3.Connection) -> str:
    """The model's requests by purpose per evaluated LLM candidate, from the islands' saved usage."""
    from kfray.proposers.models import merged, request_counts, requests_text

    usage = merged(json.loads(s).get("llm_usage") for s, in con.execute("SELECT state FROM islands"))
    if not usage:
        return ""
    n = con.execute("SELECT COUNT(*) FROM candidates WHERE origin LIKE 'llm%'").fetchone()[0]
    return requests_text(request_counts(usage, n))


def render(run_dir: str | Path) -> Group:
    con = connect_ro(run_dir)
    try:
        meta = read_meta(con)
        head = Text(f"{run_dir}: ", style="bold")
        status = meta.get("status", "?")
        head.append(status, style="green" if status == "finished" else "yellow")
        head.append(f"  {meta.get('name', '')}  hardware: {meta.get('hardware', '?')}")
        return Group(head, island_table(con), task_table(con), activity(con, meta))
    finally:
        con.close()


def is_finished(run_dir: str | Path) -> bool:
    con = connect_ro(run_dir)
    try:
        return read_meta(con).get("status") == "finished"
    finally:
        con.close()


def show(run_dir: str | Path, watch: float | None = None, console: Console | None = None) -> int:
    """Print the status once, or refresh it every `watch` seconds until the run finishes or Ctrl-C."""
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    if not watch:
        console.print(render(run_dir))
        return 0
    from rich.live import Live

    try:
        with Live(render(run_dir), console=console, refresh_per_second=4, transient=False) as live:
            while not is_finished(run_dir):
                time.sleep(watch)
                live.update(render(run_dir))
            live.update(render(run_dir))
    except KeyboardInterrupt:
        pass
    return 0
