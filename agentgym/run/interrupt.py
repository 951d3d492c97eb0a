"""How a run stops: on SIGTERM and SIGINT, after the step, with a checkpoint; or on an
error it cannot train past (TrainingError).

Preemptible machines and schedulers send SIGTERM and wait a grace period; a
user presses Ctrl-C. The first signal only sets `StopRequest.requested`; the
training loop looks at it after each step, writes a checkpoint and returns. A
second SIGINT (or SIGTERM) raises KeyboardInterrupt at once: the last complete
checkpoint is still there, as every checkpoint is written atomically.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from agentgym.types import TrainingError  # re-exported: it lives with the shared records

__all__ = ["SIGNALS", "StopRequest", "TrainingError"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)

logger = logging.getLogger(__name__)


class StopRequest:
    """Within the block, SIGTERM and SIGINT ask the run to stop after the current step.

    Args:
        say: Tells the user that the stop is under way (by default, this module's
            logger at INFO).
    """

    def __init__(self, say: Callable[[str], None] = logger.info):
        self.say = say
        self.requested: str | None = None  # the name of the first signal
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():  # signals reach only it
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"{name} after {self.requested}: stopping at once")
        self.requested = name
        self.say(
            f"{name}: finishing this step, then writing a checkpoint "
            "(press Ctrl-C again to stop at once)"
        )
