"""The policy's logprobs of a batch's tokens, and backpropagation micro-batch by micro-batch.

`token_logprobs` runs the decoder and projects only the positions the loss
mask selects onto the vocabulary (in checkpointed chunks past `LOGIT_BUDGET`),
dividing the logits by the sampling temperature as the sampler did; a batch's
shared prefix (the system prompt) runs once (`run_prefix`, `Prefix`), its keys
and values repeated for every row. `backward_micro_batches` cuts a batch into
micro-batches and backpropagates each one's loss, the shared prefix's gradient
going back through it once, last. The learner (`agentgym.learn.learner`) and
the SFT warm-up (`agentgym.sft`) build their losses on these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel

from agentgym.compat import cache_kwarg
from agentgym.learn import grpo
from agentgym.types import Batch

T = TypeVar("T")

MIN_SHARED_PREFIX = 16
"""Rows sharing fewer leading tokens than this are run whole, each on its own."""


def shared_prefix_length(batch: Batch) -> int:
    """Leading columns every row shares (same ids, all attended), up to the first target.

    The whole batch's system prompt, and a group's whole prompt, are such a
    prefix; it stops at the first column any loss mask selects, so that every
    logit the loss needs comes from the suffix pass.
    """
    ids, mask = batch.input_ids, batch.attention_mask
    same = (ids == ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    active = batch.loss_mask.any(dim=0).nonzero()
    first = int(active[0]) if len(active) else 0
    return min(int(same.int().cumprod(dim=0).sum()), first)


def _decoder_and_head(model: PreTrainedModel) -> tuple[PreTrainedModel, torch.nn.Linear]:
    # torch types get_base_model, which a PreTrainedModel does not declare, as Tensor | Module
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    return base.get_decoder(), base.get_output_embeddings()


def _softcap(model: PreTrainedModel, logits: torch.Tensor) -> torch.Tensor:
    """The final-logit soft-capping some models (Gemma 2) apply after the head, if any."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    cap = getattr(base.config, "final_logit_softcapping", None)
    return logits if not cap else torch.tanh(logits / cap) * cap


Prefix = tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]
"""A shared prefix run once: its length and each layer's (keys, values) for one row."""


def run_prefix(model: PreTrainedModel, ids: torch.Tensor) -> Prefix:
    """Runs `ids` [1, P] through the decoder; returns (P, each layer's keys and values)."""
    decoder, _ = _decoder_and_head(model)
    cache = DynamicCache()
    decoder(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        use_cache=True,
        **{cache_kwarg(decoder): cache},
    )
    # a filled DynamicCache's layers all hold keys and values; transformers types them as
    # possibly absent (and the layers as possibly linear-attention ones)
    return ids.shape[1], [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


def _prefix_cache(prefix: Prefix, rows: int) -> DynamicCache:
    """A cache holding the prefix's keys and values, repeated for `rows` rows."""
    cache = DynamicCache()
    for i, (keys, values) in enumerate(prefix[1]):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), i)
    return cache


def _hidden_states(
    model: PreTrainedModel, batch: Batch, prefix: Prefix | None = None, share_prefix: bool = True
) -> tuple[torch.Tensor, int]:
    """The last hidden states [N, L - P] of positions P.., and P, the shared prefix run once.

    The prefix is run for one row into a KV cache (or taken from `prefix`,
    run once for a whole step's micro-batches), which is repeated for every row;
    gradients flow back through it. Each row's suffix then attends to it.
    """
    decoder, _ = _decoder_and_head(model)
    ids, mask = batch.input_ids, batch.attention_mask
    if prefix is None:
        shared = shared_prefix_length(batch) if batch.size > 1 and share_prefix else 0
        if shared < MIN_SHARED_PREFIX:
            # rows are right-padded: no position the loss reads attends to a pad
            return decoder(input_ids=ids, attention_mask=mask).last_hidden_state, 0
        prefix = run_prefix(model, ids[:1, :shared])
    shared = prefix[0]
    positions = torch.arange(shared, ids.shape[1], device=ids.device).expand(batch.size, -1)
    out = decoder(
        input_ids=ids[:, shared:],
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **{cache_kwarg(decoder): _prefix_cache(prefix, batch.size)},
    )
    return out.last_hidden_state, shared


