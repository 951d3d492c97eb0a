"""The transformers backend: batched sampling with a KV cache, on CPU or one GPU.

`generate` runs its own sampling loop rather than `model.generate`, for two
reasons: it returns the logprob of each sampled id under the distribution it
was sampled from (logits / temperature), without keeping every step's full
logits, and its draws do not depend on the global RNG: they come from a private
`torch.Generator` seeded by `SamplingParams.seed`, or, when the caller names
each row's stream, from a counter-based hash of (stream, token index)
(`agentgym.policy.sampling`), so that a row's draws do not depend on what else
is in the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from agentgym.compat import cache_kwarg
from agentgym.policy.base import Generation, PolicyBase, SamplingParams, check_generate_args
from agentgym.policy.hf_turns import HFTurnStream, evaluating
from agentgym.policy.kv_cache import ReservedCache, ReservedLayer, room_ahead
from agentgym.policy.sampling import sample_ids, stream_uniforms
from agentgym.policy.turn_end import TurnEnd, find_turn_end


def stop_token_ids(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, end: TurnEnd | None = None
) -> set[int]:
    """Ids that end a turn: the chat template's turn end where it is one token (`end`,
    found from the template when None), the tokenizer's eos and the generation config's.
    A turn end of several tokens is a stop string instead (`TurnEnd.stop_strings`)."""
    end = find_turn_end(tokenizer) if end is None else end
    ids: set[int] = set(end.ids) if end.special else set()
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is not None:
        ids.update(eos if isinstance(eos, list) else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


@contextlib.contextmanager
def merged_adapters(model) -> Iterator[None]:
    """Runs the block with a peft model's LoRA adapters merged into its weights.

    Sampling through unmerged adapters costs two extra small matmuls per
    adapted layer and token, about a fifth of a decode step on CPU; merged, the
    model decodes as fast as its base. On exit the adapters are unmerged and the
    base weights are bitwise what they were: W + delta - delta rounds back to W
    for most elements but not all (about 1% on SmolLM2), and a run that let those
    slip would move its frozen base, the KL reference, a little every step, and
    would not resume exactly. So, layer by layer, the elements that would not
    round back are found on entry and their old values put back on exit. Anything
    else (a plain model, None) runs as it is.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in getattr(model, "modules", list)() if isinstance(m, BaseTunerLayer)]
    if not layers or any(layer.merged for layer in layers):
        yield
        return
    repairs = [_merge_exactly(layer) for layer in layers]
    try:
        yield
    finally:
        for layer, (weight, where, values) in zip(layers, repairs, strict=True):
            layer.unmerge()
            weight.data[where] = values


def _merge_exactly(layer) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """Merges one LoRA layer; returns (its base weight, the positions that unmerging will
    not restore exactly, their values before the merge)."""
    weight = layer.get_base_layer().weight
    before = weight.detach().clone()
    layer.merge()
    after = weight.detach().clone()  # what peft's unmerge computes, in the same order
    for adapter in reversed(layer.merged_adapters):
        after -= layer.get_delta_weight(adapter)
    where = (after != before).nonzero(as_tuple=True)
    return weight, where, before[where]


