"""Gymnasium spaces for chat-message observations and free-text actions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from agentgym.types import ROLES

_WORDS = ("the", "answer", "is", "\\boxed{", "}", "42", "Thought:", "Action:", "{", "}", "7", "\n")


class Utterance(spaces.Space[str]):
    """Any text the agent may say: a str of at most `max_length` characters.

    Unlike `gymnasium.spaces.Text`, no character set is imposed: model output
    is arbitrary unicode.
    """

    def __init__(self, max_length: int = 100_000, seed: int | np.random.Generator | None = None):
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(1, 20))
        return " ".join(str(self.np_random.choice(_WORDS)) for _ in range(n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"Utterance(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Utterance) and other.max_length == self.max_length


class ChatMessages(spaces.Space[list[dict[str, str]]]):
    """A list of chat messages: dicts with a `role` from ROLES and a str `content`."""

    def __init__(self, max_messages: int = 1024, seed: int | np.random.Generator | None = None):
        self.max_messages = max_messages
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[dict[str, str]]:
        n = int(self.np_random.integers(1, 4))
        roles = ("user", "tool")
        return [
            {"role": str(self.np_random.choice(roles)), "content": f"message {i}"} for i in range(n)
        ]

    def contains(self, x: Any) -> bool:
        if not isinstance(x, Sequence) or isinstance(x, str) or len(x) > self.max_messages:
            return False
        return all(
            isinstance(m, dict)
            and m.get("role") in ROLES
            and isinstance(m.get("content"), str)
            and set(m) <= {"role", "content", "name"}
            for m in x
        )

    def __repr__(self) -> str:
        return f"ChatMessages(max_messages={self.max_messages})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ChatMessages) and other.max_messages == self.max_messages
