"""torch.distributed for the learner: the process group and the collectives.

Under `torchrun --nproc-per-node N -m agentgym train ...` every process runs
the same command. Rank 0 does everything a single process does (rollouts,
evaluations, logs, checkpoints); the other ranks only hold a copy of the
learner and step it on the batches rank 0 shares with them (the protocol is
`agentgym.scale.ranks`'s). Each rank computes the gradient of its share of the batch and
DistributedDataParallel sums the shares during the backward (`data_parallel`), so
every rank takes the same optimizer step: the one a single process takes on the
whole batch.

With `distributed.learner: fsdp` no rank holds the weights or the optimizer state
whole (`fully_shard_model`, `full_optimizer_state`); see `agentgym.scale.ranks`.

In a single process the collectives are no-ops, or the identity.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch
import torch.distributed as tdist

from agentgym.sync.buckets import tensor_buckets, unflatten_into

T = TypeVar("T")

BUCKET_BYTES = 25 * 2**20
"""Most gradient bytes one all-reduce carries (DistributedDataParallel's default bucket)."""


def active() -> bool:
    """Whether a process group of more than one process is initialised."""
    return tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1


def world_size() -> int:
    """The number of processes: the process group's, else torchrun's WORLD_SIZE, else 1."""
    return tdist.get_world_size() if active() else int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank: in the process group, else torchrun's RANK (so that it is
    known before `init` and after `shutdown`), else 0."""
    return tdist.get_rank() if active() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """Whether this process is rank 0, the one that samples, evaluates and writes files."""
    return rank() == 0


def init(timeout_s: float = 6 * 3600) -> bool:
    """Joins the process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK); True if it did.

    NCCL with CUDA (each rank on GPU LOCAL_RANK), gloo on CPU, or the backend
    AGENTGYM_DIST_BACKEND names (gloo lets two ranks share one GPU). Nothing happens when
    WORLD_SIZE is unset or 1, or the group already exists. The timeout is long
    because the other ranks wait in a broadcast while rank 0 samples and evaluates;
    torchrun ends them all if one fails.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or tdist.is_initialized():
        return False
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(device())
    backend = os.environ.get("AGENTGYM_DIST_BACKEND") or ("nccl" if cuda else "gloo")
    tdist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return True


def device() -> torch.device:
    """The device this rank computes on: its GPU (LOCAL_RANK, modulo the GPUs there are:
    ranks past them share, which NCCL refuses and gloo allows) with CUDA, else the CPU."""
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


_group_outlived = False


def shutdown() -> None:
    """Leaves the process group, if this process joined one.

    FSDP keeps the group alive past `destroy_process_group`: its hooks and the
    module hold its mesh in a cycle through C++ that the garbage collector cannot
    break. gloo's worker threads then live on, and one may free the last tensors
    of a finished collective while the interpreter tears itself down; taking the
    GIL then ends the thread inside a noexcept destructor, and the process
    aborts ("terminate called without an active exception", from 1 run in 10 to
    under 1 in 40 here; pytorch/pytorch#179291 describes the same). When the group
    outlives this call, `group_outlived_shutdown()` says so, and the command's
    entry point ends the process without that teardown (`agentgym.cli.run`).
    """
    global _group_outlived
    if tdist.is_available() and tdist.is_initialized():
        group = weakref.ref(tdist.group.WORLD)
        tdist.destroy_process_group()
        _group_outlived = group() is not None


def group_outlived_shutdown() -> bool:
    """Whether the process group `shutdown` destroyed is still alive (see `shutdown`)."""
    return _group_outlived


def barrier() -> None:
    """Waits until every rank gets here."""
    if active():
        tdist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """`obj` as rank `src` has it, on every rank (pickled; tensors arrive on the CPU
    when sent from the CPU)."""
    if not active():
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=src)
    return box[0]


def gather_to_main(obj: T) -> list[T]:
    """Every rank's `obj`, by rank, on rank 0 (pickled); an empty list on the others, and
    `[obj]` in one process."""
    if not active():
        return [obj]
    box: list[T] | None = [obj] * world_size() if is_main() else None
    tdist.gather_object(obj, box, dst=0)
    return box if box is not None else []


def shard(items: Sequence[T]) -> list[T]:
    """This rank's items: every world_size-th from position rank (round robin); all of
    them in one process.

    The learner deals out micro-batches sorted by length, so round robin gives
    each rank a similar mix of short and long ones.
    """
    if not active():
        return list(items)
    return list(items[rank() :: world_size()])