def _common_prefix_length(prompts: list[list[int]]) -> int:
    """Length of the longest prefix all prompts share, leaving each at least one own token."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


class HFPolicy(PolicyBase):
    """A transformers causal LM as a policy.

    Args:
        model: The model to sample from (a peft model works too).
        tokenizer: Its tokenizer; supplies pad and stop ids, and the end of a turn (read
            from its chat template: a stop id, or a stop string where it is text).
        batch_size: Most sequences per forward pass; larger requests are chunked.
        min_shared_prefix: Prompts sharing at least this many leading tokens prefill
            them once (see `_prefill`).
    """

    streams_turns = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 64,
        min_shared_prefix: int = 16,
    ):
        self.model: PreTrainedModel = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.min_shared_prefix = min_shared_prefix
        self.turn_end = find_turn_end(tokenizer)
        self.stop_ids = stop_token_ids(model, tokenizer, self.turn_end)
        self.pad_id = tokenizer.pad_token_id
        self._generator: torch.Generator | None = None
        self._kept: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._cancelled: Callable[[int], bool] | None = None
        self.cache_kwarg = cache_kwarg(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Samples one completion per prompt; see `Policy.generate`."""
        check_generate_args(prompts, streams)
        if params.seed is not None:
            self._generator = torch.Generator(self.device).manual_seed(params.seed)
        keys = None if streams is None else np.array([s % 2**64 for s in streams], np.uint64)
        out: list[Generation] = []
        for start in range(0, len(prompts), self.batch_size):
            chunk = slice(start, start + self.batch_size)
            streamed = None if keys is None else keys[chunk]
            out.extend(self._generate_chunk(prompts[chunk], params, streamed, start))
        return out

    @contextlib.contextmanager
    def cancelling(self, cancelled: Callable[[int], bool]) -> Iterator[None]:
        """Within the block, `generate` drops prompt i's row at the decode step after
        `cancelled(i)` turns true (its client went away); see `Policy.cancelling`."""
        self._cancelled = cancelled
        try:
            yield
        finally:
            self._cancelled = None

    @torch.no_grad()
    def _generate_chunk(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: np.ndarray | None,
        first: int = 0,
    ) -> list[Generation]:
        with evaluating(self.model):
            return self._decode_loop(prompts, params, streams, first)

    def _uniforms(self, rows: list[int], streams: np.ndarray | None, index: int) -> torch.Tensor:
        """Each live row's uniform for its `index`-th new token."""
        if streams is None:
            return torch.rand(len(rows), generator=self._generator, device=self.device)
        return stream_uniforms(streams[rows], index)

    def forward(self, ids, mask, positions, cache, **kwargs):
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_kwarg: cache},
            **kwargs,
        )

    @contextlib.contextmanager
    def reusing_cache(self) -> Iterator[None]:
        """Within the block, each finished row's keys and values are kept, and a later
        prompt that extends a kept sequence (the next turn of the same episode: its
        history, then the tool's reply) continues from them instead of prefilling the
        whole conversation again. `collect` opens one per rollout. A weight load inside the
        block (partial rollouts) drops what was kept: it holds the old weights' keys and
        values, so the turns after prefill their conversations again under the new ones.
        """
        self._kept = {}
        try:
            yield
        finally:
            self._kept = None

    def keep(self, prompt: list[int], ids: list[int], cache: Cache, row: int, mask) -> None:
        """Keeps row `row`'s keys and values (its unmasked columns) under the ids they hold."""
        if self._kept is None or len(ids) < 2:
            return
        columns = mask[row].nonzero().flatten()
        # transformers types a layer's keys and values as possibly absent (and the layer as
        # possibly a linear-attention one); this cache's layers hold them
        layers = [
            (layer.keys[row][:, columns], layer.values[row][:, columns])  # type: ignore[union-attr,index]
            for layer in cache.layers
        ]
        self._kept[tuple(prompt) + tuple(ids[:-1])] = layers  # the last id was never fed

    def _reusable(self, prompts: list[list[int]]) -> list[tuple[int, ...] | None]:
        """For each prompt, the longest kept sequence it strictly extends, or None."""
        found = []
        for p in prompts:
            best = None
            for key in self._kept or ():
                longer = best is None or len(key) > len(best)
                if longer and len(key) < len(p) and tuple(p[: len(key)]) == key:
                    best = key
            found.append(best)
        return found

    def _prefill_reused(self, prompts, keys, max_new_tokens: int):
        """Prefills only what each prompt adds to its kept sequence; returns (cache,
        last logits, attention mask, positions). Row j's columns are [padding, its kept
        keys and values, padding, its new ids], the padding masked out."""
        assert self._kept is not None  # the keys were found in it
        reused = [len(k) if k is not None else 0 for k in keys]
        width = max(reused)
        capacity = width + max(len(p) - r for p, r in zip(prompts, reused, strict=True))
        capacity += room_ahead(max_new_tokens)
        cache = ReservedCache(capacity)
        first = next(self._kept[k] for k in keys if k is not None)
        for index, (k0, v0) in enumerate(first):
            shape = (len(prompts), k0.shape[0], capacity, k0.shape[-1])
            all_keys, all_values = k0.new_zeros(shape), v0.new_zeros(shape)
            for j, key in enumerate(keys):
                if key is not None:
                    keys_j, values_j = self._kept[key][index]
                    all_keys[j, :, width - reused[j] : width] = keys_j
                    all_values[j, :, width - reused[j] : width] = values_j
            cache.layers.append(ReservedLayer.holding(all_keys, all_values, width))
        ids, suffix_mask = _left_pad(
            [p[r:] for p, r in zip(prompts, reused, strict=True)], self.pad_id, self.device
        )
        kept_mask = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
        for j, r in enumerate(reused):
            kept_mask[j, width - r :] = 1
        start = torch.tensor(reused, device=self.device)[:, None]
        positions = start + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([kept_mask, suffix_mask], dim=1)
        for key in set(keys) - {None}:  # each kept sequence is continued once
            del self._kept[key]
        out = self.forward(ids, mask, positions, cache, logits_to_keep=1)
        return cache, out.logits, mask, positions[:, -1:]

    def _prefill(self, prompts: list[list[int]], cache: DynamicCache):
        """Runs the prompts into `cache`; returns (last logits, attention mask, positions).

        The prompts' longest common prefix (the system message, the whole prompt
        for the G members of a group on their first turn) is computed once and
        its cache rows repeated; each row's own suffix follows it, left-padded,
        so padding sits between prefix and suffix, masked out.
        """
        shared = _common_prefix_length(prompts)
        if shared < self.min_shared_prefix:
            ids, mask = _left_pad(prompts, self.pad_id, self.device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = self.forward(ids, mask, positions, cache, logits_to_keep=1)
            return out.logits, mask, positions[:, -1:]
        prefix = torch.tensor([prompts[0][:shared]], device=self.device)
        self.forward(prefix, torch.ones_like(prefix), None, cache, logits_to_keep=1)
        cache.batch_repeat_interleave(len(prompts))
        ids, suffix_mask = _left_pad([p[shared:] for p in prompts], self.pad_id, self.device)
        positions = shared + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([suffix_mask.new_ones(len(prompts), shared), suffix_mask], dim=1)
        out = self.forward(ids, mask, positions, cache, logits_to_keep=1)
        return out.logits, mask, positions[:, -1:]

    def prefill(self, prompts: list[list[int]], max_new_tokens: int):
        """Runs the prompts into a fresh cache with room for `max_new_tokens` more, continuing
        kept sequences they extend (`reusing_cache`); returns (cache, last logits, attention
        mask, positions)."""
        keys = self._reusable(prompts) if self._kept else [None] * len(prompts)
        if any(k is not None for k in keys):
            return self._prefill_reused(prompts, keys, max_new_tokens)
        cache = ReservedCache(capacity=max(len(p) for p in prompts) + room_ahead(max_new_tokens))
        logits, mask, positions = self._prefill(prompts, cache)
        return cache, logits, mask, positions

    @contextlib.contextmanager
    def turn_stream(self, params: SamplingParams) -> Iterator[HFTurnStream]:
        """A decode batch that turns join and leave while it runs (continuous batching over
        turns, `agentgym.policy.hf_turns`), the model in eval mode meanwhile."""
        with evaluating(self.model):
            yield HFTurnStream(self, params)

    def _decode_loop(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: np.ndarray | None,
        first: int = 0,
    ) -> list[Generation]:
        """Samples until every row stopped or hit the budget; finished rows leave the batch,
        and so do cancelled ones (`cancelling`; `first` is the index of prompts[0] there)."""
        cache, logits, mask, positions = self.prefill(prompts, params.max_new_tokens)
        stop = torch.tensor(sorted(self.stop_ids), device=self.device)
        rows = list(range(len(prompts)))  # prompt index of each live row
        ids: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        reasons: list[Literal["stop", "length"]] = ["length"] * len(prompts)
        for step in range(params.max_new_tokens):
            u = self._uniforms(rows, streams, step) if params.temperature else None
            token, logp = sample_ids(logits[:, -1, :].float(), params, u)
            for row, t, lp in zip(rows, token.tolist(), logp.tolist(), strict=True):
                ids[row].append(t)
                logps[row].append(lp)
            stopped = torch.isin(token, stop)
            if strings := (*params.stop, *self.turn_end.stop_strings):
                hits = [self.completes_stop(ids[row], strings) for row in rows]
                stopped |= torch.tensor(hits, device=self.device)
            for k in stopped.nonzero().flatten().tolist():
                reasons[rows[k]] = "stop"
                self.keep(prompts[rows[k]], ids[rows[k]], cache, k, mask)
            if self._cancelled is not None:  # a cancelled row ends as cut ("length")
                gone = [self._cancelled(first + row) for row in rows]
                stopped |= torch.tensor(gone, device=self.device)
            if step + 1 == params.max_new_tokens or bool(stopped.all()):
                for k in (~stopped).nonzero().flatten().tolist():
                    self.keep(prompts[rows[k]], ids[rows[k]], cache, k, mask)
                break
            if bool(stopped.any()):
                keep = (~stopped).nonzero().flatten()
                cache.batch_select_indices(keep)
                rows = [rows[k] for k in keep.tolist()]
                token, mask, positions = token[keep], mask[keep], positions[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions + 1
            logits = self.forward(token[:, None], mask, positions, cache).logits
        return [
            Generation(tuple(i), tuple(lp), r) for i, lp, r in zip(ids, logps, reasons, strict=True)
        ]

    def completes_stop(self, ids: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the newest id completes one of the stop strings. Only the last few
        ids are decoded: an occurrence that ended earlier would have stopped the row then,
        and each id is at least one character."""
        tail = self.tokenizer.decode(ids[-(max(map(len, stop)) + 1) :])
        return any(s in tail for s in stop)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies tensors into the model's parameters by name; unknown names are an error."""
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"load_weights: the model has no parameter {name!r}")
            if params[name] is not tensor:
                params[name].copy_(tensor)
        if self._kept is not None:  # the old weights' keys and values: recomputed from here
            self._kept = {}
