"""The run database: one SQLite file in WAL mode, written only by the driver.

Every candidate (with its source, cell, tier, timings and stage times), every migration, every
meta-prompt and each island's latest state go here; one transaction per write batch, so a crash
loses at most the batch in flight and the database stays consistent.
"""
from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable

from kfray.candidate import Candidate, EvalResult

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS candidates (
  id TEXT PRIMARY KEY, task TEXT, island INTEGER, parent_id TEXT, prompt_id TEXT, origin TEXT,
  generation INTEGER, language TEXT, source TEXT, params TEXT, cell TEXT, src_hash TEXT,
  tier INTEGER, reason TEXT, times TEXT, ref_times TEXT, speedup REAL, fitness REAL, noise REAL,
  stage_seconds TEXT, facts TEXT, hardware TEXT, evaluator TEXT, outcome TEXT, created REAL);
CREATE INDEX IF NOT EXISTS cand_task ON candidates(task, island);
CREATE TABLE IF NOT EXISTS migrations (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task TEXT, round INTEGER, src INTEGER, dst INTEGER,
  candidate_id TEXT, accepted INTEGER, created REAL);
CREATE TABLE IF NOT EXISTS prompts (
  id TEXT PRIMARY KEY, generation INTEGER, sections TEXT, parents TEXT, hints TEXT,
  uses INTEGER, reports INTEGER, mean REAL, best REAL, alive INTEGER);
CREATE TABLE IF NOT EXISTS islands (
  task TEXT, island INTEGER, generation INTEGER, state TEXT, updated REAL, PRIMARY KEY (task, island));
CREATE TABLE IF NOT EXISTS transitions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, task TEXT, island INTEGER, generation INTEGER,
  parent_id TEXT, child_id TEXT, parent_cell TEXT, child_cell TEXT, parent_fitness REAL,
  child_fitness REAL, delta REAL, outcome TEXT, kind TEXT, origin TEXT, created REAL);
