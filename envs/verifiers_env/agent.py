"""The agent program that plays `agentgym/Verifiers-v0`: the verifiers harness itself,
pointed at this episode's path on the endpoint with its key (`make_player` chooses it for
the env)."""

from __future__ import annotations

from typing import Any, cast

from agentgym.envs.verifiers_env.env import VerifiersEnv
from agentgym.types import AgentReward


async def play(client: Any, task: Any) -> AgentReward:
    """Runs the verifiers episode of `task` with its model calls sent to `client`'s base
    URL; its reward and reward parts (rewards, and metrics as `metric/<name>`). `task` is
    the `agentgym.serve.agents.AgentTask` (not imported: `envs` stands below `serve`)."""
    env = cast(VerifiersEnv, task.env)
    reward, parts = await env.play(str(client.base_url), task.id, client.api_key)
    return AgentReward(reward, parts)
