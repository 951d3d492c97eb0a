"""What the engine's two loops share: a submitted request, and how its future is settled."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from agentgym.policy.base import Generation, SamplingParams


class OutOfMemory(MemoryError):
    """Sampling a batch failed to allocate memory; its requests fail, the engine goes on."""


def _out_of_memory(err: BaseException) -> bool:
    """Whether `err` is an allocation that failed (Python's, or torch's on CPU or GPU)."""
    said = str(err).lower()
    return (
        isinstance(err, MemoryError) or "can't allocate memory" in said or "out of memory" in said
    )


def settle(future: Future, result: object = None, error: BaseException | None = None) -> None:
    """Gives `future` its result or error, unless it was cancelled meanwhile."""
    with contextlib.suppress(InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def failed(err: Exception, items: list[Pending], params: SamplingParams) -> Exception:
    """The error the requests of a batch whose sampling raised `err` get: `OutOfMemory`
    where an allocation failed, else `err` itself."""
    if not _out_of_memory(err):
        return err
    rows = sum(len(i.prompt) + params.max_new_tokens for i in items)
    return OutOfMemory(
        f"sampling a batch of {len(items)} requests ({rows} tokens at most) "
        f"failed to allocate memory: {err}"
    )


@dataclass
class Pending:
    """A prompt submitted to the engine, and the future of its completion."""

    prompt: list[int]
    params: SamplingParams
    stream: int
    future: Future[tuple[Generation, int]] = field(default_factory=Future)
