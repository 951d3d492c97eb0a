"""One session with an MCP server: the coroutines that open, use and close it.

They run on the server's event loop (`agentgym.tools.mcp` owns the loop, its thread
and the restarts); the session is held by one task, so a crash or a broken
connection ends that task and every call waiting on it sees the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Connection", "McpToolError", "reason", "result_text"]


class McpToolError(RuntimeError):
    """An MCP tool reported an error (`isError`); the message is the server's."""


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


def reason(err: BaseException) -> str:
    """`Type: message` of an error, of the first one inside an exception group."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


@dataclass(eq=False)
class Connection:
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
