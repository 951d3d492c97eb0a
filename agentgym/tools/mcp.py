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

A stdio server runs in a process group of its own, killed whole (SIGKILL) on a timeout
and after the SDK's shutdown on `close()`, so its children do not outlive it. On POSIX
the command is started through `/bin/sh`, which notes the group's id and `exec`s it.

Arguments are checked against each tool's `inputSchema` first, as for `schema_tool`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.tools.schema import JsonArguments
from agentgym.tools.toolbox import CallOutcome

__all__ = ["McpServer", "McpStartError", "McpTool", "McpToolError", "mcp_server", "result_text"]

STOP_TIMEOUT_S = 10.0  # the most close() waits for a session's shutdown
_CONNECTION_CLOSED = -32000  # the JSON-RPC error code the SDK gives calls on a closed connection


def _strings(values: Any) -> bool:
    return not isinstance(values, str) and all(isinstance(v, str) for v in values)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


_SPEC: dict[str, tuple[str, Callable[[Any], bool]]] = {  # field: (what is valid, its check)
    "command": ("a non-empty list of strings", lambda v: _strings(v) and bool(v)),
    "url": ("an http:// or https:// URL", lambda v: str(v).startswith(("http://", "https://"))),
    "env": ("an object of strings", lambda v: isinstance(v, Mapping) and _strings(v.values())),
    "cwd": ("a directory", lambda v: isinstance(v, str | os.PathLike)),
    "name": ("a string", lambda v: isinstance(v, str)),
    "timeout_s": ("a positive number", _positive),
    "startup_timeout_s": ("a positive number", _positive),
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


class McpToolError(RuntimeError):
    """An MCP tool reported an error (`isError`); the message is the server's."""


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
    ):
        given = {"command": command, "url": url, "env": env, "cwd": cwd, "name": name}
        limits = {"timeout_s": timeout_s, "startup_timeout_s": startup_timeout_s}
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
    `{"url": "http://..."}`, each optionally with "name", "timeout_s", "startup_timeout_s";
    ValueError naming the field for an unknown field or a value not valid."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"an MCP server spec must be a mapping, got {type(spec).__name__}")
    _check_spec(spec, "MCP server spec")
    return McpServer(**spec)


def result_text(result: Mapping[str, Any]) -> str:
    """The text the model sees of a `CallToolResult` (as JSON, camelCase keys): its text
    blocks, joined by newlines; without text, its structured content as JSON; other
    blocks (images, audio) as placeholders like `[image/png image]`."""
    texts, others = [], []
    for block in result.get("content") or []:
        kind = block.get("type")
        text = block.get("text", block.get("resource", {}).get("text"))
        if isinstance(text, str):
            texts.append(text)
        else:
            mime = block.get("mimeType", block.get("resource", {}).get("mimeType", ""))
            others.append(f"[{mime} {kind}]" if mime else f"[{kind}]")
    if texts:
        return "\n".join(texts)
    if result.get("structuredContent") is not None:
        return json.dumps(result["structuredContent"], ensure_ascii=False)
    return "\n".join(others)


@dataclass(eq=False)
class _Runtime:
    """A server's loop thread and live connection, apart from the server for its finalizer."""

    command: list[str] | None
    url: str | None
    env: dict[str, str] | None
    cwd: str | None
    name: str
    startup_timeout_s: float
    lock: threading.RLock = field(default_factory=threading.RLock)
    loop: asyncio.AbstractEventLoop | None = None
    thread: threading.Thread | None = None
    conn: _Connection | None = None
    stopping: list[concurrent.futures.Future[None]] = field(default_factory=list)  # shutdowns

    def connect(self) -> tuple[_Connection, asyncio.AbstractEventLoop]:
        """The live connection, opened (the server started) if there is none."""
        with self.lock:
            if self.conn is not None and self.loop is not None:
                return self.conn, self.loop
            sdk = _sdk()
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
                why = f"could not be started or reached: {_reason(err)}"
                if isinstance(err, TimeoutError) and not ready.done():
                    why = f"did not start within {self.startup_timeout_s:g} s"
                ready.cancel()
                self._drop(conn, grace_s=0)
                raise McpStartError(f"MCP server {self.name!r} {why}") from err
            self.conn = conn
            return conn, self.loop

    def _transport(self, sdk: Any) -> tuple[_Connection, Any]:
        if self.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return _Connection(None), streamable_http_client(self.url)
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
        return _Connection(pidfile), sdk.stdio_client(params, errlog=sys.__stderr__ or sys.stderr)

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        try:
            conn, loop = self.connect()
        except Exception as err:  # McpStartError, or ImportError without the SDK
            return CallOutcome(raised=err)
        future = asyncio.run_coroutine_threadsafe(conn.call(tool, arguments), loop)
        try:
            return CallOutcome(text=future.result(timeout_s))
        except Exception as err:
            if isinstance(err, TimeoutError) and not future.done():
                future.cancel()
                self._drop(conn)
                return CallOutcome(timed_out=True)
            code = getattr(getattr(err, "error", None), "code", None)
            if isinstance(err, McpToolError) or (code is not None and code != _CONNECTION_CLOSED):
                return CallOutcome(raised=err)  # the server answered: the session is fine
            self._drop(conn)
            again = "connects again" if self.url else "starts it again"
            why = f"the MCP server {self.name!r} stopped or the connection broke ({_reason(err)})"
            return CallOutcome(raised=ConnectionError(f"{why}; the next call {again}"))

    def list_tools(self) -> list[dict[str, Any]]:
        conn, loop = self.connect()
        future = asyncio.run_coroutine_threadsafe(conn.list_tools(_sdk()), loop)
        try:
            return future.result(self.startup_timeout_s)
        except Exception as err:
            future.cancel()
            self._drop(conn)
            why = f"did not list its tools: {_reason(err)}"
            raise McpStartError(f"MCP server {self.name!r} {why}") from err

    def _drop(self, conn: _Connection, grace_s: float = STOP_TIMEOUT_S) -> None:
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


