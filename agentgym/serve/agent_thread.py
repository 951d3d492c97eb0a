"""An agent program's episode on a thread of its own, with its own event loop, so that
`run.agent_timeout_s` bounds every agent: one that awaits, one that blocks (`time.sleep`,
a busy loop) and one that catches its cancellation alike.

The player waits for the thread's outcome up to the deadline. Past it, it cancels the
agent's task (an agent that awaits ends there), and the caller revokes what the agent was
given: the episode's path answers 404 and records nothing more, and the task's environment
refuses `call_tool` and `env_step`. The thread is then abandoned: it is a daemon (and the
threads it starts are daemons unless it says otherwise), so it cannot keep the process
alive. A Python thread cannot be killed: an agent that never returns keeps its thread, and
what it holds, until the process exits. A worker process could be killed, but could not
share the environment that `call_tool` and `env_step` run in; that is why a thread.

Whatever the agent raises, `SystemExit` and `KeyboardInterrupt` included, fails its episode,
not the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

Outcome = tuple[Any, str | None]
"""What the agent returned, and why its episode failed (None: it did not)."""


class _Handle:
    """The agent's event loop and task, once its thread has started them."""

    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None

    def cancel(self) -> None:
        if self.loop is not None and self.task is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: it ended
                self.loop.call_soon_threadsafe(self.task.cancel)


def _past(timeout_s: float) -> str:
    return f"the agent ran past run.agent_timeout_s ({timeout_s:g} s)"


def _raised(err: BaseException) -> str:
    said = f": {err}" if str(err) else ""
    return f"the agent raised {type(err).__name__}{said}"


def _outcome_of(play: Callable[[], Awaitable[Any]], handle: _Handle) -> Outcome:
    """Runs `play()` in a new event loop on this thread; what it returned, or its error."""

    async def main() -> Any:
        handle.loop, handle.task = asyncio.get_running_loop(), asyncio.current_task()
        return await play()

    try:
        return asyncio.run(main()), None
    except asyncio.CancelledError:
        return None, "the agent was cancelled"
    except BaseException as err:  # SystemExit, KeyboardInterrupt: the episode fails, not the run
        return None, _raised(err)


async def run_on_thread(
    play: Callable[[], Awaitable[Any]], timeout_s: float, name: str
) -> tuple[Outcome, bool]:
    """`play()` run on a daemon thread of its own; its outcome, and whether it ran past
    `timeout_s` (then the outcome is (None, the reason) and the thread is abandoned)."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[Outcome] = loop.create_future()
    handle = _Handle()

    def settle(outcome: Outcome) -> None:
        if not finished.done():
            finished.set_result(outcome)

    def body() -> None:
        outcome = _outcome_of(play, handle)
        with contextlib.suppress(RuntimeError):  # the player's loop has ended: none waits
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=body, name=name, daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(finished), timeout_s), False
    except TimeoutError:
        handle.cancel()
        return (None, _past(timeout_s)), True


async def run_here(play: Callable[[], Awaitable[Any]], timeout_s: float) -> tuple[Outcome, bool]:
    """`play()` in the caller's own event loop, bounded by `timeout_s` where it awaits: for
    the agent program an environment declares (library code that may share the loop's
    state, as verifiers' interception server does across episodes), not a user's."""
    try:
        return (await asyncio.wait_for(play(), timeout_s), None), False
    except TimeoutError:
        return (None, _past(timeout_s)), True
    except Exception as err:  # the agent's bug fails its episode, not the run
        return (None, _raised(err)), False


def stray_threads() -> list[str]:
    """The names of the threads the interpreter's teardown would wait for (an agent's, left
    running): not daemons, and not an executor's idle workers (their executors end them)."""
    pools = ("ThreadPoolExecutor-", "asyncio_")
    here = threading.current_thread()
    return [
        t.name
        for t in threading.enumerate()
        if t is not here and not t.daemon and not t.name.startswith(pools)
    ]
