"""MCP servers as tool sources: `McpServer(...).tools()` are tools the `ToolBox` runs.

A server is a command spoken to over stdio (`McpServer(["python", "srv.py"])`) or a
streamable HTTP endpoint (`McpServer(url=...)`); `mcp_server(spec)` builds one from a
config dict. It starts on first use; `close()`, a `with` block, garbage collection and
interpreter exit stop it.

Each server has a thread running an event loop that holds the session of the official
`mcp` SDK (an optional dependency: `pip install 'agentgym[mcp]'`); each call is submitted
to that loop and waited for at most the tool's time limit. Nothing reaches the ToolBox as
an exception: a result flagged `isError` is a TOOL_RAISED result with the server's
message; a call past its limit is a TIMEOUT and kills the server; a crashed server or a
broken connection is a TOOL_RAISED result. The next call starts the server again (over
HTTP: connects again); starting has its own limit, `startup_timeout_s`.

A server that keeps failing is not started again on every call: each crash, broken
connection or failed start in a row (no call answered in between) is followed by a
restart only after a backoff (`restart_delay`: 0.5 s, doubling), and after
`max_restarts` of them (default 3) the server is given up: its calls answer a
TOOL_RAISED result at once, for the rest of the server's life. A call past its limit
does not count: the call's input may be what hung the server.

A stdio server runs in a process group of its own, killed whole (SIGKILL) on a timeout
and after the SDK's shutdown on `close()`, so its children do not outlive it. On POSIX
the command is started through `/bin/sh`, which notes the group's id and `exec`s it.

Arguments are checked against each tool's `inputSchema` first, as for `schema_tool`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.tools.mcp_session import Connection, McpToolError, reason, result_text
from agentgym.tools.schema import JsonArguments
from agentgym.tools.toolbox import CallOutcome

__all__ = ["McpServer", "McpStartError", "McpTool", "McpToolError", "mcp_server", "result_text"]

STOP_TIMEOUT_S = 10.0  # the most close() waits for a session's shutdown
RESTART_BACKOFF_S = 0.5  # the wait before the first restart in a row; it doubles each time
_CONNECTION_CLOSED = -32000  # the JSON-RPC error code the SDK gives calls on a closed connection


def _strings(values: Any) -> bool:
    return not isinstance(values, str) and all(isinstance(v, str) for v in values)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def restart_delay(failures: int) -> float:
    """Seconds to wait before starting a server again after `failures` (>= 1) in a row."""
    return RESTART_BACKOFF_S * 2.0 ** (failures - 1)


_SPEC: dict[str, tuple[str, Callable[[Any], bool]]] = {  # field: (what is valid, its check)
    "command": ("a non-empty list of strings", lambda v: _strings(v) and bool(v)),
    "url": ("an http:// or https:// URL", lambda v: str(v).startswith(("http://", "https://"))),
    "env": ("an object of strings", lambda v: isinstance(v, Mapping) and _strings(v.values())),
    "cwd": ("a directory", lambda v: isinstance(v, str | os.PathLike)),
    "name": ("a string", lambda v: isinstance(v, str)),
    "timeout_s": ("a positive number", _positive),
    "startup_timeout_s": ("a positive number", _positive),
    "max_restarts": ("a whole number >= 0", _count),
}


def _check_spec(spec: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first field of `spec` that is unknown or not valid."""
    for key, value in spec.items():
        if key not in _SPEC:
            raise ValueError(f"{where}: unknown field {key!r}; valid: {', '.join(_SPEC)}")
        what, valid = _SPEC[key]
        if value is not None and not valid(value):
            raise ValueError(f"{where}: {key!r} must be {what}, got {value!r}")
    if (spec.get("command") is None) == (spec.get("url") is None):
        raise ValueError(f"{where}: give one of 'command' (stdio) and 'url' (streamable HTTP)")
    if spec.get("url") is not None and (spec.get("env"), spec.get("cwd")) != (None, None):
        raise ValueError(f"{where}: 'env' and 'cwd' go with a 'command', not a 'url'")


class McpStartError(RuntimeError):
    """An MCP server could not be started or reached, or did not list its tools."""


@dataclass(frozen=True, eq=False)
class McpTool:
    """One tool of an MCP server, as the ToolBox runs it; get them from `McpServer.tools()`."""

    name: str
    description: str
    arguments: JsonArguments  # its `parameters` are the tool's `inputSchema`
    server: McpServer = field(repr=False)
    timeout_s: float | None = None

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Hermes function schema; parameters are the server's `inputSchema`."""
        parameters = json.loads(json.dumps(self.arguments.parameters))
        function = {"name": self.name, "description": self.description, "parameters": parameters}
        return {"type": "function", "function": function}

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """The arguments, if the tool's `inputSchema` allows them, or what is wrong."""
        return self.arguments.check(arguments)

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        """Calls the tool on the server; never raises (see the module)."""
        return self.server.call(self.name, arguments, timeout_s)