def all_reduce_sum(values: dict[str, float], keys: Iterable[str]) -> dict[str, float]:
    """`values[key]` summed over the ranks for each of `keys` (a rank without one adds 0)."""
    keys = list(keys)
    if not active():
        return {k: values.get(k, 0.0) for k in keys}
    on = _collective_device()
    total = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64, device=on)
    tdist.all_reduce(total)
    return dict(zip(keys, total.tolist(), strict=True))


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copies rank `src`'s parameters and buffers into every rank's `module` (in place),
    as DistributedDataParallel does when it wraps a model."""
    if not active():
        return
    tensors = [t.data for t in (*module.parameters(), *module.buffers())]
    for bucket in tensor_buckets(tensors, BUCKET_BYTES):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        tdist.broadcast(flat, src=src)
        unflatten_into(flat, bucket)


def data_parallel(model: torch.nn.Module) -> Any:
    """Wraps `model` in DistributedDataParallel; returns it as `run`, which calls
    `fn(model, *args)` as `run(fn, *args)` through DDP's forward, with `run.no_sync()`.

    DDP's hooks all-reduce each bucket of gradients during the backward pass, as
    soon as it is ready, overlapped with the rest of the backward, outside
    `no_sync()` (micro-batches before a rank's last accumulate locally).
    Gradients are summed over the ranks, not averaged: each rank's loss is
    already weighted by its share of the batch. Every rank must call it at the
    same point (DDP checks that the ranks' parameters agree; `broadcast_module`
    made them equal).
    """
    from torch.nn.parallel import DistributedDataParallel

    on_gpu = next(model.parameters()).device.type == "cuda"
    ddp = DistributedDataParallel(
        _Root(model),
        device_ids=[device()] if on_gpu else None,
        broadcast_buffers=False,
        init_sync=False,
    )
    ddp.register_comm_hook(None, _sum_hook)
    return ddp


def _sum_hook(state: object, bucket: tdist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook: the bucket summed over the ranks (DDP's own averages)."""
    work = tdist.all_reduce(bucket.buffer(), async_op=True)
    summed: torch.futures.Future[torch.Tensor] = work.get_future().then(
        lambda done: done.value()[0]
    )
    return summed


# DDP reads the hook's annotations and wants the class itself, not the string that
# `from __future__ import annotations` leaves
_sum_hook.__annotations__.update(
    {"bucket": tdist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)


class _Root(torch.nn.Module):
    """Runs `fn(model, *args)` as its forward: FSDP's hooks around a root's forward
    gather the weights outside the decoder layers (embeddings, final norm, head),
    which the learner's passes use without calling the model's own forward."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(self.model, *args)


def fully_shard_model(model: torch.nn.Module) -> Callable[..., Any]:
    """Shards `model` over the ranks with FSDP2; returns `run`, which calls `fn(model, *args)`
    as `run(fn, *args)` with the weights gathered around it.

    Each decoder layer (the classes a transformers model names in
    `_no_split_modules`) is one unit, gathered only while it runs; the rest is the
    root's. Gradients are summed over the ranks, not averaged.
    """
    from torch.distributed.fsdp import FSDPModule, fully_shard

    # torch types an attribute a module does not declare (a peft model's get_base_model) as
    # Tensor | Module
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    unit_types = set(getattr(base, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in unit_types]
    if not units:
        raise ValueError(
            f"distributed.learner 'fsdp': {type(base).__name__} names no decoder "
            "layer class (_no_split_modules) to shard by; use 'ddp'"
        )
    for unit in units:
        fully_shard(unit)
    # fully_shard returns the module it was given, of a subclass of its class and FSDPModule;
    # torch types it as FSDPModule alone
    root = cast(_Root, fully_shard(_Root(model)))
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return root


def full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """`optimizer.state_dict()` of sharded parameters as one process would have it: each
    sharded state tensor (AdamW's moments) gathered whole, on the CPU, by
    `torch.distributed.checkpoint.state_dict`.

    Every rank must call it, in step. Only rank 0 keeps the gathered tensors
    (`cpu_offload`); the others get an empty state. The result is keyed as
    `optimizer.state_dict()` keys it, by each parameter's index, so a checkpoint
    reads the same however its run was spread.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # torch types the state dict as nested unions of its leaf types; it is plain dicts
    by_name: dict[str, Any] = cast(Any, get_optimizer_state_dict(model, optimizer, options=options))
    if not by_name:  # a rank but 0, with cpu_offload
        return {"state": {}, "param_groups": []}
    names = [name for group in by_name["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    groups, start = [], 0
    for group in by_name["param_groups"]:
        count = len(group["params"])
        groups.append({**group, "params": list(range(start, start + count))})
        start += count
    state = {index[name]: entry for name, entry in by_name["state"].items()}
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def load_full_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Loads a whole optimizer state (one process's, or `full_optimizer_state`'s) into an
    optimizer of sharded parameters, by `torch.distributed.checkpoint.state_dict`:
    each rank keeps its own shard of each tensor, cut from the whole one it read."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    # the names `torch.distributed.checkpoint` gives the optimizer's parameters, in order
    empty: dict[str, Any] = cast(Any, get_optimizer_state_dict(model, optimizer))
    names = [name for group in empty["param_groups"] for name in group["params"]]
    groups = [
        {**group, "params": [names[int(i)] for i in group["params"]]}
        for group in state["param_groups"]
    ]
    entries = {names[int(i)]: entry for i, entry in state["state"].items()}
    set_optimizer_state_dict(
        model,
        optimizer,
        cast(Any, {"state": entries, "param_groups": groups}),
        options=StateDictOptions(full_state_dict=True),
    )


def _collective_device() -> torch.device:
    return device() if tdist.get_backend() == "nccl" else torch.device("cpu")