CREATE INDEX IF NOT EXISTS trans_task ON transitions(task, island);
"""


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def _tx(self, sql: str, rows: Iterable[tuple]) -> None:
        rows = list(rows)
        if not rows:
            return
        self.db.execute("BEGIN")
        try:
            self.db.executemany(sql, rows)
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def set_meta(self, **kv: Any) -> None:
        self._tx("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in kv.items()])

    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    def add_candidates(self, rows: list[tuple[Candidate, EvalResult, str]]) -> None:
        """(candidate, result, archive outcome) rows, in one transaction."""
        from kfray.source import source_hash

        now = time.time()
        self._tx("INSERT OR REPLACE INTO candidates VALUES (" + ",".join("?" * 25) + ")", [
            (c.id, c.task, c.island, c.parent_id, c.prompt_id, c.origin, c.generation, c.language, c.source,
             json.dumps(c.params), json.dumps(list(c.cell)), source_hash(c.source, c.params), r.tier, r.reason,
             json.dumps(r.times), json.dumps(r.ref_times), r.speedup, r.fitness, r.noise,
             json.dumps(r.stage_seconds), json.dumps(r.facts), r.hardware, r.evaluator, outcome, now)
            for c, r, outcome in rows])

    def set_facts(self, cand_id: str, facts: dict) -> None:
        """A stored result's facts, replaced (profiler facts added after the search)."""
        self._tx("UPDATE candidates SET facts = ? WHERE id = ?", [(json.dumps(facts), cand_id)])

    def set_outcomes(self, pairs: list[tuple[str, str]]) -> None:
        self._tx("UPDATE candidates SET outcome = ? WHERE id = ?", [(o, i) for i, o in pairs])

    def add_transitions(self, task: str, records: list[dict], own: set | None = None) -> None:
        """Parent -> child transitions from an island's ingest records (those with a parent cell),
        in one transaction. A record whose `params` the inner tuner changed also updates the
        candidate's stored parameters, when the candidate is in `own` (None: any)."""
        now = time.time()
        self._tx("INSERT INTO transitions (task, island, generation, parent_id, child_id, parent_cell, child_cell, "
                 "parent_fitness, child_fitness, delta, outcome, kind, origin, created) "
                 "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", [
                     (task, r.get("island"), r.get("generation"), r.get("parent_id"), r["candidate_id"],
                      json.dumps(r["parent_cell"]), json.dumps(r.get("child_cell")), r["parent_fitness"],
                      r["fitness"], r["improvement"], r["outcome"], r.get("kind"), r.get("origin"), now)
                     for r in records if r.get("parent_cell") is not None])
        self._tx("UPDATE candidates SET params = ? WHERE id = ?",
                 [(json.dumps(r["params"]), r["candidate_id"]) for r in records
                  if r.get("params") and (own is None or r["candidate_id"] in own)])

    def transitions(self, task: str | None = None) -> list[dict]:
        q, a = ("SELECT * FROM transitions WHERE task = ? ORDER BY id", (task,)) if task else \
            ("SELECT * FROM transitions ORDER BY id", ())
        out = []
        for r in self.rows(q, a):
            d = dict(r)
            d["parent_cell"], d["child_cell"] = json.loads(d["parent_cell"]), json.loads(d["child_cell"] or "null")
            out.append(d)
        return out

    def add_migrations(self, rows: list[tuple[str, int, int, int, str, bool]]) -> None:
        now = time.time()
        self._tx("INSERT INTO migrations (task, round, src, dst, candidate_id, accepted, created) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?)", [(*r[:5], int(r[5]), now) for r in rows])

    def upsert_prompts(self, prompts: list[dict]) -> None:
        self._tx("INSERT OR REPLACE INTO prompts VALUES (?,?,?,?,?,?,?,?,?,?)", [
            (p["id"], p["generation"], json.dumps(p["sections"]), json.dumps(p.get("parents", [])),
             json.dumps(p.get("hints", [])), p.get("uses", 0), p.get("reports", 0), p.get("mean", 0.0),
             p.get("best", 0.0), int(p.get("alive", True))) for p in prompts])

    def save_islands(self, states: list[dict]) -> None:
        now = time.time()
        self._tx("INSERT OR REPLACE INTO islands VALUES (?, ?, ?, ?, ?)",
                 [(s["task"], s["index"], s["generation"], json.dumps(s), now) for s in states])

    # --- reading -------------------------------------------------------------------------------
    def rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        self.db.row_factory = sqlite3.Row
        try:
            return list(self.db.execute(sql, args))
        finally:
            self.db.row_factory = None

    def candidate(self, cand_id: str) -> tuple[Candidate, EvalResult] | None:
        rs = self.rows("SELECT * FROM candidates WHERE id = ?", (cand_id,))
        return _from_row(rs[0]) if rs else None

    def evaluated(self, task: str | None = None) -> list[tuple[Candidate, EvalResult]]:
        q, a = ("SELECT * FROM candidates WHERE task = ? ORDER BY created", (task,)) if task else \
            ("SELECT * FROM candidates ORDER BY created", ())
        return [_from_row(r) for r in self.rows(q, a)]

    # --- recovery (resume) ---------------------------------------------------------------------
    def proposed_keys(self, task: str) -> list[tuple[str, str]]:
        """(hardware, source hash as proposed) of every candidate of a task: never evaluated again."""
        return [(r["hardware"], r["src_hash"]) for r in
                self.rows("SELECT src_hash, hardware FROM candidates WHERE task = ?", (task,))]

    def migration_rounds(self, task: str) -> int:
        return self.rows("SELECT MAX(round) AS m FROM migrations WHERE task = ?", (task,))[0]["m"] or 0

    def island_checkpoints(self, task: str) -> dict[int, dict]:
        """Island index -> the state it last saved."""
        return {r["island"]: json.loads(r["state"]) for r in
                self.rows("SELECT island, state FROM islands WHERE task = ?", (task,))}

    def count(self, table: str) -> int:
        assert table in ("candidates", "migrations", "prompts", "islands", "transitions")
        return self.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


def _from_row(r: sqlite3.Row) -> tuple[Candidate, EvalResult]:
    c = Candidate(task=r["task"], language=r["language"], source=r["source"], params=json.loads(r["params"]),
                  id=r["id"], island=r["island"], parent_id=r["parent_id"], prompt_id=r["prompt_id"],
                  origin=r["origin"], generation=r["generation"], cell=tuple(json.loads(r["cell"])))
    res = EvalResult(candidate_id=r["id"], tier=r["tier"], reason=r["reason"], times=json.loads(r["times"]),
                     ref_times=json.loads(r["ref_times"]), noise=r["noise"],
                     stage_seconds=json.loads(r["stage_seconds"]), facts=json.loads(r["facts"]),
                     hardware=r["hardware"], evaluator=r["evaluator"])
    return c, res
