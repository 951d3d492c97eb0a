"""Tools: typed Python functions (`@tool`), the `ToolBox` that validates and runs calls,
and the tool-call formats that render tools into a prompt and parse calls out of model text.
May import: types, text.
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
from agentgym.tools.toolbox import Tool, ToolBox, error_counts, tool

__all__ = [
    "FORMATS",
    "HERMES",
    "REACT",
    "CallAttempt",
    "ParsedTurn",
    "Tool",
    "ToolBox",
    "ToolCallFormat",
    "ToolErrorKind",
    "ToolResult",
    "error_counts",
    "get_format",
    "tool",
]
