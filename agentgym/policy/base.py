"""The policy contract: token ids in, sampled token ids and their logprobs out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions; temperature 0 decodes greedily.

    `stop`: strings that end a completion at the token that completes one of
    them. That token is kept, so the string stays in the completion (vLLM's
    `include_stop_str_in_output`): a tool call cut at `</tool_call>` still
    parses. The finish reason is "stop", as for a stop token.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    """One sampled completion: the new ids, the sampler's logprob of each, and why it ended.

    `logprobs[i]` is log p(ids[i]) under the distribution sampled from (logits
    divided by the temperature, before top-p). The stop token, when one was
    sampled, is the last id; so is the token that completed a stop string.
    """

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]


class TurnStream(Protocol):
    """One decode batch that turns join (`add`) and leave (`step` returns them) while it
    runs: continuous batching over turns (`Policy.turn_stream`)."""

    def __len__(self) -> int:
        """Turns added and not yet returned."""
        ...

    def add(self, key: int, prompt: list[int], stream: int | None = None) -> None:
        """Queues the turn of `prompt` under `key` (unique among the live ones); it joins
        the batch at the next `step`. `stream` names its random draws (`Policy.generate`)."""
        ...

    def step(self) -> list[tuple[int, Generation]]:
        """Decodes one step and returns the turns that ended on it, which leave the batch."""
        ...


class Policy(Protocol):
    """What the rollout and the training loop need from an inference backend.

    `generate` and `load_weights` are the contract. The optional abilities have
    defaults in `PolicyBase`, which the built-in backends subclass; `as_policy`
    gives them to any other object that has the two methods (a scripted test
    policy, a user's own backend), so that no caller probes for them: what a
    policy cannot do, it says (`streams_turns`).
    """

    @property
    def model(self) -> torch.nn.Module | None:
        """The in-process model it samples with (the learner's, or a copy); None for a
        separate engine (vLLM), which gets new weights only through `load_weights`."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Samples one completion per prompt (repeat a prompt G times for a group).

        `streams`, one 64-bit integer per prompt, names each row's random
        stream: the i-th token of a row draws the stream's i-th uniform, whatever
        else is in the batch. Two policies sampled with the same streams are
        coupled (common random numbers), so their difference is measured with
        far less noise; vLLM's per-request `seed` is the same idea. A backend
        that cannot honour them may ignore them.
        """
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies updated weights in, after a learner step."""
        ...

    def reusing_cache(self) -> AbstractContextManager[None]:
        """Within the block, prompts that extend an earlier call's may reuse its KV cache."""
        ...

    def released(self) -> AbstractContextManager[None]:
        """Within the block the backend frees what it can (GPU memory) for the learner."""
        ...

    def cancelling(self, cancelled: Callable[[int], bool]) -> AbstractContextManager[None]:
        """Within the block, `generate` may end prompt i's row early, as cut ("length"),
        once `cancelled(i)` is true (the server's client went away): the transformers
        backend at its next decode step; the others sample every row to its end."""
        ...

    def close(self) -> None:
        """Frees the backend (an engine, its folder); the policy is unusable after."""
        ...

    @property
    def streams_turns(self) -> bool:
        """Whether `turn_stream` works: continuous batching over turns
        (`run.turn_batching`); the transformers and vLLM backends have it."""
        ...

    def turn_stream(self, params: SamplingParams) -> AbstractContextManager[TurnStream]:
        """A decode batch turns join and leave while it runs (see `TurnStream`); only
        where `streams_turns`."""
        ...


class PolicyBase:
    """The optional abilities' defaults: no model of its own, no cache reuse, nothing to
    release or close, no turn stream. The built-in backends subclass it and override what
    they can do."""

    model: torch.nn.Module | None = None
    streams_turns: bool = False

    def reusing_cache(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def released(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def cancelling(self, cancelled: Callable[[int], bool]) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        return None

    def turn_stream(self, params: SamplingParams) -> AbstractContextManager[TurnStream]:
        raise NotImplementedError(
            f"{type(self).__name__} has no turn stream (streams_turns is False):"
            " use run.turn_batching 'barrier'"
        )


class _Plain(PolicyBase):
    """An object with `generate` (and `load_weights`) as a policy: the abilities it has of
    its own are used, the defaults stand in for the others. The one place that looks."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model = getattr(inner, "model", None)
        self.streams_turns = callable(getattr(inner, "turn_stream", None))

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: Sequence[int] | None = None,
    ) -> list[Generation]:
        return self.inner.generate(prompts, params, streams)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.inner.load_weights(named_tensors)

    def reusing_cache(self) -> AbstractContextManager[None]:
        own = getattr(self.inner, "reusing_cache", None)
        return own() if own is not None else contextlib.nullcontext()

    def released(self) -> AbstractContextManager[None]:
        own = getattr(self.inner, "released", None)
        return own() if own is not None else contextlib.nullcontext()

    def cancelling(self, cancelled: Callable[[int], bool]) -> AbstractContextManager[None]:
        own = getattr(self.inner, "cancelling", None)
        return own(cancelled) if own is not None else contextlib.nullcontext()

    def close(self) -> None:
        own = getattr(self.inner, "close", None)
        if own is not None:
            own()

    def turn_stream(self, params: SamplingParams) -> AbstractContextManager[TurnStream]:
        if not self.streams_turns:
            return super().turn_stream(params)
        return self.inner.turn_stream(params)


def as_policy(policy: Any) -> Policy:
    """`policy` itself when it is a `PolicyBase`, else `policy` with the defaults of the
    abilities it lacks (it needs `generate`; `load_weights` when weights are synced)."""
    # a PolicyBase is one of the backends, each of which implements generate and load_weights
    return cast(Policy, policy) if isinstance(policy, PolicyBase) else _Plain(policy)


def context_tokens(policy: Any) -> int | None:
    """The most tokens `policy`'s model can attend over (an in-process model's
    `max_position_embeddings`, a vLLM engine's `max_model_len`); None: it does not say."""
    engine = getattr(policy, "max_model_len", None)
    if isinstance(engine, int):
        return engine
    config = getattr(getattr(as_policy(policy), "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) else None


def check_generate_args(prompts: list[list[int]], streams: Sequence[int] | None) -> None:
    """The checks every backend's `generate` makes first: a prompt at least, none empty,
    and one stream per prompt when streams are given."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate() needs at least one prompt, and no empty prompt")
    if streams is not None and len(streams) != len(prompts):
        raise ValueError(
            f"generate() got {len(streams)} streams for {len(prompts)} prompts;"
            " give one per prompt, or none"
        )
