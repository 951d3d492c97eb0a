"""Rank 0's lead of a torch.distributed learner: every other rank follows its messages.

Under `torchrun --nproc-per-node N -m agentgym train ...` every process runs
the same command. Rank 0 does everything a single process does (evaluations,
logs, checkpoints, advantages); the other ranks hold a copy of the learner, play
their share of each step's episodes when rank 0 asks (`share_sample`: a DDP
learner sampling in process, `agentgym.scale.samplers.RankSampler`) and step the
learner on the batches rank 0 shares with them (`share_step`, `follow`).

With `distributed.learner: fsdp` no rank holds the weights or the optimizer state
whole; rank 0 has every rank take part when it gathers them, for its sampler
(`share_weights`) and for a checkpoint (`share_state`). So that it can sample and save,
rank 0 keeps a whole copy of the model (`unsharded_copy`), taken before the learner shards
it; after every learner step its sampler gets the trainable weights into it, gathered
from every rank (`share_weights`: with LoRA, the adapters alone). The copy is then what
checkpoints save (`Trainer.model`), in the format one process writes; the optimizer state
is gathered whole only when a checkpoint is written (`share_state`). The copy needs one
device that holds the whole model: FSDP here saves the learner's memory (gradients,
optimizer state, the KL reference), not the sampler's.

In a single process rank 0's side of the protocol (`build_learner`, `share_step`,
`release_followers`) is plain `make()` and `learner.step`. The process group and
its collectives are `agentgym.learn.dist`'s, re-exported here, so the run starts,
leads and shuts down the group through one module.
"""

from __future__ import annotations

import contextlib
import copy
import signal
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from transformers import PreTrainedModel

from agentgym.config import Config
from agentgym.learn.dist import (
    BUCKET_BYTES,
    active,
    all_reduce_sum,
    barrier,
    broadcast_module,
    broadcast_object,
    data_parallel,
    device,
    full_optimizer_state,
    fully_shard_model,
    gather_to_main,
    group_outlived_shutdown,
    init,
    is_main,
    load_full_optimizer_state,
    rank,
    shard,
    shutdown,
    world_size,
)
from agentgym.learn.learner import Learner
from agentgym.learn.lora import wrap_lora
from agentgym.types import Batch

T = TypeVar("T")

__all__ = [
    "BUCKET_BYTES",
    "active",
    "all_reduce_sum",
    "barrier",
    "broadcast_module",
    "broadcast_object",
    "build_learner",
    "data_parallel",
    "device",
    "follow",
    "gather_to_main",
    "full_optimizer_state",
    "fully_shard_model",
    "group_outlived_shutdown",
    "init",
    "is_main",
    "load_full_optimizer_state",
    "rank",
    "release_followers",
    "shard",
    "sharded",
    "share_sample",
    "share_state",
    "share_step",
    "share_weights",
    "shutdown",
    "unsharded_copy",
    "world_size",
]


def sharded(config: Config) -> bool:
    """Whether the learner shards its weights: `distributed.learner` 'fsdp' in a process
    group of more than one (in one process it is the plain learner)."""
    return active() and config.distributed.learner == "fsdp"


def unsharded_copy(model: PreTrainedModel, config: Config) -> PreTrainedModel:
    """A whole copy of `model`, taken before the learner shards it, shaped as the learner
    holds it (LoRA adapters of the same names) and in the same mode (train).

    Its adapters are not the learner's: `share_weights` brings those. The global
    RNG is left as it was, so that the run draws what a DDP run draws.
    """
    whole = copy.deepcopy(model)
    if config.lora.enabled:
        devices = [whole.device] if whole.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            whole = wrap_lora(whole, config)
    return whole.train()


def build_learner(make: Callable[[], Learner]) -> Learner:
    """Rank 0's learner, `make()`: the other ranks' `follow` loops build theirs alongside
    (the learner starts from rank 0's weights, sent as it is built)."""
    broadcast_object(("build", None, None))
    return make()


def share_step(learner: Learner, batch: Batch, beta: float | None = None) -> dict[str, float]:
    """Rank 0's `learner.step`: first sends the batch to the other ranks' `follow` loops.

    Every rank then steps on the same whole batch; the learner takes its share.
    """
    broadcast_object(("step", batch, beta))
    return learner.step(batch, beta=beta)


def share_weights(learner: Learner) -> Iterator[tuple[str, torch.Tensor]]:
    """Rank 0's `learner.named_weights()`, for a policy that samples with its own copy of
    the weights: the other ranks' `follow` loops go through theirs alongside, since a
    sharded learner gathers each weight from every rank. Rank 0 must go through all of them.
    """
    broadcast_object(("weights", None, None))
    return learner.named_weights()


def share_state(learner: Learner) -> dict[str, Any]:
    """Rank 0's `learner.state_dict()`, for a checkpoint: the other ranks' `follow` loops
    take part, since a sharded learner gathers its optimizer state from every rank."""
    broadcast_object(("state", None, None))
    return learner.state_dict()


def share_sample(payload: Any, mine: Callable[[], T]) -> list[T]:
    """Rank 0 has every rank play its share of a step's episodes: sends `payload` to the
    other ranks' `follow` loops (whose `sample` plays their share of it), runs `mine()`
    for its own share, and returns every rank's result, by rank."""
    broadcast_object(("sample", payload, None))
    return gather_to_main(mine())


def release_followers() -> None:
    """Rank 0 tells the other ranks' `follow` loops that the run is over."""
    if is_main():
        broadcast_object(("stop", None, None))


def follow(make: Callable[[], Learner], sample: Callable[[Learner, Any], Any] | None = None) -> int:
    """The whole run of a rank other than 0; returns the learner steps it took.

    It builds its learner with `make()` when rank 0 builds its own (`build_learner`),
    steps it on each batch rank 0 shares (`share_step`), takes part in gathering its
    weights and its optimizer state when rank 0 does (`share_weights`, `share_state`),
    plays its share of a step's episodes with `sample(learner, payload)` when rank 0
    has the ranks sample (`share_sample`), and returns when rank 0 releases it
    (`release_followers`), which may come before any learner is built.
    SIGINT and SIGTERM are ignored meanwhile: rank 0 decides when the run stops
    (after the current step, with a checkpoint), then releases this rank.
    """
    learner, steps = None, 0
    with _ignoring_signals():
        while True:
            message: tuple[str, Any, Any] = broadcast_object(("", None, None))
            kind, batch, beta = message
            if kind == "stop":
                return steps
            if kind == "build":
                learner = make()
            elif learner is None:
                raise RuntimeError(f"rank 0 sent {kind!r} before building its learner")
            elif kind == "step":
                learner.step(batch, beta=beta)
                steps += 1
            elif kind == "weights":
                for _ in learner.named_weights():
                    pass
            elif kind == "state":
                learner.state_dict()
            elif kind == "sample" and sample is not None:
                gather_to_main(sample(learner, batch))
            else:
                raise RuntimeError(f"unknown message from rank 0: {kind!r}")


@contextlib.contextmanager
def _ignoring_signals() -> Iterator[None]:
    previous: dict[int, Any] = {
        s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
