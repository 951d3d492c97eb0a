"""Continuous batching over turns for the transformers backend: rows join and leave one
decode batch as their episodes move (`HFTurnStream`).

`HFPolicy.generate` decodes a batch to its end, so a turn's rows that stop early wait for
the longest, and every episode's next turn waits for every other episode's tool. Here a
row whose turn ended leaves the running batch at once (its keys and values kept, as
`reusing_cache` keeps them), the caller steps its environment, and the row's next turn
joins the batch as soon as it is added: its new ids are prefilled apart, from the kept keys
and values, and its cache rows are stacked onto the batch's (`kv_cache.stack_rows`),
left-padded, the padding masked out. A row draws from its own stream at its own token index
(`sampling.stream_uniforms`), as `generate` does, so what it samples does not depend on its
neighbours but through floating-point sums over a different batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch

from agentgym.policy.base import Generation, SamplingParams
from agentgym.policy.kv_cache import ReservedCache, room_ahead, stack_rows
from agentgym.policy.sampling import sample_ids, stream_uniforms
from agentgym.policy.turn_end import TurnEnd


class Decoder(Protocol):
    """What a turn stream uses of its policy (`HFPolicy`)."""

    stop_ids: set[int]
    turn_end: TurnEnd
    batch_size: int

    @property
    def device(self) -> torch.device: ...

    def prefill(self, prompts: list[list[int]], max_new_tokens: int) -> Any: ...

    def forward(self, ids, mask, positions, cache, **kwargs) -> Any: ...

    def keep(self, prompt: list[int], ids: list[int], cache: Any, row: int, mask) -> None: ...

    def completes_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool: ...


@dataclass
class _Batch:
    """The running rows: the caller's key of each, their cache, and what each feeds next."""

    keys: list[int]
    cache: ReservedCache
    logits: torch.Tensor  # [rows, 1, vocabulary]: each row's next-id logits
    mask: torch.Tensor  # [rows, width]: the cache columns each row attends to
    positions: torch.Tensor  # [rows, 1]: the position of each row's newest id


@dataclass
class _Row:
    prompt: list[int]
    stream: int | None
    ids: list[int]
    logprobs: list[float]


