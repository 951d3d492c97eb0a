"""MCP servers as tool sources, over stdio and over streamable HTTP on a loopback port.

The server is tests/mcp_server.py (the SDK's MCPServer), run as a subprocess.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'agentgym[mcp]')")

from agentgym.tools import CallAttempt, McpServer, ToolBox, ToolErrorKind, ToolResult, mcp_server
from agentgym.tools.mcp import McpStartError
from agentgym.types import ToolCall

try:
    import psutil
except ImportError:  # the checks fall back to /proc
    psutil = None

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def call(name: str, **arguments: object) -> CallAttempt:
    return CallAttempt(ToolCall(name, arguments), None)


def run_one(box: ToolBox, attempt: CallAttempt) -> ToolResult:
    [result] = box.run([attempt])
    return result


def gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether `pid` is dead (a zombie counts: the sandbox's init may never reap it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def children() -> set[int]:
    """Our descendants' pids, live ones only."""
    if psutil is not None:
        found = psutil.Process().children(recursive=True)
        return {p.pid for p in found if p.status() != psutil.STATUS_ZOMBIE}
    found, todo = set(), [os.getpid()]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            for pid in map(int, (task / "children").read_text().split()):
                if not gone(pid, 0):
                    found.add(pid)
                    todo.append(pid)
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpServer:
    """tests/mcp_server.py serving streamable HTTP on a loopback port, as a subprocess."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> HttpServer:
        argv = [sys.executable, SERVER, "http", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the HTTP MCP server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module", params=["stdio", "http"])
def server(request):
    """One server per transport, shared by the tests that do not break it."""
    if request.param == "stdio":
        with McpServer([sys.executable, SERVER, "stdio"]) as srv:
            yield srv
        return
    http = HttpServer().start()
    try:
        with McpServer(url=http.url) as srv:
            yield srv
    finally:
        http.kill()


class Fresh:
    """A server of its own, for a test that kills it."""

    def __init__(self, transport: str):
        self.http = HttpServer().start() if transport == "http" else None
        where = (
            {"url": self.http.url} if self.http else {"command": [sys.executable, SERVER, "stdio"]}
        )
        self.srv = mcp_server({**where, "timeout_s": 3.0})
        self.box = ToolBox(self.srv.tools())

    def kill(self) -> None:
        """Kills the server process, as a crash would."""
        if self.http is not None:
            self.http.kill()
        else:
            os.kill(int(run_one(self.box, call("whoami")).content), signal.SIGKILL)

    def restart(self) -> None:
        """Starts the HTTP server again; the McpServer restarts a stdio one itself."""
        if self.http is not None:
            self.http.start()


@pytest.fixture(params=["stdio", "http"])
def fresh(request):
    made = Fresh(request.param)
    yield made
    made.srv.close()
    if made.http is not None:
        made.http.kill()


def test_tools_come_with_the_servers_schemas(server):
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == {"add", "nap", "explode", "lines", "point", "whoami", "family"}
    assert tools["add"].schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"title": "A", "type": "integer"},
                    "b": {"title": "B", "type": "integer"},
                },
                "required": ["a", "b"],
                "title": "addArguments",
            },
        },
    }


def test_calls_return_text_joined_blocks_and_structured_content_as_json(server):
    box = ToolBox(server.tools())
    assert box.run([call("add", a=2, b=40), call("lines", n=3), call("point", x=2)]) == [
        ToolResult("add", "42", None),
        ToolResult("lines", "line 0\nline 1\nline 2", None),
        ToolResult("point", '{"x": 2, "y": [2, 2]}', None),
    ]


def test_arguments_are_checked_against_the_input_schema_before_the_call(server):
    box = ToolBox(server.tools())
    assert box.run([call("add", a="2", b=1), call("add", a=1)]) == [
        ToolResult(
            "add",
            "Error: invalid arguments for 'add': argument 'a': '2' is not of type 'integer'. "
            "Expected add(a: integer, b: integer)",
            ToolErrorKind.INVALID_ARGUMENTS,
        ),
        ToolResult(
            "add",
            "Error: invalid arguments for 'add': missing required argument 'b'. "
            "Expected add(a: integer, b: integer)",
            ToolErrorKind.INVALID_ARGUMENTS,
        ),
    ]


def test_an_is_error_result_is_a_tool_raised_result_with_the_servers_message(server):
    result = run_one(ToolBox(server.tools()), call("explode", reason="kaboom"))
    assert result == ToolResult(
        "explode",
        "Error: 'explode' raised McpToolError: Error executing tool explode: kaboom",
        ToolErrorKind.TOOL_RAISED,
    )


def test_a_call_past_its_limit_times_out_and_the_server_comes_back(server):
    box = ToolBox(server.tools(), default_timeout_s=0.5)
    before = int(run_one(box, call("whoami")).content)
    start = time.monotonic()
    result = run_one(box, call("nap", seconds=30))
    assert time.monotonic() - start < 0.5 + 1.0
    assert result == ToolResult(
        "nap", "Error: tool 'nap' did not finish within 0.5 s", ToolErrorKind.TIMEOUT
    )
    box = ToolBox(server.tools())  # the default limit: room to start again
    assert run_one(box, call("add", a=1, b=2)) == ToolResult("add", "3", None)
    if server.url is None:  # stdio: the hung server was killed and another one started
        assert gone(before)
        assert int(run_one(box, call("whoami")).content) != before


def test_a_server_killed_mid_call_is_an_error_and_the_next_call_works(fresh):
    threading.Timer(0.3, fresh.kill).start()
    result = run_one(fresh.box, call("nap", seconds=30))
    assert result.error is ToolErrorKind.TOOL_RAISED
    assert "stopped or the connection broke" in result.content
    fresh.restart()
    assert run_one(fresh.box, call("add", a=1, b=2)) == ToolResult("add", "3", None)


def test_a_server_that_is_down_is_an_error_result_until_it_is_back(fresh):
    fresh.kill()
    result = run_one(fresh.box, call("add", a=1, b=2))
    assert result.error is ToolErrorKind.TOOL_RAISED
    fresh.restart()
    assert run_one(fresh.box, call("add", a=1, b=2)) == ToolResult("add", "3", None)


def test_close_leaves_no_process_thread_or_connection_and_may_be_repeated(fresh):
    before = children()
    if fresh.http is None:  # a stdio server, with a child of its own that would outlive it
        family = json.loads(run_one(fresh.box, call("family")).content)
    else:
        assert run_one(fresh.box, call("add", a=1, b=2)) == ToolResult("add", "3", None)
    fresh.srv.close()
    fresh.srv.close()
    assert children() <= before
    assert not [t for t in threading.enumerate() if t.name == f"agentgym-mcp-{fresh.srv.name}"]
    if fresh.http is None:
        assert gone(family["server"]) and gone(family["child"])
    if psutil is not None:
        ours = psutil.Process().net_connections(kind="tcp")
        assert [c for c in ours if c.status == psutil.CONN_LISTEN] == []
        port = fresh.http.port if fresh.http else None
        assert [c for c in ours if c.raddr and c.raddr.port == port] == []
    # used again after close, it starts again
    assert run_one(fresh.box, call("add", a=1, b=2)) == ToolResult("add", "3", None)


def test_a_forgotten_server_is_stopped_when_collected():
    srv = McpServer([sys.executable, SERVER, "stdio"])
    pid = int(run_one(ToolBox(srv.tools()), call("whoami")).content)
    del srv
    gc.collect()
    assert gone(pid)


def test_a_server_that_cannot_start_is_an_error_not_an_exception_in_the_toolbox():
    srv = McpServer([sys.executable, "-c", "pass"], name="quits")
    with pytest.raises(McpStartError, match="MCP server 'quits' could not be started"):
        srv.tools()
    assert srv.call("add", {"a": 1}, 5.0).raised is not None
    srv.close()
    with pytest.raises(McpStartError, match="no program 'no-such-mcp-server' on PATH"):
        McpServer(["no-such-mcp-server"]).tools()
    with pytest.raises(McpStartError, match="ConnectError"):
        McpServer(url=f"http://127.0.0.1:{free_port()}/mcp").tools()


SPECS = {
    "unknown field": ({"command": ["x"], "args": []}, "unknown field 'args'; valid: command, url"),
    "neither": ({"env": {}}, "give one of 'command' \\(stdio\\) and 'url'"),
    "both": ({"command": ["x"], "url": "http://h/mcp"}, "give one of 'command'"),
    "command a string": ({"command": "python srv.py"}, "'command' must be a non-empty list"),
    "command empty": ({"command": []}, "'command' must be a non-empty list"),
    "env not strings": ({"command": ["x"], "env": {"N": 1}}, "'env' must be an object of strings"),
    "url not http": ({"url": "ftp://h"}, "'url' must be an http:// or https:// URL"),
    "env with a url": ({"url": "http://h/mcp", "cwd": "/"}, "'env' and 'cwd' go with a 'command'"),
    "timeout": ({"url": "http://h/mcp", "timeout_s": 0}, "'timeout_s' must be a positive number"),
    "not a mapping": (["python"], "must be a mapping"),
}


@pytest.mark.parametrize(("spec", "says"), SPECS.values(), ids=SPECS)
def test_a_bad_spec_is_refused_naming_the_field(spec, says):
    with pytest.raises(ValueError, match=says):
        mcp_server(spec)


def test_the_sdk_is_imported_only_when_a_server_starts():
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "import agentgym, agentgym.tools\n"
        "from agentgym.tools import McpServer\n"
        "try:\n"
        "    McpServer(['python']).tools()\n"
        "except ImportError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "MCP servers need the MCP SDK: pip install 'agentgym[mcp]'\n"
