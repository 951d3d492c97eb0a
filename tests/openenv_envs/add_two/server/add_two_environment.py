"""AddTwo: the reset's seed draws two numbers from 10 to 99; the agent is asked their sum.
One reply: reward 1 when the last integer in it is the sum, else 0."""

import random
import re
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import AnswerAction, QuestionObservation
except ImportError:
    from models import AnswerAction, QuestionObservation


class AddTwo(Environment[AnswerAction, QuestionObservation, State]):
    """Add two two-digit numbers; one reply."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.total = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        a, b = random.Random(seed).sample(range(10, 100), 2)
        self.total = a + b
        self._state = State(episode_id=episode_id, step_count=0)
        question = f"What is {a} + {b}? Reply with the number only."
        return QuestionObservation(prompt=question, reward=0.0)

    def step(self, action: AnswerAction, timeout_s: float | None = None, **_: Any):
        self._state.step_count += 1
        numbers = re.findall(r"-?\d+", action.message)
        right = bool(numbers) and int(numbers[-1]) == self.total
        return QuestionObservation(prompt="", reward=1.0 if right else 0.0, done=True)

    @property
    def state(self) -> State:
        return self._state