def _reason(err: BaseException) -> str:
    """`Type: message` of an error, of the first one inside an exception group."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


@dataclass(eq=False)
class _Connection:
    """One session with the server; its coroutines run on the server's event loop."""

    pidfile: Path | None  # where /bin/sh writes the process group's id
    pgid: int | None = None
    session: Any = None
    holder: asyncio.Task[None] | None = None  # the task that owns the transport and session
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def kill(self) -> None:
        """Kills the stdio server's process group, all of it, at once (from any thread)."""
        if self.pgid is None and self.pidfile is not None:
            with contextlib.suppress(OSError, ValueError):
                self.pgid = int(self.pidfile.read_text())
            shutil.rmtree(self.pidfile.parent, ignore_errors=True)
        if self.pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, signal.SIGKILL)

    async def open(self, transport: Any, sdk: Any) -> None:
        """Starts the task that holds the session; returns once the session is initialized."""
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.holder = asyncio.create_task(self.hold(transport, sdk, ready))
        await ready

    async def hold(self, transport: Any, sdk: Any, ready: asyncio.Future[None]) -> None:
        """Opens the session, reports it ready, and keeps it until `stop` (or until it breaks)."""
        try:
            async with AsyncExitStack() as stack:
                streams = await stack.enter_async_context(transport)
                session = await stack.enter_async_context(sdk.ClientSession(*streams[:2]))
                await session.initialize()
                self.session = session
                if not ready.done():
                    ready.set_result(None)
                await self.stop.wait()
        except Exception as err:  # a crash or a broken connection: calls see `holder` end
            if not ready.done():
                ready.set_exception(err)
        finally:
            if not ready.done():  # cancelled while starting
                ready.cancel()

    async def call(self, tool: str, arguments: dict[str, Any]) -> str:
        """The text of one call's result; McpToolError if the tool reported an error."""
        assert self.holder is not None
        request = asyncio.ensure_future(self.session.call_tool(tool, arguments))
        try:
            await asyncio.wait({request, self.holder}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                raise ConnectionError("the session ended")
            result = request.result().model_dump(mode="json", by_alias=True)
        finally:
            request.cancel()
        text = result_text(result)
        if result.get("isError"):
            raise McpToolError(text or "the tool reported an error")
        return text

    async def list_tools(self, sdk: Any) -> list[dict[str, Any]]:
        """Every tool the server lists, as JSON (camelCase keys), following pages."""
        tools: list[dict[str, Any]] = []
        params = None
        for _ in range(100):  # a server that pages forever cannot hang us
            page = await self.session.list_tools(params=params)
            data = page.model_dump(mode="json", by_alias=True, exclude_none=True)
            tools += data["tools"]
            if not data.get("nextCursor"):
                break
            params = sdk.types.PaginatedRequestParams(cursor=data["nextCursor"])
        return tools

    async def close(self, grace_s: float) -> None:
        """Ends the session by the SDK's shutdown, or by cancelling it after `grace_s`."""
        self.stop.set()
        if self.holder is not None and not (await asyncio.wait({self.holder}, timeout=grace_s))[0]:
            self.holder.cancel()
            await asyncio.wait({self.holder}, timeout=1.0)
