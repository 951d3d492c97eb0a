"""Environments: `AgentEnv`, `Task` and `Feedback`, observation and action spaces, name
resolution, the checker every environment passes, and `ToolEnv` (tool-use tasks).
May import: types, config, tools, rewards, sandboxes.
"""
