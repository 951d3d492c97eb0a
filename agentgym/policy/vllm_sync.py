"""Weight sync into a vLLM engine without files: the learner's tensors reach the engine's
model by one of three routes, chosen by where the engine's worker runs and where the
tensors are.

- Same process (`VLLMPolicy(in_process=True)`, TRL's colocate mode): the tensors
  themselves. vLLM's in-process `collective_rpc` calls the worker method directly,
  so the worker reads the learner's tensors and copies each into the engine's
  parameter; nothing is staged.
- Separate process, CPU tensors: one POSIX shared-memory block holds them all,
  packed at aligned offsets; the RPC carries only plain values (the block's name and
  size, and each tensor's name, dtype, shape and offset), and the worker maps the
  block and rebuilds the tensors as views of it. The block is unlinked when the call
  returns, or fails. vLLM's RPC would otherwise take the tensors as arguments and
  decode them as lists (0.5 GB took 12 s here).
- Separate process, CUDA tensors: a CUDA IPC handle per tensor (torch's
  `reduce_tensor`, the way torch.multiprocessing shares them), opened by the worker on
  its own GPU, which must be the learner's. Not run in this project's tests (they
  have no GPU).

In the worker, every route ends in `WorkerSync.agentgym_reload`: the model's own
`load_weights` between vLLM's layerwise-reload hooks (`Worker.reload_weights`).

One sync of SmolLM2-135M's 0.5 GB on this project's 2-core CPU machine (medians of
`bench/weight_sync.py`): 2.5 s by the safetensors file in /dev/shm these routes
replace, 1.0 s by the shared block, 0.5 s in-process.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import torch

Named = list[tuple[str, torch.Tensor]]
ALIGN = 64
"""Byte alignment of each tensor in a shared block (any dtype's view of it is aligned)."""
SHM_DIR = Path("/dev/shm")
"""Where Linux shows POSIX shared-memory blocks by name: the worker maps a block from here."""


class WorkerSync:
    """Methods vLLM adds to its worker (`worker_extension_cls`), called by `collective_rpc`."""

    def agentgym_reload(self, weights: Named) -> int:
        """Loads `weights` (checkpoint names) into the engine's model in one in-place
        reload; returns how many there were. Sent tensors only in-process: a separate
        worker's RPC would decode them as lists.

        `reload_weights` runs the model's own `load_weights` (which fuses q/k/v and
        gate/up) between vLLM's layerwise-reload hooks, which redo what loading did
        after the checkpoint was read (the CPU backend repacks linear weights for its
        kernels, and a repacked parameter has no loader of its own).
        """
        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=iter(weights), is_checkpoint_format=True
        )
        _reprocess_tied_head(self.model_runner.model)  # type: ignore[attr-defined]
        return len(weights)

    def agentgym_load_shared(self, block: str, size: int, layout: Sequence[Sequence]) -> int:
        """Loads the tensors packed in shared-memory block `block` (`size` bytes), laid
        out as `layout`'s (name, dtype, shape, offset) rows, as views of the block."""
        # A private read-only mapping owned by torch: it goes when the views do. Python's
        # SharedMemory would register the block with a resource tracker here too.
        data = torch.from_file(str(SHM_DIR / block), shared=False, size=size, dtype=torch.uint8)
        weights = []
        for name, dtype_name, shape, offset in layout:
            dtype = getattr(torch, dtype_name)
            assert isinstance(dtype, torch.dtype), f"not a torch dtype: {dtype_name!r}"
            nbytes = _nbytes(shape, dtype)
            weights.append((name, data[offset : offset + nbytes].view(dtype).view(shape)))
        return self.agentgym_reload(weights)

    def agentgym_load_ipc(self, gpu: str, handles: Sequence[Sequence]) -> int:
        """Loads the CUDA tensors of `handles`' (name, pickled `reduce_tensor` output)
        rows, shared by a process on the GPU whose UUID is `gpu`."""
        device = self.device  # type: ignore[attr-defined]
        ours = str(torch.cuda.get_device_properties(device).uuid)
        if ours != gpu:
            raise RuntimeError(f"CUDA IPC weight sync from GPU {gpu} to an engine on GPU {ours}")
        weights = []
        for name, blob in handles:
            rebuild, args = pickle.loads(blob)
            args = list(args)
            args[6] = device.index  # the sender's index of the same GPU may differ from ours
            weights.append((name, rebuild(*args)))
        return self.agentgym_reload(weights)


def _reprocess_tied_head(model) -> None:
    """Redoes the output head's post-load processing when it shares the input embedding.

    A tied head gets no tensor of its own in a reload, so vLLM 0.32's layerwise reload
    puts its old processed tensors back: on CPU that is the GEMM prepacked from the old
    embedding, and the logits came from the old weights (the greedy outputs of the two
    backends parted after any change to the embedding). On a GPU this is a no-op.
    """
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is not None and embed is not None and head.weight is embed.weight:
        head.quant_method.process_weights_after_loading(head)


def send_weights(llm, tensors: Named, *, in_process: bool) -> None:
    """Has `llm`'s worker load `tensors` by the route that fits (see the module docstring)."""
    if not tensors:
        return
    if in_process:
        llm.collective_rpc("agentgym_reload", args=(tensors,))
    elif len({t.device for _, t in tensors}) == 1 and tensors[0][1].is_cuda:
        gpu = str(torch.cuda.get_device_properties(tensors[0][1].device).uuid)
        handles = [(name, _ipc_handle(t)) for name, t in tensors]
        try:
            llm.collective_rpc("agentgym_load_ipc", args=(gpu, handles))
        finally:
            torch.cuda.ipc_collect()  # the worker has dropped its views: free what it held
    else:
        with shared_block(tensors) as block:
            llm.collective_rpc("agentgym_load_shared", args=(block.name, block.size, block.layout))


def _ipc_handle(tensor: torch.Tensor) -> bytes:
    """What rebuilds `tensor` in another process on its GPU without a copy, as bytes: vLLM's
    RPC carries plain values only. The tensor must live until the receiver is done."""
    from torch.multiprocessing.reductions import reduce_tensor

    return pickle.dumps(reduce_tensor(tensor.detach()))


@dataclass(frozen=True)
class SharedBlock:
    """A shared-memory block of packed tensors, in the plain values an RPC carries."""

    name: str
    size: int
    layout: list[tuple[str, str, list[int], int]]
    """Per tensor: (name, dtype as torch names it, shape, byte offset in the block)."""


@contextlib.contextmanager
def shared_block(tensors: Named) -> Iterator[SharedBlock]:
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


def _fill(block: str, tensors: Named, layout: list[Any]) -> None:
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
