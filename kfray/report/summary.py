"""Summary tables for the terminal (rich), from a summary dict or a run database."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kfray.eval.profile_facts import profile_text
from kfray.report.roofline import roofline_cell, roofline_text


def summary_table(summary: dict) -> Table:
    t = Table(title=f"kfray: {summary['evaluated']} candidates, {summary['islands']} islands, "
                    f"{summary['migrations']} migrations, {summary['prompt_generations']} prompt generations, "
                    f"{summary['wall_seconds']:.0f} s")
    # "best vs ref": the re-timed median; "range": its rounds; "first": what the search measured
    for col in ("task", "best vs ref", "range", "first", "best vs seed", "correct/total", "cells", "migrations"):
        t.add_column(col, justify="left" if col == "task" else "right", no_wrap=True)
    roof = any(s.get("roofline") for s in summary["tasks"].values())
    if roof:                           # CPU runs: the best's share of the measured copy bandwidth / FMA peak
        t.add_column("of roofline", justify="right", no_wrap=True)
    for name, s in summary["tasks"].items():
        dry = " (ran dry)" if s.get("ran_dry") else ""
        spread = s.get("best_spread")
        t.add_row(name + dry,
                  f"{s['best_speedup_vs_reference']:.2f}x" if s["correct"] else "-",
                  f"{spread[0]:.2f}-{spread[1]:.2f}x" if s["correct"] and spread else "-",
                  f"{s['best_speedup_first']:.2f}x" if s["correct"] and s.get("best_speedup_first") else "-",
                  f"{s['best_speedup_vs_seed']:.2f}x" if s["correct"] else "-",
                  f"{s['correct_count']} / {s['evaluated']}", str(s["cells_filled"]), str(s["migrations"]),
                  *([roofline_cell(s.get("roofline"))] if roof else []))
    return t


def print_summary(summary: dict, console: Console | None = None) -> None:
    import sys

    console = console or Console(width=None if sys.stdout.isatty() else 120)
    console.print(summary_table(summary))
    for name, s in summary["tasks"].items():
        if s.get("note"):
            console.print(f"{name}: {s['note']}")
        if s.get("roofline"):
            console.print(f"{name} best: {roofline_text(s['roofline'])}")
        if s.get("profile"):
            console.print(f"{name} best, profiled: {profile_text(s['profile'])}")
