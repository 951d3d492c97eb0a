"""agentgym: train tool-calling LLM agents with GRPO on verifiable rewards.

Importing the package registers the built-in environments with Gymnasium.
"""

import gymnasium as gym

from agentgym.env.core import SHORT_NAMES, AgentEnv, Feedback, Task
from agentgym.types import Batch, Message, ToolCall, Trajectory, Turn

__version__ = "0.1.0"

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

if "agentgym/Tasks-v0" not in gym.registry:
    gym.register(
        id="agentgym/Tasks-v0",
        entry_point="agentgym.envs.tasks.env:make_tasks_env",
        max_episode_steps=6,
    )

__all__ = [
    "AgentEnv",
    "Batch",
    "Feedback",
    "Message",
    "SHORT_NAMES",
    "Task",
    "ToolCall",
    "Trajectory",
    "Turn",
]
