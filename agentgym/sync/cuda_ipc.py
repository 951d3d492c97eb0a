"""CUDA IPC handles, to a receiver in another process on the same GPU: no copy at all.

One handle per tensor (torch's `reduce_tensor`, the way torch.multiprocessing shares
them), pickled to bytes, since vLLM's RPC carries plain values only; the receiver
opens them on its own GPU, which must be the sender's (`open_handles`). Not run in
this project's tests (they have no GPU).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence

import torch

from agentgym.sync import NamedTensors


class CudaIpcTransport:
    """Has `deliver(gpu, handles)`, a call into the receiver's process that returns once it
    has loaded them, open the tensors' handles; the tensors must all be on one CUDA device."""

    name = "cuda_ipc"

    def __init__(self, deliver: Callable[[str, list[tuple[str, bytes]]], object]):
        self.deliver = deliver

    def send(self, named_tensors: NamedTensors) -> None:
        gpu = _gpu_uuid(named_tensors[0][1].device)
        handles = [(name, _ipc_handle(t)) for name, t in named_tensors]
        try:
            self.deliver(gpu, handles)
        finally:
            torch.cuda.ipc_collect()  # the receiver has dropped its views: free what it held


def open_handles(
    gpu: str, handles: Sequence[Sequence], device: torch.device
) -> list[tuple[str, torch.Tensor]]:
    """The receiver's side: the CUDA tensors of `handles`' (name, pickled `reduce_tensor`
    output) rows, shared by a process on the GPU whose UUID is `gpu`, opened on `device`."""
    ours = _gpu_uuid(device)
    if ours != gpu:
        raise RuntimeError(f"CUDA IPC weight sync from GPU {gpu} to an engine on GPU {ours}")
    weights = []
    for name, blob in handles:
        rebuild, args = pickle.loads(blob)
        args = list(args)
        args[6] = device.index  # the sender's index of the same GPU may differ from ours
        weights.append((name, rebuild(*args)))
    return weights


def _gpu_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _ipc_handle(tensor: torch.Tensor) -> bytes:
    """What rebuilds `tensor` in another process on its GPU without a copy, as bytes. The
    tensor must live until the receiver is done."""
    from torch.multiprocessing.reductions import reduce_tensor

    return pickle.dumps(reduce_tensor(tensor.detach()))
