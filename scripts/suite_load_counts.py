"""How many tasks of each public-suite folder kfray loads, why the others do not, and how long the
loading took: the check that the loaders keep up with the suites' real files.

    python scripts/suite_load_counts.py /tmp/kb/KernelBench [ROBUST_KBENCH_TASKS_DIR ...]

A KernelBench root (a folder holding level1 .. level4, or its parent) gives one row per level; any
other folder (robust-kbench tasks) one row. Loaded tasks that kf_forward kernels cannot take (half
precision: task.suite.functional_error) are counted apart, since only other kernel forms run them.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

from kfray.tasks import discover, load_task


def folders(root: Path) -> list[Path]:
    """The level folders of a KernelBench root, else the folder itself."""
    for base in (root, root / "KernelBench"):
        levels = sorted((p for p in base.glob("level*") if p.is_dir()), key=lambda p: int(p.name[5:] or 0)
                        if p.name[5:].isdigit() else 99)
        if levels:
            return levels
    return [root]


def reason_kind(err: str) -> str:
    """A short key that groups like failures: the message less its file path and details."""
    msg = err.split("\n")[0]
    msg = re.sub(r"^\S+?(\.py|/)?( \(configuration [^)]*\))?: ", "", msg, count=1)
    if m := re.search(r"needs the package \S+", msg):
        return m.group(0) + ("" if "network" not in msg else " + network weights")
    if "needs model weights from the network" in msg:
        return "needs model weights from the network"
    return ": ".join(msg.split(": ")[:2])[:90]


def count(folder: Path) -> dict:
    t0 = time.perf_counter()
    found = discover(str(folder))
    wall = time.perf_counter() - t0
    ok = [r for r, e in found if e is None]
    suite_only = sum(1 for r in ok if getattr(load_task(r), "suite", None) and load_task(r).suite.functional_error)
    reasons = Counter(reason_kind(e) for _, e in found if e)
    return {"folder": folder, "ok": len(ok), "total": len(found), "suite_only": suite_only, "reasons": reasons,
            "wall": wall, "failed": [(r, e) for r, e in found if e]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="a KernelBench root or level folder; robust-kbench task folders")
    p.add_argument("-v", "--verbose", action="store_true", help="also print every failing file with its message")
    args = p.parse_args(argv)
    rows = [count(f) for root in args.paths for f in folders(Path(root))]
    w = max(len(str(r["folder"])) for r in rows)
    print(f"{'folder':<{w}}  {'loads':>9}  {'no kf_forward':>13}  {'wall s':>7}  reasons (count)")
    for r in rows:
        why = "; ".join(f"{k} ({n})" for k, n in r["reasons"].most_common()) or "-"
        print(f"{str(r['folder']):<{w}}  {r['ok']:>4}/{r['total']:<4}  {r['suite_only']:>13}  {r['wall']:>7.1f}  {why}")
    if args.verbose:
        for r in rows:
            for ref, err in r["failed"]:
                print(f"\n{ref}\n  {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
