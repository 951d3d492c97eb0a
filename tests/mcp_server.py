"""A small MCP server for tests/test_mcp.py, run as `python mcp_server.py stdio` or
`python mcp_server.py http PORT` (streamable HTTP on 127.0.0.1:PORT/mcp)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult

server = MCPServer("agentgym-test", log_level="WARNING")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
async def nap(seconds: float) -> str:
    """Sleeps, then says so."""
    await asyncio.sleep(seconds)
    return "slept"


@server.tool()
def explode(reason: str) -> str:
    """Always fails, with the reason."""
    raise ToolError(reason)


@server.tool()
def lines(n: int) -> CallToolResult:
    """Returns n text blocks and no structured content."""
    return CallToolResult(content=[{"type": "text", "text": f"line {i}"} for i in range(n)])


@server.tool()
def point(x: int) -> CallToolResult:
    """Returns structured content only."""
    return CallToolResult(content=[], structured_content={"x": x, "y": [x, x]})


@server.tool()
def whoami() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
def family() -> dict[str, int]:
    """Starts a child process that outlives the call; returns its pid and the server's."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return {"server": os.getpid(), "child": child.pid}


if __name__ == "__main__":
    if sys.argv[1:] == ["stdio"]:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
