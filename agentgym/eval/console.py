"""What a run shows on the terminal: a progress bar per stage, and report tables."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentgym.eval.report import comparison_lines, table_rows
from agentgym.records import Report


class Stages:
    """One progress bar per stage of a run (evaluations, SFT, GRPO), on one console."""

    def __init__(self):
        # Without a live terminal (a log file, a pipe) rich assumes 80 columns; tables need more.
        console = Console() if Console().is_terminal else Console(width=150)
        self.bar = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.names: dict[Any, str] = {}
        self.started: dict[Any, float] = {}

    def __enter__(self) -> Stages:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def stage(self, name: str, total: int):
        """A new bar; returns its id for `advance` and `note`."""
        self.names[task := self.bar.add_task(name, total=total, note="")] = name
        self.started[task] = time.perf_counter()
        return task

    def advance(self, task, count: int = 1) -> None:
        self.bar.advance(task, count)

    def note(self, task, text: str, *, done: bool = False) -> None:
        """Shows `text` beside the bar. Without a live terminal (a log file, a pipe), where
        bars are not redrawn, it is also printed as a line, as is every finished stage."""
        self.bar.update(task, note=text)
        if done or not self.bar.console.is_terminal:
            seconds = time.perf_counter() - self.started[task]
            self.bar.console.print(f"{self.names[task]}: {text} ({seconds:.0f} s)")

    def print(self, text: str) -> None:
        self.bar.console.print(text)


def print_report(report: Report, console: Console) -> None:
    """Prints the report's table (one row per model) and its comparisons."""
    header, rows = table_rows(report)
    table = Table(title="held-out evaluation (greedy)")
    for column in header:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in comparison_lines(report):
        console.print(line)
