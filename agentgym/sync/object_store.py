"""Ray's object store: one CPU copy of the weights, put once, for every Ray worker to read.

The learner puts a dict of name: CPU tensor (`ObjectStore.send`); each worker is handed
the reference as its call's argument, and Ray resolves it in the worker's process into
that dict, which the worker loads by name. Ray is imported on the first put; the
caller has initialised it.
"""

from __future__ import annotations

from typing import Any

from agentgym.sync import NamedTensors


class ObjectStore:
    """The last weights put into Ray's object store, and their reference."""

    name = "object_store"

    def __init__(self) -> None:
        self.ref: Any = None
        """The ObjectRef of the last weights put; None before the first, and after `drop`."""

    def send(self, named_tensors: NamedTensors) -> None:
        import ray

        self.ref = ray.put({n: t.cpu() for n, t in named_tensors})

    def drop(self) -> None:
        """Lets go of the last weights put: Ray frees them once no call holds them."""
        self.ref = None