def _packed_hidden_states(
    model: PreTrainedModel, batch: Batch, prefix: Prefix | None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows run as one sequence, without padding: the last hidden states [S, H] of
    every row's tokens from position P on, one row after another, where each (row,
    position - P) of the batch is in them (an index [N, L - P]; -1 past a row's end),
    and P, the prefix's length (0 without one).

    Each row's positions count on from P (or 0); a block-diagonal causal mask keeps
    each token's attention within its own row and the prefix, so every row sees
    what it sees run alone.
    """
    decoder, _ = _decoder_and_head(model)
    shared = prefix[0] if prefix is not None else 0
    lengths = batch.attention_mask.sum(dim=1) - shared
    device = batch.input_ids.device
    keep = torch.arange(batch.input_ids.shape[1] - shared, device=device) < lengths[:, None]
    ids = batch.input_ids[:, shared:][keep]
    index = torch.full(keep.shape, -1, dtype=torch.long, device=device)
    index[keep] = torch.arange(len(ids), device=device)
    row, column = keep.nonzero(as_tuple=True)
    positions = column + shared
    allowed = (row[:, None] == row[None, :]) & (positions[None, :] <= positions[:, None])
    allowed = torch.cat([allowed.new_ones(len(ids), shared), allowed], dim=1)
    out = decoder(
        input_ids=ids[None],
        attention_mask=_attention_bias(model, allowed)[None, None],
        position_ids=positions[None],
        use_cache=prefix is not None,
        **({cache_kwarg(decoder): _prefix_cache(prefix, 1)} if prefix is not None else {}),
    )
    return out.last_hidden_state[0], index, shared


def _attention_bias(model: PreTrainedModel, allowed: torch.Tensor) -> torch.Tensor:
    """`allowed` [Q, K] as the 4-D mask the model's attention takes as given: a boolean
    one for SDPA, an additive one (0 or the dtype's lowest) for the others."""
    if model.config._attn_implementation == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


LOGIT_BUDGET = 2**25
"""Most logits (positions x vocabulary) `token_logprobs` holds at once: 128 MB in float32.
Past it, positions go through the head in checkpointed chunks."""


def _head_logprobs(
    model: PreTrainedModel,
    head: torch.nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob [K] of each target under head(hidden [K, H]) / T, and the (detached) entropy [K].

    Logits of a half-precision model are taken in float32; float32 and float64 stay as they are
    (a float64 model is how the tests check the gradient against a plain computation).
    """
    logits = head(hidden)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = _softcap(model, logits) / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        entropy = grpo.entropy_from_logprobs(logsm)
    return logsm.gather(-1, targets[:, None]).squeeze(-1), entropy


def token_logprobs(
    model: PreTrainedModel,
    batch: Batch,
    temperature: float,
    prefix: Prefix | None = None,
    share_prefix: bool = True,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs [N, L-1] of each target token, and the entropy [N, L-1] of its distribution.

    Only the positions the loss mask selects are projected onto the vocabulary
    (the rest read 0), so the prompt and tool results cost no logits, and the
    batch's shared prefix (the system prompt) is run once, not once per row
    (`prefix`: already run, for these rows' first P tokens; with `share_prefix`
    False, every row runs whole). When the selected positions times the
    vocabulary exceed `LOGIT_BUDGET`, they are projected in chunks under
    activation checkpointing, so memory stays flat in their number (the
    backward pass recomputes each chunk's logits).
    With `packed`, the rows run as one sequence without padding
    (`_packed_hidden_states`); the logprobs are the same.
    The entropy is detached: it is a metric.
    """
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)
    if packed:
        flat, index, shared = _packed_hidden_states(model, batch, prefix)
        selected = flat[index[rows, cols - shared]]
    else:
        hidden, shared = _hidden_states(model, batch, prefix, share_prefix)
        selected = hidden[rows, cols - shared]
    _, head = _decoder_and_head(model)
    targets = batch.input_ids[rows, cols + 1]
    # at least one row per chunk, however large the vocabulary
    step = max(1, LOGIT_BUDGET // head.weight.shape[0])
    if len(rows) <= step:
        kept, ent = _head_logprobs(model, head, selected, targets, temperature)
    else:
        parts = [
            checkpoint(
                _head_logprobs,
                model,
                head,
                selected[i : i + step],
                targets[i : i + step],
                temperature,
                use_reentrant=False,
            )
            for i in range(0, len(rows), step)
        ]
        kept, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    logp = torch.zeros(batch.loss_mask.shape, dtype=kept.dtype, device=kept.device)
    logp = logp.index_put((rows, cols), kept)
    entropy = torch.zeros_like(logp, requires_grad=False)
    entropy[rows, cols] = ent.detach()
    return logp, entropy


def backward_micro_batches(
    model: PreTrainedModel,
    batch: Batch,
    micro_batch_size: int,
    loss_fn: Callable[[Batch, Prefix | None], tuple[torch.Tensor, T]],
    context: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    select: Callable[[list[Batch]], list[Batch]] | None = None,
    share_prefix: bool = True,
    micro_batch_tokens: int | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
) -> list[T]:
    """Backpropagates `loss_fn(micro, prefix)` of each micro-batch; returns what each gave besides.

    Micro-batches hold rows of similar length, so little is padding. The
    batch's shared prefix (the system prompt) runs once, not once per
    micro-batch: into detached copies of its keys and values, which every
    micro-batch's backward adds gradients to, and which go back through the
    prefix once, last. `loss_fn` passes the prefix on to `token_logprobs`.
    `select` keeps some of the micro-batches (a rank's share); `share_prefix`
    False runs every row whole. With `micro_batch_tokens`, micro-batches are cut
    by that token budget (`Batch.split_tokens`, the prefix run once not counted)
    rather than by `micro_batch_size` rows. `no_sync` (DistributedDataParallel's) is
    held over every micro-batch but the last, whose backward then sums the gradients
    over the ranks.
    """
    shared = shared_prefix_length(batch) if batch.size > 1 and share_prefix else 0
    if micro_batch_tokens is None:
        micro_batches = batch.split(micro_batch_size, by_length=True)
    else:
        skip = shared if shared >= MIN_SHARED_PREFIX else 0
        micro_batches = batch.split_tokens(micro_batch_tokens, skip, by_length=True)
    if select is not None:
        micro_batches = select(micro_batches)
    prefix = None
    if shared >= MIN_SHARED_PREFIX and micro_batches:
        with context():
            _, layers = run_prefix(model, batch.input_ids[:1, :shared])
        # keys and values in pairs, one leaf each
        outputs = [t for kv in layers for t in kv]
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in outputs]
        prefix = (shared, list(zip(leaves[0::2], leaves[1::2], strict=True)))
    results = []
    for i, micro in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if no_sync is None or last else no_sync():
            loss, result = loss_fn(micro, prefix)
            loss.backward()
        results.append(result)
    if prefix is not None:
        pairs = [
            (t, leaf.grad) for t, leaf in zip(outputs, leaves, strict=True) if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    return results
