"""An environment that kills the process playing it, once: a rollout worker dying mid-step.

Ray workers import it by name (`ray_envs:ray_envs/CrashOnce-v0`), as they would a
user's environment; the test's Ray puts this folder on their import path.
"""

from __future__ import annotations

import os

import gymnasium as gym
from cli_envs import DigitsEnv


class CrashOnceEnv(DigitsEnv):
    """`DigitsEnv`, but the first step taken anywhere with `marker` ends its process.

    The marker file is created atomically before the exit, so of all the workers
    sharing it exactly one dies, once; a restarted worker plays on normally.
    Without a marker it is `DigitsEnv` (the in-process reference).
    """

    def __init__(self, marker: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker

    def respond(self, action):
        if self.marker is not None:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)  # no cleanup, no exception: as a killed process
        return super().respond(action)


if "ray_envs/CrashOnce-v0" not in gym.registry:
    gym.register(id="ray_envs/CrashOnce-v0", entry_point=CrashOnceEnv, max_episode_steps=1)
