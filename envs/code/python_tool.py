"""`python_tool`: a `python` tool that runs the model's program in a sandbox.

The tool returns what the program printed, so the model can compute, test and
explore. It reports every outcome as text (a status line, then stdout and
stderr), never raising for anything the program did; the sandbox's limits
bound its time, memory and output. The caller owns the sandbox: one sandbox
can serve this tool and a `CodeEnv`'s judging alike.
"""

from __future__ import annotations

from agentgym.sandboxes import Sandbox
from agentgym.tools import Tool, tool

_GRACE_S = 5.0  # the ToolBox's own limit waits this much longer than the sandbox's


def format_result(status: str, exit_code: int | None, stdout: str, stderr: str) -> str:
    """The text the model sees: status and exit code, then the non-empty streams."""
    lines = [f"status: {status}" + (f" (exit code {exit_code})" if exit_code is not None else "")]
    if stdout:
        lines.append(f"stdout:\n{stdout.rstrip()}")
    if stderr:
        lines.append(f"stderr:\n{stderr.rstrip()}")
    if not stdout and not stderr:
        lines.append("(no output; print what you want to see)")
    return "\n".join(lines)


def python_tool(
    sandbox: Sandbox, *, timeout_s: float = 5.0, memory_mb: int = 512, name: str = "python"
) -> Tool:
    """A tool that runs a Python program in `sandbox` and returns its output as text.

    Args:
        sandbox: Where programs run (e.g. `make_sandbox("local")`); not closed by the tool.
        timeout_s: Wall-clock limit of one program.
        memory_mb: Address-space limit of one program.
        name: The tool's name, as the model calls it.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if memory_mb < 16:
        raise ValueError(f"memory_mb must be at least 16, got {memory_mb}")

    def python(code: str) -> str:
        """Runs a Python program in a sandbox (no network, no files kept) and returns its output.

        Args:
            code: The complete program; print() the results you want to see.
        """
        result = sandbox.run(code, timeout_s=timeout_s, memory_mb=memory_mb)
        return format_result(result.status, result.exit_code, result.stdout, result.stderr)

    return tool(python, name=name, timeout_s=timeout_s + _GRACE_S)
