"""Weight sync into a vLLM engine without files: the route that fits, and the worker's side.

The learner's tensors reach the engine's model by one of three routes, chosen by
where the engine's worker runs and where the tensors are (`engine_route`):

- Same process (`VLLMPolicy(in_process=True)`, TRL's colocate mode): the tensors
  themselves (`agentgym.sync.tensors`).
- Separate process, CUDA tensors on one device: a CUDA IPC handle per tensor, opened by
  the worker on its own GPU, which must be the learner's (`agentgym.sync.cuda_ipc`).
- Separate process otherwise (CPU tensors): one POSIX shared-memory block, mapped by
  the worker (`agentgym.sync.shared_memory`).

In the worker, every route ends in `WorkerSync.agentgym_reload`: the model's own
`load_weights` between vLLM's layerwise-reload hooks (`Worker.reload_weights`).
`WorkerSync` is vLLM's `worker_extension_cls`, named to vLLM by its dotted path.

One sync of SmolLM2-135M's 0.5 GB on this project's 2-core CPU machine (medians of
`bench/weight_sync.py`): 2.5 s by the safetensors file in /dev/shm these routes
replace, 1.0 s by the shared block, 0.5 s in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agentgym.sync import NamedTensors, Transport
from agentgym.sync.cuda_ipc import CudaIpcTransport, open_handles
from agentgym.sync.shared_memory import SharedMemoryTransport, open_block
from agentgym.sync.tensors import InProcessTensors


class WorkerSync:
    """Methods vLLM adds to its worker (`worker_extension_cls`), called by `collective_rpc`."""

    def agentgym_reload(self, weights: NamedTensors) -> int:
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
        return self.agentgym_reload(open_block(block, size, layout))

    def agentgym_load_ipc(self, gpu: str, handles: Sequence[Sequence]) -> int:
        """Loads the CUDA tensors of `handles`' (name, pickled `reduce_tensor` output)
        rows, shared by a process on the GPU whose UUID is `gpu`."""
        device = self.device  # type: ignore[attr-defined]
        return self.agentgym_reload(open_handles(gpu, handles, device))


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


def engine_route(llm: Any, tensors: NamedTensors, *, in_process: bool) -> Transport:
    """The route into `llm`'s worker (a `vllm.LLM`) that fits `tensors` (see the module
    docstring); it calls the worker's `WorkerSync` method by `llm.collective_rpc`."""

    def rpc(method: str) -> Callable[..., object]:
        return lambda *args: llm.collective_rpc(method, args=args)

    if in_process:
        return InProcessTensors(rpc("agentgym_reload"))
    if len({t.device for _, t in tensors}) == 1 and tensors[0][1].is_cuda:
        return CudaIpcTransport(rpc("agentgym_load_ipc"))
    return SharedMemoryTransport(rpc("agentgym_load_shared"))


def send_weights(llm: Any, tensors: NamedTensors, *, in_process: bool) -> None:
    """Has `llm`'s worker load `tensors` by the route that fits; none is no call at all."""
    if tensors:
        engine_route(llm, tensors, in_process=in_process).send(tensors)