class McpServer:
    """One MCP server: a command spoken to over stdio, or a streamable HTTP URL.

    Args:
        command: The server's argv, e.g. `["python", "srv.py"]`; or give `url`.
        url: The streamable HTTP endpoint, e.g. `"http://127.0.0.1:8000/mcp"`.
        env: Extra environment variables for the command (the SDK passes only a few
            of ours, such as PATH and HOME, besides these).
        cwd: The command's working directory.
        name: Names the server in messages; the command's or the URL's by default.
        timeout_s: Time limit of each of its tools' calls; None for the ToolBox's default.
        startup_timeout_s: Time limit for starting (or connecting) and listing tools.
        max_restarts: Restarts after failures in a row (crashes, broken connections,
            failed starts) before the server is given up (see the module).
    """

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
        timeout_s: float | None = None,
        startup_timeout_s: float = 30.0,
        max_restarts: int = 3,
    ):
        given = {"command": command, "url": url, "env": env, "cwd": cwd, "name": name}
        limits = {"timeout_s": timeout_s, "startup_timeout_s": startup_timeout_s}
        limits |= {"max_restarts": max_restarts}
        _check_spec(given | limits, "McpServer")
        default_name = " ".join([Path(command[0]).name, *command[1:]]) if command else url
        self.name: str = name or str(default_name)
        self.command = list(command) if command is not None else None
        self.url, self.timeout_s = url, timeout_s
        self._runtime = _Runtime(
            command=self.command,
            url=url,
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            name=self.name,
            startup_timeout_s=startup_timeout_s,
            max_restarts=max_restarts,
        )
        weakref.finalize(self, self._runtime.close)

    def __repr__(self) -> str:
        where = self.url or self.command
        return f"McpServer({self.name!r}, {where!r})"

    def __enter__(self) -> McpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tools(self) -> list[McpTool]:
        """The server's tools, with their schemas; starts the server if it is not running.

        Raises:
            McpStartError: The server could not be started or did not list its tools.
            ValueError: A tool's `inputSchema` is not a valid JSON schema.
        """
        tools = []
        for t in self._runtime.list_tools():
            arguments = JsonArguments(t.get("inputSchema") or {"type": "object"}, t["name"])
            description = t.get("description") or ""
            tools.append(McpTool(t["name"], description, arguments, self, self.timeout_s))
        return tools

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        """Calls `tool` and waits at most `timeout_s` (None: no limit); never raises."""
        return self._runtime.call(tool, arguments, timeout_s)

    def close(self) -> None:
        """Stops the server (or closes the HTTP session) and its thread; safe to call again."""
        self._runtime.close()


