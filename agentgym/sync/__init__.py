"""Weight sync: every route by which the learner's weights reach a copy that samples with them.

Each route is a `Transport`: the learner's side calls `send(named_tensors)`; the
receiving side turns what arrived back into (name, tensor) pairs with its module's
opener and loads them by name. Which route is taken:

- A vLLM engine in the learner's process (`VLLMPolicy(in_process=True)`, the default
  on a GPU): the tensors themselves (`tensors`); the engine's worker is handed them.
- A vLLM engine in its own process, the tensors all on one CUDA device: a CUDA IPC
  handle per tensor (`cuda_ipc`); the worker calls `open_handles`.
- A vLLM engine in its own process otherwise (the default on CPU): one POSIX
  shared-memory block (`shared_memory`); the worker calls `open_block`.
- Ray rollout workers with `distributed.weight_sync: object_store` (the default), a
  worker restarted by Ray, and a collective sync that failed: Ray's object store
  (`object_store`); Ray hands each worker the weights as its call's argument.
- Ray rollout workers with `distributed.weight_sync: collective`: a torch.distributed
  broadcast group of the learner and the workers (`collective`); each worker calls
  `SyncGroup.receive`.

`vllm_worker` chooses among the three vLLM routes (`send_weights`) and holds the
engine worker's side of them (`WorkerSync`), where each ends in one in-place reload.
`agentgym.scale.ray_rollout` chooses between the two Ray routes, and falls back from
the collective to the store. `buckets` cuts tensors into runs that travel as one flat
buffer each, for the collective here and for `agentgym.learn.dist.broadcast_module`
(the learner's ranks under torchrun).

Not here: rank 0's whole copy of an FSDP-sharded learner (`agentgym.scale.ranks`).
It is built with the learner's LoRA wrapping, its weights are gathered by the learner's
own collectives (`agentgym.scale.ranks.share_weights`), and it takes them as any
transformers policy does, by `load_weights`.

May import: types, config, compat; vLLM and Ray only inside functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

NamedTensors = Sequence[tuple[str, torch.Tensor]]
"""Tensors by name (checkpoint or parameter names), in the learner's order."""


class Transport(Protocol):
    """The learner's side of one route to the copies that sample."""

    name: str
    """What the route is called where a run reports it (`rollout/sync_path`)."""

    def send(self, named_tensors: NamedTensors) -> None:
        """Sends `named_tensors`; returns once they may change: every receiver has taken
        them, or (the object store) a copy of them is held for the receivers to take."""
        ...
