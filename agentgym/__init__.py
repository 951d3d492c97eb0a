"""agentgym: train tool-calling LLM agents with GRPO on verifiable rewards.

Importing the package registers the built-in environments with Gymnasium. `__all__` is the
public surface (docs/api.md lists it); the names below `LAZY` import their module when
first used, so `import agentgym` stays as light as the environment API. Module paths the
docs gave before a move still import, with a DeprecationWarning (`agentgym.moved`).
"""

import importlib
from typing import Any

import gymnasium as gym

from agentgym import moved
from agentgym.env.core import SHORT_NAMES, AgentEnv, Feedback, Task
from agentgym.types import Batch, Message, ToolCall, Trajectory, Turn

__version__ = "0.1.0"

LAZY = {
    "AgentEnvCheckError": "agentgym.env.checker",
    "check_agent_env": "agentgym.env.checker",
    "make_env": "agentgym.env.core",
    "ToolEnv": "agentgym.env.tool_env",
    "ExpectedCall": "agentgym.env.tool_env",
    "tool": "agentgym.tools",
    "schema_tool": "agentgym.tools",
    "mcp_server": "agentgym.tools",
    "make_sandbox": "agentgym.sandboxes",
    "Config": "agentgym.config",
    "ConfigError": "agentgym.config",
    "load_config": "agentgym.config",
    "register_advantage": "agentgym.learn.advantages",
    "register_policy_loss": "agentgym.learn.losses",
    "AgentTask": "agentgym.serve.agents",
    "main": "agentgym.cli",
}

moved.install()


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'agentgym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *LAZY})


if "agentgym/Math-v0" not in gym.registry:
    gym.register(
        id="agentgym/Math-v0",
        entry_point="agentgym.envs.math.env:MathEnv",
    )

if "agentgym/Code-v0" not in gym.registry:
    gym.register(
        id="agentgym/Code-v0",
        entry_point="agentgym.envs.code.env:CodeEnv",
    )

if "agentgym/ToolCall-v0" not in gym.registry:
    gym.register(
        id="agentgym/ToolCall-v0",
        entry_point="agentgym.envs.tool_call.env:ToolCallEnv",
        max_episode_steps=6,
    )

if "agentgym/Mix-v0" not in gym.registry:
    gym.register(id="agentgym/Mix-v0", entry_point="agentgym.env.mixture:EnvMix")

if "agentgym/FunctionCalls-v0" not in gym.registry:
    gym.register(
        id="agentgym/FunctionCalls-v0",
        entry_point="agentgym.envs.function_calls.env:FunctionCallsWorldEnv",
        max_episode_steps=6,
    )

if "agentgym/Tasks-v0" not in gym.registry:
    gym.register(
        id="agentgym/Tasks-v0",
        entry_point="agentgym.envs.tasks.env:make_tasks_env",
        max_episode_steps=6,
    )

if "agentgym/BFCL-v0" not in gym.registry:
    gym.register(
        id="agentgym/BFCL-v0",
        entry_point="agentgym.envs.bfcl_v4.env:BfclEnv",
    )

if "agentgym/OpenEnv-v0" not in gym.registry:
    gym.register(
        id="agentgym/OpenEnv-v0",
        entry_point="agentgym.envs.openenv.env:OpenEnvEnv",
        max_episode_steps=16,
    )

if "agentgym/Harbor-v0" not in gym.registry:
    gym.register(
        id="agentgym/Harbor-v0",
        entry_point="agentgym.envs.harbor.env:HarborEnv",
        max_episode_steps=16,  # HarborEnv's max_turns: its tests run at the last turn
    )

if "agentgym/ToolTalk-v0" not in gym.registry:
    gym.register(
        id="agentgym/ToolTalk-v0",
        entry_point="agentgym.envs.tooltalk.env:ToolTalkEnv",  # ends itself: see its docstring
    )

if "agentgym/BFCLMultiTurn-v0" not in gym.registry:
    gym.register(
        id="agentgym/BFCLMultiTurn-v0",
        entry_point="agentgym.envs.bfcl_multi.env:BFCLMultiTurnEnv",
    )

if "agentgym/Tau2-v0" not in gym.registry:
    gym.register(
        id="agentgym/Tau2-v0",
        entry_point="agentgym.envs.tau2.env:Tau2Env",
        max_episode_steps=40,  # τ²'s orchestrator allows 200 messages; a cut episode scores 0
    )

if "agentgym/Verifiers-v0" not in gym.registry:
    gym.register(
        id="agentgym/Verifiers-v0",
        entry_point="agentgym.envs.verifiers_env.env:VerifiersEnv",
    )

__all__ = [
    "SHORT_NAMES",
    "AgentEnv",
    "AgentEnvCheckError",
    "AgentTask",
    "Batch",
    "Config",
    "ConfigError",
    "ExpectedCall",
    "Feedback",
    "Message",
    "Task",
    "ToolCall",
    "ToolEnv",
    "Trajectory",
    "Turn",
    "check_agent_env",
    "load_config",
    "main",
    "make_env",
    "make_sandbox",
    "mcp_server",
    "register_advantage",
    "register_policy_loss",
    "schema_tool",
    "tool",
]
