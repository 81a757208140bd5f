"""A rich progress bar for a run: candidates evaluated, each task's best speedup so far."""
from __future__ import annotations


class Progress:
    def __init__(self, enabled: bool, total: int, ledger):
        self.bar, self.ledger = None, ledger
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeElapsedColumn

        self.bar = Bar(TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
        self.bar.start()
        self.task = self.bar.add_task("search", total=total, info="")

    def advance(self, n: int) -> None:
        if self.bar:
            self.bar.advance(self.task, n)

    def update(self) -> None:
        if self.bar:
            info = "  ".join(f"{ref}: {t.best[1].speedup:.2f}x" if t.best and t.best[1].correct else f"{ref}: -"
                             for ref, t in self.ledger.tasks.items())
            self.bar.update(self.task, info=f"best {info}")

    def close(self) -> None:
        if self.bar:
            done = self.bar.tasks[0].completed
            self.bar.update(self.task, total=done)
            self.bar.stop()
