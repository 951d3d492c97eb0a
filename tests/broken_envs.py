"""Environments that fail on purpose, for the failure policy's tests (`module:Env-v0` ids).

`BrokenEnv(fails=...)` raises in `step` ("step"), in `reset` ("reset"), hangs in
`step` for `hang_s` seconds ("hang"), or fails only on the tasks whose index is odd
("odd": a quarter to a half of a step's episodes, by the seeds drawn). Otherwise it
rewards the share of digits in the reply, as `cli_envs.DigitsEnv`.
"""

from __future__ import annotations

import time

import gymnasium as gym

from agentgym.env.core import AgentEnv, Feedback, Task


class BrokenEnv(AgentEnv):
    """A one-turn digits task whose `reset` or `step` fails as `fails` says."""

    def __init__(self, fails: str = "step", hang_s: float = 30.0, **kwargs):
        super().__init__(**kwargs)
        self.fails, self.hang_s, self.index = fails, hang_s, 0

    def num_tasks(self, split):
        return 8

    def task_id(self, split, index):
        return f"broken/{split}/{index}"

    def load_task(self, task_id):
        if self.fails == "reset":
            raise OSError(f"the task store is unreachable ({task_id})")
        self.index = int(task_id.rsplit("/", 1)[1])
        return Task(task_id=task_id, prompt=f"Write digits only ({task_id}).")

    def respond(self, action):
        if self.fails == "step" or (self.fails == "odd" and self.index % 2):
            raise RuntimeError("the tool backend is down")
        if self.fails == "hang":
            time.sleep(self.hang_s)
        share = sum(c.isdigit() for c in action) / max(len(action), 1)
        return Feedback((), reward=share, reward_parts={"digits": share}, terminated=True)


if "broken_envs/Broken-v0" not in gym.registry:
    gym.register(id="broken_envs/Broken-v0", entry_point=BrokenEnv, max_episode_steps=1)
