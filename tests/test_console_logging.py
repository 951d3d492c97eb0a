"""The library's messages go through `logging`: the command prints them above its progress
bars, AGENTGYM_LOG_LEVEL silences them, and a program routes them like any library's."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from agentgym.cli import main
from agentgym.eval.console import ConsoleHandler, Stages, console_logging
from agentgym.serve.endpoint import check_host

ROOT = Path(__file__).resolve().parents[1]
COMMAND_MODULES = {  # what these print is the command's own output
    "agentgym/cli.py",
    "agentgym/cli_flags.py",  # `agentgym train`: which config the default run reads
    "agentgym/eval/command.py",  # `agentgym eval`: the run's env it plays, the tasks it sizes
    "agentgym/records.py",  # python -m agentgym.records: the metrics table for the docs
    "agentgym/serve/endpoint.py",
    "agentgym/serve/openenv_server.py",  # `agentgym serve-env`: where it serves, and when it stops
    "agentgym/view/view_command.py",
}


@pytest.fixture
def package_logger(monkeypatch):
    """The `agentgym` logger as a fresh process has it, put back after the test."""
    logger = logging.getLogger("agentgym")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.delenv("AGENTGYM_LOG_LEVEL", raising=False)
    return logger


def test_only_the_command_modules_call_print():
    printing = []
    for path in sorted((ROOT / "agentgym").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{name}:{node.lineno}")
    assert printing and {p.split(":")[0] for p in printing} <= COMMAND_MODULES, printing


def test_the_command_prints_info_and_up_above_a_live_progress_bar(package_logger, capsys):
    console_logging()
    console_logging()  # once per process, however often main runs
    assert [type(h) for h in package_logger.handlers] == [ConsoleHandler]
    with Stages() as stages:
        stages.stage("grpo", 3)
        logging.getLogger("agentgym.run.train").info("curriculum: step %d [b]x[/b]", 2)
        logging.getLogger("agentgym.run.train").debug("not shown")
    out = capsys.readouterr().out
    assert "curriculum: step 2 [b]x[/b]" in out  # not read as rich markup
    assert "not shown" not in out
    long = "health: step 3: zero_variance: " + "over half the groups " * 20
    logging.getLogger("agentgym.run.record").warning(long)
    captured = capsys.readouterr()  # no run live: stderr, on one line
    assert captured.err == long + "\n" and captured.out == ""


@pytest.mark.parametrize("level, shown", [("warning", ["b"]), ("ERROR", []), ("debug", ["a", "b"])])
def test_agentgym_log_level_sets_what_the_command_prints(
    package_logger, capsys, monkeypatch, level, shown
):
    monkeypatch.setenv("AGENTGYM_LOG_LEVEL", level)
    console_logging()
    logging.getLogger("agentgym.x").info("a")
    logging.getLogger("agentgym.x").warning("b")
    assert capsys.readouterr().err.split() == shown


def test_a_level_the_program_set_stays_and_records_reach_its_own_handlers(package_logger, caplog):
    package_logger.setLevel(logging.ERROR)
    console_logging()
    assert package_logger.level == logging.ERROR
    with caplog.at_level(logging.WARNING, logger="agentgym"):
        check_host("0.0.0.0", api_key=None)
    (record,) = caplog.records
    assert record.name == "agentgym.serve.endpoint" and record.levelno == logging.WARNING
    assert "0.0.0.0 without --api-key" in record.getMessage()


def test_a_bad_log_level_is_a_clear_error(package_logger, capsys, monkeypatch):
    monkeypatch.setenv("AGENTGYM_LOG_LEVEL", "loud")
    assert main(["envs"]) == 2
    err = capsys.readouterr().err
    assert "AGENTGYM_LOG_LEVEL='loud' is not a level: one of DEBUG, INFO, WARNING, ERROR" in err
