"""Tools: typed Python functions (`@tool`), the `ToolBox` that validates and runs calls,
and the tool-call formats that render tools into a prompt and parse calls out of model text.
May import: types, text.
"""

from agentgym.tools.toolbox import (
    FORMATS,
    HERMES,
    REACT,
    CallAttempt,
    ParsedTurn,
    Tool,
    ToolBox,
    ToolCallFormat,
    ToolErrorKind,
    ToolResult,
    error_counts,
    get_format,
    tool,
)

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
