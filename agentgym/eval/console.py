"""What a run shows on the terminal: a progress bar per stage, report tables, and the
library's log messages, which `agentgym` routes here (`console_logging`).

agentgym's modules say what happens through `logging` (loggers under `agentgym`), never
with a bare `print`: a program that uses the library silences or routes them as it does
any library's (`logging.getLogger("agentgym").setLevel(logging.WARNING)`), and the
command prints them above its progress bars, at the level `AGENTGYM_LOG_LEVEL` names.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from typing import Any, ClassVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentgym.config import ConfigError
from agentgym.eval.report import TABLE_COLUMNS, comparison_lines, table_rows
from agentgym.records import Report

LEVEL_VARIABLE = "AGENTGYM_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Stages:
    """One progress bar per stage of a run (evaluations, SFT, GRPO), on one console.

    While the bars are live, log records that `ConsoleHandler` prints go above them.
    """

    live: ClassVar[Stages | None] = None  # the innermost live one

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
        self.outer, Stages.live = Stages.live, self
        return self

    def __exit__(self, *exc) -> None:
        Stages.live = self.outer
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


class ConsoleHandler(logging.Handler):
    """Prints log records on the live `Stages` console, above its bars (warnings in
    yellow, errors in red), or on stderr when no run is live; never as rich markup, as
    messages quote tool text and model output, and one record a line, not wrapped at the
    console's width (a log file is read with grep)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            live = Stages.live
            console = live.bar.console if live is not None else Console(stderr=True)
            level = record.levelno
            style = (
                "red" if level >= logging.ERROR else "yellow" if level >= logging.WARNING else None
            )
            console.print(text, markup=False, highlight=False, style=style, soft_wrap=True)
        except Exception:
            self.handleError(record)


def console_logging() -> None:
    """The command's logging: records of the `agentgym` loggers are printed by one
    `ConsoleHandler`, from INFO up, or from the level `AGENTGYM_LOG_LEVEL` names; a level
    a program set on the `agentgym` logger before stays unless the variable is set.

    Raises:
        ConfigError: the variable names no level.
    """
    logger = logging.getLogger("agentgym")
    if not any(isinstance(h, ConsoleHandler) for h in logger.handlers):
        logger.addHandler(ConsoleHandler())
    level = os.environ.get(LEVEL_VARIABLE, "").strip().upper()
    if level and level not in LEVELS:
        raise ConfigError(
            f"{LEVEL_VARIABLE}={os.environ[LEVEL_VARIABLE]!r} is not a level: "
            f"one of {', '.join(LEVELS)}"
        )
    if level:
        logger.setLevel(level)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def quiet_libraries() -> None:
    """The commands' console without the libraries' own progress bars ("Loading weights",
    "Writing model shards": transformers' and huggingface_hub's, off unless
    HF_HUB_DISABLE_PROGRESS_BARS says otherwise) and transformers' FutureWarnings, which
    speak to its own API, not to the user's run. Before transformers is imported."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")
    loaded = sys.modules.get("transformers.utils.logging")  # imported already: told directly
    if loaded is not None and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        loaded.disable_progress_bar()


def table_title(report: Report, *, sampled: bool) -> str:
    """What the table holds: the split (held-out where it is the test split), greedy figures,
    and, where tasks were sampled, pass@k and maj@k over how many samples a task."""
    split = report.meta.get("split", "test")
    title = "held-out evaluation (test split)" if split == "test" else f"evaluation ({split} split)"
    title += ": greedy"
    n = report.meta.get("n")
    return title + (f", then pass@k and maj@k of {n} samples a task" if sampled and n else "")


def print_report(report: Report, console: Console) -> None:
    """Prints the report's table (one row per model) and its comparisons."""
    header, rows = table_rows(report)
    table = Table(title=table_title(report, sampled=len(header) > 2 + len(TABLE_COLUMNS)))
    for column in header:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for line in comparison_lines(report):
        console.print(line)
