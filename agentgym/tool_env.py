"""`from agentgym.tool_env import ToolEnv, ExpectedCall` keeps working: `ToolEnv` lives in
`agentgym.env.tool_env`."""

from agentgym.env.tool_env import ExpectedCall, ToolEnv, arguments_equal, tool_reward

__all__ = ["ExpectedCall", "ToolEnv", "arguments_equal", "tool_reward"]