class HFTurnStream:
    """One decode batch that turns join (`add`) and leave (`step` returns them) while it runs.

    Opened by `HFPolicy.turn_stream(params)`, inside `reusing_cache`; at most the policy's
    `batch_size` rows decode at once, later additions waiting for room in the order added.
    """

    def __init__(self, policy: Decoder, params: SamplingParams) -> None:
        self.policy, self.params = policy, params
        self.rows: dict[int, _Row] = {}
        self.waiting: list[int] = []
        self.batch: _Batch | None = None
        self.stop = torch.tensor(sorted(policy.stop_ids), device=policy.device)
        self.strings = (*params.stop, *policy.turn_end.stop_strings)
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(policy.device).manual_seed(params.seed)

    def __len__(self) -> int:
        """Turns added and not yet returned."""
        return len(self.rows)

    def add(self, key: int, prompt: list[int], stream: int | None = None) -> None:
        """Queues the turn of `prompt` under `key` (unique among the live ones); it joins the
        batch at the next `step`. `stream` names its random draws (`Policy.generate`)."""
        if key in self.rows:
            raise ValueError(f"turn_stream: key {key} is already decoding")
        if not prompt:
            raise ValueError(f"turn_stream: the prompt of key {key} is empty")
        self.rows[key] = _Row(list(prompt), stream, [], [])
        self.waiting.append(key)

    def drop(self, key: int) -> None:
        """Ends the turn under `key` now, without returning it (its caller went away)."""
        self.rows.pop(key)
        if key in self.waiting:
            self.waiting.remove(key)
            return
        batch = self.batch
        assert batch is not None and key in batch.keys  # a live turn waits or runs
        going = [i for i, k in enumerate(batch.keys) if k != key]
        if not going:
            self.batch = None
            return
        index = torch.tensor(going, device=batch.mask.device)
        batch.cache.batch_select_indices(index)
        batch.keys = [batch.keys[i] for i in going]
        batch.logits, batch.mask = batch.logits[index], batch.mask[index]
        batch.positions = batch.positions[index]

    @torch.no_grad()
    def step(self) -> list[tuple[int, Generation]]:
        """Joins the turns waiting (as room allows), samples one id for every running row,
        and returns the turns that ended on it (a stop id or string, or the token budget),
        which leave the batch."""
        self._join()
        batch = self.batch
        if batch is None:
            return []
        rows = [self.rows[k] for k in batch.keys]
        token, logp = sample_ids(batch.logits[:, -1, :].float(), self.params, self._draws(rows))
        for row, t, lp in zip(rows, token.tolist(), logp.tolist(), strict=True):
            row.ids.append(t)
            row.logprobs.append(lp)
        stopped = torch.isin(token, self.stop)
        if self.strings:
            hits = [self.policy.completes_stop(row.ids, self.strings) for row in rows]
            stopped |= torch.tensor(hits, device=stopped.device)
        budget = [len(r.ids) >= self.params.max_new_tokens for r in rows]
        spent = torch.tensor(budget, device=stopped.device)
        ended = [self._end(k, bool(stopped[k])) for k in (stopped | spent).nonzero().flatten()]
        going = (~(stopped | spent)).nonzero().flatten()
        if len(going) == 0:
            self.batch = None
        else:
            if len(going) < len(rows):
                batch.cache.batch_select_indices(going)
                batch.keys = [batch.keys[k] for k in going.tolist()]
                token, batch.mask = token[going], batch.mask[going]
                batch.positions = batch.positions[going]
            batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
            batch.positions = batch.positions + 1
            out = self.policy.forward(token[:, None], batch.mask, batch.positions, batch.cache)
            batch.logits = out.logits
        return ended

    def _draws(self, rows: list[_Row]) -> torch.Tensor | None:
        """Each row's uniform for its next id: its stream's, at its own index, where rows
        name streams; else the stream's generator."""
        if not self.params.temperature:
            return None
        if all(row.stream is not None for row in rows):
            streams = np.array([row.stream % 2**64 for row in rows], np.uint64)  # type: ignore[operator]
            return stream_uniforms(streams, np.array([len(row.ids) for row in rows], np.uint64))
        return torch.rand(len(rows), generator=self.generator, device=self.policy.device)

    def _end(self, k: torch.Tensor, stopped: bool) -> tuple[int, Generation]:
        """Row `k`'s turn, which ended: its keys and values kept for its next turn."""
        assert self.batch is not None  # a row ends in a running batch
        key = self.batch.keys[int(k)]
        row = self.rows.pop(key)
        self.policy.keep(row.prompt, row.ids, self.batch.cache, int(k), self.batch.mask)
        reason: Literal["stop", "length"] = "stop" if stopped else "length"
        return key, Generation(tuple(row.ids), tuple(row.logprobs), reason)

    def _join(self) -> None:
        """Prefills the waiting turns that fit and stacks their rows onto the batch."""
        running = 0 if self.batch is None else len(self.batch.keys)
        room = max(0, self.policy.batch_size - running)
        joining, self.waiting = self.waiting[:room], self.waiting[room:]
        if not joining:
            return
        prompts = [self.rows[k].prompt for k in joining]
        cache, logits, mask, positions = self.policy.prefill(prompts, self.params.max_new_tokens)
        if self.batch is None:
            self.batch = _Batch(joining, cache, logits, mask, positions)
            return
        parts = [(self.batch.cache, self.batch.mask), (cache, mask)]
        stacked, mask = stack_rows(parts, room_ahead(self.params.max_new_tokens))
        self.batch = _Batch(
            self.batch.keys + joining,
            stacked,
            torch.cat([self.batch.logits, logits]),
            mask,
            torch.cat([self.batch.positions, positions]),
        )


@contextmanager
def evaluating(model) -> Iterator[None]:
    """The model in eval mode for the block, its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
