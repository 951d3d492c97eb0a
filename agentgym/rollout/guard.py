"""Calls into an environment that may hang: past a time limit the call is abandoned.

An environment's `reset` or `step` runs arbitrary code (a sandbox, a tool
server, an HTTP API, a user's `step`). One that hangs must cost its episode,
not the batch: `call_within` runs the call on a daemon thread and gives up on
it after `timeout_s`. A thread cannot be killed, so the abandoned call may go
on in the background; the environment it was running in is no longer used
(`collect` makes a fresh one from its spec, see `agentgym.rollout.episodes`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class EnvTimeoutError(TimeoutError):
    """An environment's `reset` or `step` took longer than `run.env_step_timeout_s`."""


def call_within(call: Callable[[], T], timeout_s: float | None, what: str) -> T:
    """`call()`, or EnvTimeoutError once it has run `timeout_s` seconds; None: no limit.

    With a limit the call runs on another thread (exceptions are re-raised here);
    without one it runs on this thread, exactly as a plain call.

    Raises:
        EnvTimeoutError: naming `what` and the limit, when the call has not returned.
    """
    if timeout_s is None:
        return call()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as err:  # handed to the caller's thread, raised there
            box["error"] = err

    thread = threading.Thread(target=target, name=f"agentgym-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise EnvTimeoutError(
            f"{what} did not return within {timeout_s:g} s (run.env_step_timeout_s)"
        )
    if "error" in box:
        raise box["error"]  # type: ignore[misc]  # a BaseException, stored above
    return box["value"]  # type: ignore[return-value]  # what call() returned


def each_call(
    pool: ThreadPoolExecutor | None, call: Callable[[T], R], items: Sequence[T]
) -> list[R]:
    """`call` of each item, in the items' order: at once on `pool`'s threads, or one after
    another on this thread where `pool` is None (`env_workers` 1)."""
    if pool is None:
        return [call(item) for item in items]
    return list(pool.map(call, items))


def call_on(pool: ThreadPoolExecutor | None, call: Callable[..., R], *args: Any) -> Future[R]:
    """`call(*args)` on `pool`, or here and now where it is None (`env_workers` 1)."""
    if pool is not None:
        return pool.submit(call, *args)
    done: Future[R] = Future()
    done.set_result(call(*args))
    return done
