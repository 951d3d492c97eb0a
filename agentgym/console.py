"""What a run shows on the terminal: a progress bar per stage, and report tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentgym.heldout import comparison_lines, table_rows


class Stages:
    """One progress bar per stage of a run (evaluations, SFT, GRPO), on one console."""

    def __init__(self):
        self.bar = Progress(
            TextColumn("[bold]{task.description:<14}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
        )

    def __enter__(self) -> Stages:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def stage(self, name: str, total: int):
        return self.bar.add_task(name, total=total, note="")

    def print(self, text: str) -> None:
        self.bar.console.print(text)


def print_report(report: Mapping[str, Any], console: Console) -> None:
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
