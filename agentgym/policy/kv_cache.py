"""The transformers backend's key-value cache: room reserved ahead, written in place, and
rows of two caches stacked into one batch (continuous batching over turns).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

RESERVED_AHEAD = 512
"""The most positions a new cache reserves past its prompt; past them it grows by doubling.
So a request that asks a million tokens reserves 512, and its memory grows with what it
generates, not with what it asked for."""


def room_ahead(max_new_tokens: int) -> int:
    """The positions to reserve for a completion of at most `max_new_tokens`."""
    return min(max_new_tokens, RESERVED_AHEAD)


class ReservedLayer(DynamicLayer):
    """A `DynamicLayer` that writes new keys and values into reserved room.

    `DynamicLayer.update` concatenates, so every decode step copies the whole
    cache of every layer into a fresh allocation; on CPU that copy (and the
    page faults of the new block) took most of a decode step. This layer keeps
    a buffer of `capacity` positions, writes each step in place and hands out
    views; it grows by doubling should a sequence outrun the capacity.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.device, self.is_initialized = key_states.device, True
        end = self.length + key_states.shape[-2]
        if self._keys is None or end > self._keys.shape[-2]:
            self._grow(key_states, value_states, end)
        assert self._keys is not None and self._values is not None  # _grow made them
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, length: int) -> ReservedLayer:
        """A layer whose buffers are `keys` and `values` [rows, heads, room, dim], their first
        `length` positions filled."""
        layer = cls(keys.shape[-2])
        layer._keys, layer._values = keys, values
        layer.device, layer.is_initialized, layer.length = keys.device, True, length
        layer._expose()
        return layer

    def _expose(self) -> None:
        """Points `keys` and `values` at the filled part of the buffers."""
        assert self._keys is not None and self._values is not None  # only once they exist
        self.keys, self.values = self._keys[:, :, : self.length], self._values[:, :, : self.length]

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, end: int) -> None:
        capacity = max(end, self.capacity if self._keys is None else 2 * self._keys.shape[-2])
        keys = key_states.new_empty(*key_states.shape[:2], capacity, key_states.shape[-1])
        values = value_states.new_empty(*value_states.shape[:2], capacity, value_states.shape[-1])
        if self._keys is not None:
            assert self._values is not None  # made together with the keys
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop() takes the negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self._keys is not None:
            self._expose()

    def reset(self) -> None:
        self.length = 0
        self._keys = self._values = None
        super().reset()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length > 0:
            assert self._keys is not None and self._values is not None  # they hold the length
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length > 0:
            assert self._keys is not None and self._values is not None  # they hold the length
            self._keys, self._values = self._keys[indices], self._values[indices]
            self._expose()


class ReservedCache(DynamicCache):
    """A `DynamicCache` whose layers preallocate room for `capacity` positions."""

    def __init__(self, capacity: int):
        # transformers calls what it is given to make each layer; it types it as a class
        Cache.__init__(self, layer_class_to_replicate=lambda: ReservedLayer(capacity))  # type: ignore[arg-type]


def stack_rows(
    parts: list[tuple[ReservedCache, torch.Tensor]], extra: int
) -> tuple[ReservedCache, torch.Tensor]:
    """One cache holding the rows of each (cache, attention mask) in `parts`, in order, and
    its mask. Each part's leading columns that no row of it attends to are dropped and its
    rows left-padded to the widest part; the padding is zeros, masked out. The cache has
    room for `extra` more columns (it grows should they not suffice)."""
    leads = [_lead(mask) for _, mask in parts]
    widths = [mask.shape[1] - lead for (_, mask), lead in zip(parts, leads, strict=True)]
    width, rows = max(widths), sum(mask.shape[0] for _, mask in parts)
    stacked = ReservedCache(width + extra)
    for layers in zip(*(cache.layers for cache, _ in parts), strict=True):
        first = layers[0].keys
        assert first is not None  # a filled cache's layers hold their keys and values
        shape = (rows, first.shape[1], width + extra, first.shape[-1])
        keys, values = first.new_zeros(shape), first.new_zeros(shape)
        row = 0
        for part, lead, w in zip(layers, leads, widths, strict=True):
            assert part.keys is not None and part.values is not None  # filled, as above
            n = part.keys.shape[0]
            keys[row : row + n, :, width - w : width] = part.keys[:, :, lead:]
            values[row : row + n, :, width - w : width] = part.values[:, :, lead:]
            row += n
        stacked.layers.append(ReservedLayer.holding(keys, values, width))
    mask = parts[0][1].new_zeros(rows, width)
    row = 0
    for (_, part_mask), lead, w in zip(parts, leads, widths, strict=True):
        mask[row : row + part_mask.shape[0], width - w :] = part_mask[:, lead:]
        row += part_mask.shape[0]
    return stacked, mask


def _lead(mask: torch.Tensor) -> int:
    """How many leading columns of `mask` [rows, width] are 0 in every row."""
    attended = mask.any(dim=0).nonzero()
    return int(attended[0]) if attended.numel() else mask.shape[1]
