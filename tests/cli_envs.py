"""An environment the CLI tests load through `module:Env-v0`, the way users add their own.

Its reward varies even under a random model (the share of sampled characters
that are digits), so a GRPO step has non-zero advantages to learn from.
"""

from __future__ import annotations

import gymnasium as gym

from agentgym.core import AgentEnv, Feedback, Task


class DigitsEnv(AgentEnv):
    """Rewards the share of digits in the reply: a dense reward for smoke runs."""

    def num_tasks(self, split):
        return 10

    def task_id(self, split, index):
        return f"digits/{split}/{index}"

    def load_task(self, task_id):
        return Task(task_id=task_id, prompt=f"Write digits only ({task_id}).")

    def respond(self, action):
        share = sum(c.isdigit() for c in action) / max(len(action), 1)
        return Feedback((), reward=share, reward_parts={"digits": share}, terminated=True)


if "cli_envs/Digits-v0" not in gym.registry:
    gym.register(id="cli_envs/Digits-v0", entry_point=DigitsEnv, max_episode_steps=1)