def mcp_server(spec: Mapping[str, Any]) -> McpServer:
    """An `McpServer` from a config dict: `{"command": [...], "env": {...}, "cwd": "..."}` or
    `{"url": "http://..."}`, each optionally with "name", "timeout_s", "startup_timeout_s",
    "max_restarts";
    ValueError naming the field for an unknown field or a value not valid."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"an MCP server spec must be a mapping, got {type(spec).__name__}")
    _check_spec(spec, "MCP server spec")
    return McpServer(**spec)


@dataclass(eq=False)
class _Runtime:
    """A server's loop thread and live connection, apart from the server for its finalizer."""

    command: list[str] | None
    url: str | None
    env: dict[str, str] | None
    cwd: str | None
    name: str
    startup_timeout_s: float
    max_restarts: int = 3
    failures: int = 0  # crashes, broken connections and failed starts since a call answered
    last_failure: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)
    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None
    conn: Connection | None = None
    stopping: list[concurrent.futures.Future[None]] = field(default_factory=list)  # shutdowns

    def connect(self) -> tuple[Connection, asyncio.AbstractEventLoop]:
        """The live connection, opened (the server started) if there is none; after
        failures in a row, only once their backoff has passed, and never past
        `max_restarts` of them (McpStartError)."""
        with self.lock:
            if self.conn is not None and self.loop is not None:
                return self.conn, self.loop
            if self.failures > self.max_restarts:
                raise McpStartError(
                    f"MCP server {self.name!r} failed {self.failures} times in a row and is "
                    f"not started again (max_restarts={self.max_restarts}); the last "
                    f"failure: {self.last_failure}"
                )
            if self.failures:
                time.sleep(restart_delay(self.failures))
            sdk = _sdk()
            try:
                conn = self._open(sdk)
            except McpStartError as err:
                self._failed(str(err))
                raise
            assert self.loop is not None  # _open started it
            self.conn = conn
            return conn, self.loop

    def _open(self, sdk: Any) -> Connection:
        """Starts the loop's thread if need be, and the server; its initialized session."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(
                target=self.loop.run_forever, name=f"agentgym-mcp-{self.name}", daemon=True
            )
            self.thread.start()
        conn, transport = self._transport(sdk)
        ready = asyncio.run_coroutine_threadsafe(conn.open(transport, sdk), self.loop)
        try:
            ready.result(self.startup_timeout_s)
        except Exception as err:
            why = f"could not be started or reached: {reason(err)}"
            if isinstance(err, TimeoutError) and not ready.done():
                why = f"did not start within {self.startup_timeout_s:g} s"
            ready.cancel()
            self._drop(conn, grace_s=0)
            raise McpStartError(f"MCP server {self.name!r} {why}") from err
        return conn

    def _failed(self, why: str) -> str:
        """Counts a failure in a row; what the next call does about it."""
        with self.lock:
            self.failures += 1
            self.last_failure = why
            if self.failures > self.max_restarts:
                return f"it is not started again (max_restarts={self.max_restarts})"
        return "the next call connects again" if self.url else "the next call starts it again"

    def _transport(self, sdk: Any) -> tuple[Connection, Any]:
        if self.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return Connection(None), streamable_http_client(self.url)
        assert self.command is not None
        program = self.command[0]
        if os.sep not in program and not shutil.which(program, path=(self.env or {}).get("PATH")):
            raise McpStartError(f"MCP server {self.name!r}: no program {program!r} on PATH")
        argv, pidfile = self.command, None
        if os.name == "posix":  # /bin/sh notes its pid, the new group's id, then becomes the server
            pidfile = Path(tempfile.mkdtemp(prefix="agentgym-mcp-")) / "pgid"
            argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(pidfile), *argv]
        params = sdk.StdioServerParameters(
            command=argv[0], args=argv[1:], env=self.env, cwd=self.cwd
        )
        return Connection(pidfile), sdk.stdio_client(params, errlog=sys.__stderr__ or sys.stderr)

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        try:
            conn, loop = self.connect()
        except Exception as err:  # McpStartError, or ImportError without the SDK
            return CallOutcome(raised=err)
        future = asyncio.run_coroutine_threadsafe(conn.call(tool, arguments), loop)
        try:
            text = future.result(timeout_s)
        except Exception as err:
            if isinstance(err, TimeoutError) and not future.done():
                future.cancel()
                self._drop(conn)
                return CallOutcome(timed_out=True)
            code = getattr(getattr(err, "error", None), "code", None)
            if isinstance(err, McpToolError) or (code is not None and code != _CONNECTION_CLOSED):
                self.failures = 0
                return CallOutcome(raised=err)  # the server answered: the session is fine
            self._drop(conn)
            why = f"the MCP server {self.name!r} stopped or the connection broke ({reason(err)})"
            return CallOutcome(raised=ConnectionError(f"{why}; {self._failed(why)}"))
        self.failures = 0
        return CallOutcome(text=text)

    def list_tools(self) -> list[dict[str, Any]]:
        conn, loop = self.connect()
        future = asyncio.run_coroutine_threadsafe(conn.list_tools(_sdk()), loop)
        try:
            return future.result(self.startup_timeout_s)
        except Exception as err:
            future.cancel()
            self._drop(conn)
            why = f"MCP server {self.name!r} did not list its tools: {reason(err)}"
            self._failed(why)
            raise McpStartError(why) from err

    def _drop(self, conn: Connection, grace_s: float = STOP_TIMEOUT_S) -> None:
        """Kills the connection's server and shuts its session down in the background."""
        conn.kill()
        with self.lock:
            if self.conn is conn:
                self.conn = None
            self.stopping = [f for f in self.stopping if not f.done()]
            if self.loop is not None:
                closing = asyncio.run_coroutine_threadsafe(conn.close(grace_s), self.loop)
                self.stopping.append(closing)

    def close(self) -> None:
        with self.lock:
            conn, loop, thread = self.conn, self.loop, self.thread
            self.conn, self.loop, self.thread = None, None, None
            stopping, self.stopping = self.stopping, []
        if loop is None or thread is None:
            return
        if conn is not None:
            stopping.append(asyncio.run_coroutine_threadsafe(conn.close(STOP_TIMEOUT_S), loop))
        if threading.current_thread() is not thread:  # (a finalizer may run on any thread)
            concurrent.futures.wait(stopping, timeout=STOP_TIMEOUT_S)
        if conn is not None:
            conn.kill()  # what the server left running in its group
        asyncio.run_coroutine_threadsafe(_stop_loop(), loop)
        if threading.current_thread() is not thread:
            thread.join(STOP_TIMEOUT_S)
            if not thread.is_alive():
                loop.close()


async def _stop_loop() -> None:
    """Cancels the loop's other tasks, waits for them (briefly), and stops the loop."""
    rest = asyncio.all_tasks() - {asyncio.current_task()}
    for task in rest:
        task.cancel()
    if rest:
        await asyncio.wait(rest, timeout=1.0)
    asyncio.get_running_loop().stop()


def _sdk() -> Any:
    try:
        import mcp
    except ImportError as err:
        raise ImportError("MCP servers need the MCP SDK: pip install 'agentgym[mcp]'") from err
    return mcp
