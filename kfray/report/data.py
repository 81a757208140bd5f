"""Read-only access to a run database (safe while a run is writing it in WAL mode)."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfray.errors import KfrayError

# Columns read for every candidate; sources are fetched one at a time, when needed.
_COLS = ("id, task, island, parent_id, prompt_id, origin, generation, cell, tier, reason, times, "
         "ref_times, speedup, fitness, noise, facts, hardware, outcome, created")


def connect_ro(run_dir: str | Path) -> sqlite3.Connection:
    """A read-only connection to RUN_DIR/kfray.db; a clear KfrayError when there is none."""
    db = Path(run_dir) / "kfray.db"
    if not db.is_file():
        raise KfrayError(f"{run_dir}: no kfray.db here; give the folder a `kfray run --run-dir` wrote")
    try:
        con = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)
        con.row_factory = sqlite3.Row
        con.execute("SELECT COUNT(*) FROM candidates").fetchone()
    except sqlite3.DatabaseError as e:
        raise KfrayError(f"{db}: not a kfray run database ({e})") from None
    return con


def read_meta(con: sqlite3.Connection) -> dict[str, Any]:
    return {r[0]: json.loads(r[1]) for r in con.execute("SELECT key, value FROM meta")}


def _loads(text: str | None, default: Any) -> Any:
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default


@dataclass
class Run:
    """Everything the report draws from, loaded once (no kernel sources)."""

    run_dir: Path
    meta: dict
    cands: list[dict]                         # ordered by created
    migrations: list[dict]
    prompts: list[dict]
    islands: dict[tuple[str, int], dict]      # (task, index) -> final island state
    con: sqlite3.Connection = field(repr=False)

    def __post_init__(self):
        self.by_id = {c["id"]: c for c in self.cands}
        self.tasks = list(dict.fromkeys(c["task"] for c in self.cands))
        created = [c["created"] for c in self.cands] + [m["created"] for m in self.migrations]
        self.t0 = float(self.meta.get("started") or min(created, default=0.0))

    def source(self, cand_id: str) -> tuple[str, dict]:
        r = self.con.execute("SELECT source, params FROM candidates WHERE id = ?", (cand_id,)).fetchone()
        return (r[0] or "", _loads(r[1], {})) if r else ("", {})

    def island_ids(self, task: str) -> list[int]:
        ids = {c["island"] for c in self.cands if c["task"] == task and c["island"] >= 0}
        ids |= {i for t, i in self.islands if t == task}
        return sorted(ids)

    def best(self, task: str) -> dict | None:
        """The candidate with the highest fitness (correct ones win by construction)."""
        return max((c for c in self.cands if c["task"] == task), key=lambda c: c["fitness"] or 0.0, default=None)

    def lineage(self, cand_id: str) -> list[dict]:
        """The chain of parents of a candidate, root (usually a seed) first."""
        chain, seen = [], set()
        c = self.by_id.get(cand_id)
        while c is not None and c["id"] not in seen:
            seen.add(c["id"])
            chain.append(c)
            c = self.by_id.get(c["parent_id"]) if c["parent_id"] else None
        return chain[::-1]


def load_run(run_dir: str | Path) -> Run:
    con = connect_ro(run_dir)
    cands = []
    for r in con.execute(f"SELECT {_COLS} FROM candidates ORDER BY created, rowid"):
        c = dict(r)
        c["cell"] = tuple(_loads(c["cell"], []))
        for k, d in (("times", {}), ("ref_times", {}), ("facts", {})):
            c[k] = _loads(c[k], d)
        c["fitness"] = c["fitness"] or 0.0
        c["speedup"] = c["speedup"] or 0.0
        cands.append(c)
    migrations = [dict(r) for r in con.execute("SELECT * FROM migrations ORDER BY id")]
    prompts = []
    for r in con.execute("SELECT * FROM prompts ORDER BY generation, id"):
        p = dict(r)
        for k, d in (("sections", {}), ("parents", []), ("hints", [])):
            p[k] = _loads(p[k], d)
        prompts.append(p)
    islands = {}
    for r in con.execute("SELECT task, island, state FROM islands"):
        st = _loads(r["state"], None)
        if st:
            islands[(r["task"], r["island"])] = st
    return Run(Path(run_dir), read_meta(con), cands, migrations, prompts, islands, con)


def archive_cells(run: Run, task: str, island: int) -> dict[tuple, dict]:
    """cell -> {fitness, speedup, tier, id} of an island's archive.

    From the saved island state when there is one; else rebuilt from the candidates: the seeds,
    the island's own accepted candidates and the migrants it accepted (best per cell)."""
    st = run.islands.get((task, island))
    if st:
        out = {}
        for e in st.get("archive", {}).get("elites", []):
            c, r = e["candidate"], e["result"]
            full = run.by_id.get(c["id"])        # the stored row; the state's result lacks fitness
            if full:
                out[tuple(c["cell"])] = {k: full[k] for k in ("fitness", "speedup", "tier", "id")}
            else:
                out[tuple(c["cell"])] = {"fitness": float(r.get("tier", 0)), "speedup": 0.0,
                                         "tier": r.get("tier", 0), "id": c["id"]}
        return out
    pool = [c for c in run.cands if c["task"] == task and
            (c["island"] < 0 or (c["island"] == island and c["outcome"] in ("new_cell", "replaced", "seed")))]
    pool += [run.by_id[m["candidate_id"]] for m in run.migrations
             if m["task"] == task and m["dst"] == island and m["accepted"] and m["candidate_id"] in run.by_id]
    out = {}
    for c in pool:
        cell = tuple(c["cell"])
        if cell and (cell not in out or c["fitness"] > out[cell]["fitness"]):
            out[cell] = {"fitness": c["fitness"], "speedup": c["speedup"], "tier": c["tier"], "id": c["id"]}
    return out


def best_curve(run: Run, task: str, island: int) -> list[tuple[float, float, str]]:
    """(seconds since start, best fitness so far, how: seed|own|migrant) at each improvement of an island."""
    events = [(c["created"], c["fitness"], "seed" if c["island"] < 0 else "own") for c in run.cands
              if c["task"] == task and c["island"] in (-1, island)]
    events += [(m["created"], run.by_id[m["candidate_id"]]["fitness"], "migrant") for m in run.migrations
               if m["task"] == task and m["dst"] == island and m["accepted"] and m["candidate_id"] in run.by_id]
    curve, best = [], None
    for t, f, how in sorted(events):
        if best is None or f > best:
            best = f
            curve.append((t - run.t0, f, how))
    return curve


def migration_times(run: Run, task: str) -> list[float]:
    """Seconds since start of each migration round of a task."""
    rounds: dict[int, float] = {}
    for m in run.migrations:
        if m["task"] == task:
            rounds.setdefault(m["round"], m["created"])
    return [t - run.t0 for _, t in sorted(rounds.items())]
