"""Buckets: consecutive tensors cut into runs that each travel as one flat buffer, one
collective call per run rather than per tensor.

A run holds tensors of one kind (a dtype; for the learner's ranks, a dtype and a
device), since one buffer has one, and is cut before the tensor that would take it
past a byte limit; a tensor larger than the limit is a run of its own. Every member
of a group that cuts the same list with the same limit gets the same runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def plan(items: Sequence[tuple[object, int]], limit: int) -> list[list[int]]:
    """Indices of `items`' (kind, bytes) pairs per bucket: runs of consecutive items of
    one kind, each cut before the item that would take it past `limit` bytes."""
    buckets: list[list[int]] = []
    size = 0
    for i, (kind, nbytes) in enumerate(items):
        if not buckets or items[buckets[-1][0]][0] != kind or size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return buckets


def tensor_buckets(tensors: Sequence[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """`tensors` in runs of one dtype and device, each of at most `limit` bytes."""
    items = [((t.dtype, t.device), t.numel() * t.element_size()) for t in tensors]
    return [[tensors[i] for i in bucket] for bucket in plan(items, limit)]


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copies `flat`'s consecutive pieces into `tensors` in place, each in its tensor's shape."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
