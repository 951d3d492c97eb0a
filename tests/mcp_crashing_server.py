"""An MCP server that starts, lists one tool, and dies on every call to it, for
tests/test_mcp_restarts.py: `python mcp_crashing_server.py STARTS_FILE`. Each start
appends a line to STARTS_FILE, so a test counts the starts."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("agentgym-crashing", log_level="WARNING")


@server.tool()
def crash() -> str:
    """Ends the server's process at once, as a crash would."""
    os._exit(1)


if __name__ == "__main__":
    with open(sys.argv[1], "a") as starts:
        starts.write("started\n")
    server.run("stdio")
