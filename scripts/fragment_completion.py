"""How many of a run's LLM kernels that failed to compile would have compiled made whole from their
parent (kfray.proposers.fragments), measured on the run's own database.

    python scripts/fragment_completion.py RUN_DIR [RUN_DIR ...]

For each LLM candidate (origin llm:*) the compiler rejected, the answer is completed from its
parent as the proposer now does, its parameters picked as the proposer picks them, and built with
the CPU backend's own compile. Prints a table per run.
"""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kfray.config import EvalConfig
from kfray.eval.backends.base import CompileError
from kfray.eval.backends.cpu import CpuBackend
from kfray.proposers.fragments import complete_from_parent
from kfray.proposers.llm import LLMProposer

TIER_COMPILE_ERROR = 1


def rows(db: Path) -> list[tuple[str, str, dict]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    by_id = {i: (src, json.loads(p or "{}")) for i, src, p in con.execute("select id, source, params from candidates")}
    out = []
    for cid, parent, src, tier, origin in con.execute(
            "select id, parent_id, source, tier, origin from candidates where origin like 'llm:%'"):
        if tier == TIER_COMPILE_ERROR and parent in by_id:
            out.append((src, by_id[parent][0], by_id[parent][1]))
    return out


def builds(backend: CpuBackend, source: str, params: dict) -> bool:
    try:
        backend.compile(source, params, None)
        return True
    except CompileError:
        return False


def main(argv: list[str]) -> int:
    backend = CpuBackend(EvalConfig())
    table = Table(title="LLM kernels the compiler rejected, made whole from their parent")
    for col in ("run", "rejected", "borrowing from the parent", "compile made whole", "most borrowed"):
        table.add_column(col)
    for run in argv:
        got = rows(Path(run) / "kfray.db")
        borrowing = compiled = 0
        names: dict[str, int] = {}
        for src, parent_src, parent_params in got:
            whole, borrowed = complete_from_parent(src, parent_src)
            if not borrowed:
                continue
            borrowing += 1
            for n in borrowed:
                names[n] = names.get(n, 0) + 1
            compiled += builds(backend, whole, LLMProposer._pick_params(whole, parent_params))
        top = ", ".join(f"{n} {c}" for n, c in sorted(names.items(), key=lambda kv: -kv[1])[:4])
        table.add_row(run, str(len(got)), str(borrowing), str(compiled), top)
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
