"""An MCP server that keeps crashing is restarted a bounded number of times, each after a
longer wait, then given up: its calls answer an error at once instead of starting it again."""

from __future__ import annotations

import os
import signal
import sys
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'agentgym[mcp]')")

import agentgym.tools.mcp as mcp_module  # noqa: E402
from agentgym.tools import CallAttempt, ToolBox, ToolErrorKind, mcp_server  # noqa: E402
from agentgym.tools.mcp import restart_delay  # noqa: E402
from agentgym.types import ToolCall  # noqa: E402

CRASHING = str(Path(__file__).with_name("mcp_crashing_server.py"))
CRASH = CallAttempt(ToolCall("crash", {}), None)


def test_the_restart_delay_starts_at_half_a_second_and_doubles():
    assert [restart_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]


def test_a_server_crashing_on_every_call_is_restarted_max_restarts_times_then_given_up(
    tmp_path, monkeypatch
):
    starts = tmp_path / "starts"
    waits: list[float] = []
    # the waits are recorded, not slept: the test checks the schedule, not the clock
    monkeypatch.setattr(mcp_module, "time", types.SimpleNamespace(sleep=waits.append))
    srv = mcp_server({"command": [sys.executable, CRASHING, str(starts)], "max_restarts": 2,
                      "timeout_s": 20.0, "name": "crashy"})  # fmt: skip
    try:
        box = ToolBox(srv.tools())
        results = [box.run([CRASH])[0] for _ in range(3)]  # the first start, 2 restarts
        assert len(starts.read_text().splitlines()) == 3
        assert all(r.error is ToolErrorKind.TOOL_RAISED for r in results)
        assert "the next call starts it again" in results[0].content
        assert "it is not started again (max_restarts=2)" in results[2].content
        assert waits == [0.5, 1.0]
        begun = time.monotonic()
        given_up = [box.run([CRASH])[0] for _ in range(3)]
        assert time.monotonic() - begun < 1.0  # answered at once, nothing started
    finally:
        srv.close()
    assert len(starts.read_text().splitlines()) == 3 and waits == [0.5, 1.0]
    for result in given_up:
        assert result.error is ToolErrorKind.TOOL_RAISED
        assert "MCP server 'crashy' failed 3 times in a row and is not started again" in (
            result.content
        )


def test_a_call_answered_between_crashes_starts_the_count_again(tmp_path, monkeypatch):
    from test_mcp import SERVER  # the ordinary test server: whoami, add, ...

    waits: list[float] = []
    monkeypatch.setattr(mcp_module, "time", types.SimpleNamespace(sleep=waits.append))
    with mcp_server({"command": [sys.executable, SERVER, "stdio"], "max_restarts": 1}) as srv:
        box = ToolBox(srv.tools())
        for _ in range(3):  # three crashes, each followed by an answered call
            pid = int(box.run([CallAttempt(ToolCall("whoami", {}), None)])[0].content)
            os.kill(pid, signal.SIGKILL)
            crashed = box.run([CallAttempt(ToolCall("add", {"a": 1, "b": 2}), None)])[0]
            assert "the next call starts it again" in crashed.content
        answered = box.run([CallAttempt(ToolCall("add", {"a": 1, "b": 2}), None)])[0]
    assert answered.content == "3"
    assert waits == [0.5, 0.5, 0.5]  # never past the first restart's wait


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_max_restarts_must_be_a_whole_number(value):
    with pytest.raises(ValueError, match="'max_restarts' must be a whole number >= 0"):
        mcp_server({"command": ["x"], "max_restarts": value})
