"""A torch.distributed group of the learner and its rollout workers, for weight broadcasts.

`distributed.weight_sync: collective` sends the learner's new weights to the Ray
rollout workers by a broadcast from the learner (rank 0) to every worker (ranks
1..N) instead of through Ray's object store. The group is its own: a `TCPStore`
served by the learner's process on a port the OS picks, and a gloo or NCCL
backend built on it directly, as vLLM's stateless process groups and the
trainer-to-rollout groups of OpenRLHF and verl are. It is never the default
group (`init_process_group`), so it neither needs one nor collides with the one
torchrun gives a multi-rank learner. NCCL carries it when the weights live on
CUDA on every member; gloo, over TCP, otherwise.

The tensors go in buckets: consecutive tensors of one dtype flattened into one
buffer of at most `BUCKET_BYTES` (a larger tensor is a bucket of its own), one
broadcast each. Every member derives the same buckets from the same list of
names, shapes and dtypes, which the learner sends along with the call, and the
same bucket size, fixed for the group (`agentgym.sync.buckets`).

A group has fixed members: a member that dies cannot be replaced in it. The
owner (`agentgym.scale.ray_rollout`) drops the whole group then and forms a new one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from agentgym.sync import NamedTensors, buckets

if TYPE_CHECKING:
    from torch.distributed import ProcessGroupGloo, ProcessGroupNCCL

GROUP_TIMEOUT_S = 120.0
"""How long one step of the group (forming it, one bucket's broadcast) may wait for a member."""
BUCKET_BYTES = 256 * 2**20
"""The largest flattened buffer one broadcast carries (a larger tensor goes alone)."""


@dataclass(frozen=True)
class TensorMeta:
    """What a receiver needs to rebuild one tensor of a broadcast."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class GroupAddress:
    """Where and what group to join: the learner's store, the size, backend and generation."""

    host: str
    port: int
    world_size: int
    backend: str  # "gloo" | "nccl"
    generation: int  # a new one each time the group is formed again
    bucket_bytes: int = BUCKET_BYTES  # every member cuts the same buckets


def describe(tensors: NamedTensors) -> list[TensorMeta]:
    """The names, shapes and dtypes of `tensors`, in order."""
    return [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in tensors]


def plan_buckets(metas: Sequence[TensorMeta], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Indices of `metas` per bucket: runs of consecutive tensors of one dtype, each run
    cut before the tensor that would take it past `limit` bytes."""
    return buckets.plan([(m.dtype, m.numel * m.dtype.itemsize) for m in metas], limit)


def serve_store(host: str) -> torch.distributed.TCPStore:
    """The learner's store for a new group, on a free port of `host` (read it from `.port`).

    The store is unauthenticated: whoever reaches its port can write the group's keys.
    TCPStore's own listener takes every interface whatever `host` says, so the socket
    is bound to `host` here and handed over.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as listener:
        listener.bind(address)
        listener.listen()
        store = torch.distributed.TCPStore(
            host,
            listener.getsockname()[1],
            is_master=True,
            wait_for_workers=False,
            timeout=_timeout(),
            master_listen_fd=listener.fileno(),
        )
        listener.detach()  # the store owns the socket now, and closes it
    return store


class SyncGroup:
    """One member's side of the group; rank 0 (the learner) sends (a `Transport`), the
    others receive.

    Building it blocks until every member has joined (gloo) or, for NCCL, until the
    first broadcast.

    Args:
        address: The group to join.
        rank: This member's rank: 0 for the learner, which passes `store`.
        local_host: This member's address for gloo's connections (its Ray node's IP);
            `GLOO_SOCKET_IFNAME`, when set, names the interface instead.
        device: Where this member's weights live; NCCL's buffers go there (gloo's on CPU).
        store: The learner's own store (`serve_store`); the others connect to `address`.
    """

    def __init__(
        self,
        address: GroupAddress,
        rank: int,
        local_host: str,
        device: torch.device,
        store: torch.distributed.Store | None = None,
    ):
        from torch.distributed import PrefixStore, TCPStore

        self.address, self.rank = address, rank
        self.name = f"collective ({address.backend})"
        if store is None:
            store = TCPStore(address.host, address.port, is_master=False, timeout=_timeout())
        # rank 0's serves the group: it must live as long as the group
        self._store: torch.distributed.Store | None = store
        prefixed = PrefixStore(f"agentgym-sync-{address.generation}", store)
        self._pg: ProcessGroupNCCL | ProcessGroupGloo | None
        if address.backend == "nccl":
            from torch.distributed import ProcessGroupNCCL

            options = ProcessGroupNCCL.Options()
            options._timeout = _timeout()
            self._pg = ProcessGroupNCCL(prefixed, rank, address.world_size, options)
            self.device = device
        else:
            from torch.distributed import ProcessGroupGloo

            iface = os.environ.get("GLOO_SOCKET_IFNAME")
            gloo_device = (
                ProcessGroupGloo.create_device(interface=iface)
                if iface
                else ProcessGroupGloo.create_device(hostname=local_host)
            )
            # torch's stubs do not declare gloo's options class
            options = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            options._devices = [gloo_device]
            options._timeout = _timeout()
            self._pg = ProcessGroupGloo(prefixed, rank, address.world_size, options)
            self.device = torch.device("cpu")

    def send(self, named_tensors: NamedTensors) -> None:
        """Rank 0: broadcasts `named_tensors`, bucket by bucket (one bucket's buffer at a time)."""
        metas = describe(named_tensors)
        for bucket in plan_buckets(metas, self.address.bucket_bytes):
            flat = torch.cat(
                [named_tensors[i][1].detach().reshape(-1).to(self.device) for i in bucket]
            )
            self._broadcast(flat)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # sent, not only queued: the time is honest

    def receive(self, metas: Sequence[TensorMeta]) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Ranks 1..N: the broadcast tensors, one bucket's worth (views of its buffer) at a time."""
        for bucket in plan_buckets(metas, self.address.bucket_bytes):
            ms = [metas[i] for i in bucket]
            flat = torch.empty(sum(m.numel for m in ms), dtype=ms[0].dtype, device=self.device)
            self._broadcast(flat)
            pieces = flat.split([m.numel for m in ms])
            yield [(m.name, p.view(m.shape)) for m, p in zip(ms, pieces, strict=True)]

    def _broadcast(self, flat: torch.Tensor) -> None:
        from torch.distributed import BroadcastOptions

        options = BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        if self._pg is None:
            raise RuntimeError("this weight-sync group was aborted")
        # torch's stubs declare no collectives on a backend; every process group has them
        self._pg.broadcast([flat], options).wait()  # type: ignore[union-attr]

    def abort(self) -> None:
        """Leaves the group at once: the other members' pending broadcasts fail, not wait.

        NCCL's communicators end on `abort()`; gloo's connections close only when its
        group is destroyed, so the group is dropped too (this object is done with).
        """
        pg, self._pg = self._pg, None
        if pg is not None:
            with contextlib.suppress(RuntimeError):
                pg.abort()
            del pg
            self._store = None


def _timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=GROUP_TIMEOUT_S)
