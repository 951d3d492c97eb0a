"""One POSIX shared-memory block, to a receiver in another process on the same machine.

The block holds every tensor, packed at aligned offsets; the call into the receiver
carries only plain values (the block's name and size, and each tensor's name, dtype,
shape and offset), and the receiver maps the block and rebuilds the tensors as views
of it (`open_block`). The block is unlinked when the call returns, or fails. vLLM's
RPC would otherwise take the tensors as arguments and decode them as lists (0.5 GB
took 12 s here).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import torch

from agentgym.sync import NamedTensors

ALIGN = 64
"""Byte alignment of each tensor in a shared block (any dtype's view of it is aligned)."""
SHM_DIR = Path("/dev/shm")
"""Where Linux shows POSIX shared-memory blocks by name: the receiver maps a block from here."""


@dataclass(frozen=True)
class SharedBlock:
    """A shared-memory block of packed tensors, in the plain values an RPC carries."""

    name: str
    size: int
    layout: list[tuple[str, str, list[int], int]]
    """Per tensor: (name, dtype as torch names it, shape, byte offset in the block)."""


class SharedMemoryTransport:
    """Packs the tensors into a new shared block and has `deliver(name, size, layout)`, a
    call into the receiver's process that returns once it has loaded them, read it."""

    name = "shared_memory"

    def __init__(self, deliver: Callable[[str, int, list[Any]], object]):
        self.deliver = deliver

    def send(self, named_tensors: NamedTensors) -> None:
        with shared_block(named_tensors) as block:
            self.deliver(block.name, block.size, block.layout)


@contextlib.contextmanager
def shared_block(tensors: NamedTensors) -> Iterator[SharedBlock]:
    """Within the block, a new shared-memory block holding a copy of `tensors`; it is
    unlinked on the way out, so it is gone once every process has unmapped it."""
    layout, size = [], 0
    for name, t in tensors:
        layout.append((name, str(t.dtype).removeprefix("torch."), list(t.shape), size))
        size += -(-_nbytes(t.shape, t.dtype) // ALIGN) * ALIGN
    size = max(size, 1)  # a block is never empty
    memory = SharedMemory(create=True, size=size)
    try:
        _fill(memory.name, tensors, layout)
        yield SharedBlock(memory.name, size, layout)
    finally:
        memory.close()
        memory.unlink()


def open_block(block: str, size: int, layout: Sequence[Sequence]) -> list[tuple[str, torch.Tensor]]:
    """The receiver's side: the tensors packed in block `block` (`size` bytes), laid out
    as `layout`'s (name, dtype, shape, offset) rows, as views of the block."""
    # A private read-only mapping owned by torch: it goes when the views do. Python's
    # SharedMemory would register the block with a resource tracker here too.
    data = torch.from_file(str(SHM_DIR / block), shared=False, size=size, dtype=torch.uint8)
    weights = []
    for name, dtype_name, shape, offset in layout:
        dtype = getattr(torch, dtype_name)
        assert isinstance(dtype, torch.dtype), f"not a torch dtype: {dtype_name!r}"
        nbytes = _nbytes(shape, dtype)
        weights.append((name, data[offset : offset + nbytes].view(dtype).view(shape)))
    return weights


def _fill(block: str, tensors: NamedTensors, layout: list[Any]) -> None:
    """Writes each tensor's bytes at its offset through the block's descriptor: there the
    kernel copies, where a copy through a mapping takes a page fault every 4 KiB (four
    times slower here)."""
    fd = os.open(SHM_DIR / block, os.O_WRONLY)
    try:
        for (_, t), (_, _, _, offset) in zip(tensors, layout, strict=True):
            data = t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data
            while data:  # a write may stop short of a large tensor's end
                done = os.pwrite(fd, data, offset)
                data, offset = data[done:], offset + done
    finally:
        os.close(fd)


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize
