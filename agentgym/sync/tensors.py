"""The tensors themselves, to a receiver in the learner's process: nothing staged or copied.

A vLLM engine in the learner's process (`VLLMPolicy(in_process=True)`, TRL's colocate
mode) takes this route: vLLM's in-process `collective_rpc` calls the worker's method
directly, so the worker reads the learner's tensors and copies each into the engine's
parameter.
"""

from __future__ import annotations

from collections.abc import Callable

from agentgym.sync import NamedTensors


class InProcessTensors:
    """Hands the tensors as they are to `deliver`, a call into the receiver in this process
    that returns once the receiver has loaded them."""

    name = "tensors"

    def __init__(self, deliver: Callable[[NamedTensors], object]):
        self.deliver = deliver

    def send(self, named_tensors: NamedTensors) -> None:
        self.deliver(named_tensors)
