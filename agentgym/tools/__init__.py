"""Tools: typed Python functions (`@tool`), JSON-schema tools (`schema_tool`), MCP servers'
tools (`McpServer`), the `ToolBox` that validates and runs calls, and the tool-call formats
that render tools into a prompt and parse calls out of model text (Hermes, ReAct, and the
model's own format: `agentgym.tools.native`). May import: types, text.
"""

from agentgym.tools.formats import (
    FORMATS,
    HERMES,
    REACT,
    CallAttempt,
    ParsedTurn,
    ToolCallFormat,
    ToolErrorKind,
    ToolResult,
    get_format,
)
from agentgym.tools.function_tools import SchemaTool, schema_tool
from agentgym.tools.mcp import McpServer, McpTool, mcp_server
from agentgym.tools.toolbox import (
    CallOutcome,
    RunnableTool,
    Tool,
    ToolBox,
    error_counts,
    tool,
)

__all__ = [
    "FORMATS",
    "HERMES",
    "REACT",
    "CallAttempt",
    "CallOutcome",
    "McpServer",
    "McpTool",
    "ParsedTurn",
    "RunnableTool",
    "SchemaTool",
    "Tool",
    "ToolBox",
    "ToolCallFormat",
    "ToolErrorKind",
    "ToolResult",
    "error_counts",
    "get_format",
    "mcp_server",
    "schema_tool",
    "tool",
]
