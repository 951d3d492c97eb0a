"""EchoDigit: the reset's seed names a digit; the agent is asked to say it. A reply holding
the digit ends the episode with reward 1; any other gets 0 and one more try (two at most)."""

import threading
import time
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import PromptObservation, SayAction
except ImportError:
    from models import PromptObservation, SayAction


class EchoDigit(Environment[SayAction, PromptObservation, State]):
    """Say the digit the seed names; two tries."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    hold = threading.Event()  # while set, every step waits (a server that stops answering)

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.digit = "0"

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self.digit = str((seed or 0) % 10)
        self._state = State(episode_id=episode_id, step_count=0)
        return PromptObservation(prompt=f"Say the digit {self.digit}.", reward=0.0)

    def step(self, action: SayAction, timeout_s: float | None = None, **_: Any):
        while EchoDigit.hold.is_set():
            time.sleep(0.05)
        self._state.step_count += 1
        said = self.digit in action.message
        done = said or self._state.step_count >= 2
        prompt = "Right." if said else f"No: say {self.digit}."
        return PromptObservation(prompt=prompt, reward=1.0 if said else 0.0, done=done)

    @property
    def state(self) -> State:
        return self._state
