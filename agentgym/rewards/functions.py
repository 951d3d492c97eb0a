"""User reward functions (TRL's `reward_funcs`), run in a worker process that a timeout can stop.

Each entry of the config's `rewards.functions` names a plain Python function,
"package.module:function", called once per finished episode with keyword
arguments:

- `messages`: the whole conversation as chat dicts (`{"role", "content"}`, and
  `"name"` on tool messages), from the opening messages to the environment's
  last reply;
- `completion`: the text of the assistant's turns, joined by newlines;
- `task_id`: the task's id, as `info["task_id"]` gives it;
- `env_reward`: the environment's own reward for the episode;
- `env_reward_parts`: the environment's reward parts, such as `{"correctness": 1.0}`.

More may be added: a function should take `**kwargs`. It returns a finite
number. That number times the entry's `weight` is added to the episode's
reward and recorded in `reward_parts` under the function's name.

A function that raises, returns None, NaN, inf or a non-number, or takes longer
than `rewards.timeout_s` on an episode makes that episode unscorable: its
reward is not a verified outcome, so its advantage is 0 and it stays out of
its group's statistics; `Trajectory.reward_error` says why and the step's
`reward/failed` counts it. The episode's remaining functions are not called.

Why a process: the functions run in one worker (multiprocessing "spawn", so
nothing of the trainer's state, CUDA included, is forked), one call at a
time over a pipe. A call past its timeout gets the worker's process group
killed, and the next call starts a fresh worker. This guards the run against
a function that hangs or crashes; it is not a sandbox: reward functions are
the user's code, trusted as the config is, and the model's text reaches
them only as data. As with any "spawn" process, a script that starts
training itself must do so under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from agentgym.config import ConfigError, RewardsConfig
from agentgym.types import Trajectory

ARGUMENTS = ("messages", "completion", "task_id", "env_reward", "env_reward_parts")
"""The keyword arguments every reward function is called with."""
OPTIONAL = ("turns",)
"""Keyword arguments a function gets when its signature names them (or takes **kwargs):
`turns`, the assistant's turns as a list of strings (TRL's completions shape)."""

_START_TIMEOUT_S = 120.0  # a fresh worker imports torch (through agentgym) and the user's modules


class _Unscored(Exception):
    """A reward function gave no value for an episode; the message says why."""


class RewardFunctions:
    """Scores finished episodes with the configured reward functions.

    Use it as a context manager, or call `close()`, to end the worker process;
    the worker starts at the first call (a few seconds) and again after a timeout.

    Args:
        config: The `rewards` section of the run's config.

    Raises:
        ConfigError: naming `rewards.functions[i].fn` when that function cannot be
            imported, is not a function, cannot take the keyword arguments, or has
            the name of an earlier one (parts are recorded by name).
    """

    def __init__(self, config: RewardsConfig):
        self.paths = [entry.fn for entry in config.functions]
        self.weights = [entry.weight for entry in config.functions]
        self.names: list[str] = []
        for index, path in enumerate(self.paths):
            _check(index, path)
            name = path.partition(":")[2]
            if name in self.names:
                raise ConfigError(
                    f"rewards.functions[{index}].fn = {path!r}: the name {name!r} is taken by "
                    f"rewards.functions[{self.names.index(name)}]; reward parts are recorded "
                    "by function name, so each function needs its own"
                )
            self.names.append(name)
        self.timeout_s = config.timeout_s
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def __enter__(self) -> RewardFunctions:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def score(self, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
        """The trajectories with every function's weighted value added to reward and parts.

        An episode that is already unscorable is returned as it is; one on which
        a function fails keeps the environment's reward and gets `reward_error`.
        """
        return [self._score_one(t) for t in trajectories]

    def _score_one(self, trajectory: Trajectory) -> Trajectory:
        if not self.paths or not trajectory.scorable:
            return trajectory
        kwargs = episode_kwargs(trajectory)
        parts: dict[str, float] = {}
        for index, name in enumerate(self.names):
            try:
                parts[name] = self.weights[index] * self._call(index, kwargs)
            except _Unscored as failure:
                return replace(trajectory, reward_error=f"{self.paths[index]} {failure}")
        return replace(
            trajectory,
            reward=trajectory.reward + sum(parts.values()),
            reward_parts={**trajectory.reward_parts, **parts},
        )

    def _call(self, index: int, kwargs: dict[str, Any]) -> float:
        """Function `index`'s value on one episode; raises _Unscored saying why there is none."""
        conn = self._worker()
        try:
            conn.send((index, kwargs))
            if not conn.poll(self.timeout_s):
                self._kill()
                raise _Unscored(
                    f"returned nothing within rewards.timeout_s={self.timeout_s:g} s "
                    "(its worker was killed)"
                )
            ok, payload = conn.recv()
        except (EOFError, OSError):  # the worker died: the function crashed it or exited
            process = self._process
            self._kill()
            code = process.exitcode if process is not None else None
            raise _Unscored(f"ended its worker process (exit code {code})") from None
        if not ok:
            raise _Unscored(payload)
        return payload

    def _worker(self) -> Connection:
        """The pipe to the worker, started first if there is none."""
        if self._conn is not None:
            return self._conn
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_serve, args=(theirs, self.paths), daemon=True, name="agentgym-reward-fns"
        )
        process.start()
        theirs.close()
        self._process, self._conn = process, ours
        if not ours.poll(_START_TIMEOUT_S):
            self._kill()
            raise RuntimeError(
                f"the reward-function worker did not start in {_START_TIMEOUT_S:g} s"
            )
        try:
            ok, message = ours.recv()
        except EOFError:
            ok, message = False, "it exited during start-up"
        if not ok:
            self._kill()
            raise RuntimeError(f"the reward-function worker failed: {message}")
        return ours

    def _kill(self) -> None:
        """Kills the worker and whatever it started (its process group), and waits for it."""
        if self._process is None:
            return
        if self._conn is not None:
            self._conn.close()
        if self._process.exitcode is None:  # not reaped yet, so its pid is still its own
            assert self._process.pid is not None  # `_worker` keeps only a started process
            with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
                os.killpg(self._process.pid, signal.SIGKILL)  # the worker leads its own group
            self._process.kill()
        self._process.join()
        self._process = self._conn = None

    @property
    def worker_pid(self) -> int | None:
        """The running worker's process id; None when there is none."""
        return None if self._process is None else self._process.pid

    def close(self) -> None:
        """Ends the worker: it leaves when its pipe closes, and is killed after 5 s if not."""
        if self._process is None:
            return
        assert self._conn is not None
        self._conn.close()
        self._conn = None
        self._process.join(timeout=5.0)
        self._kill()


def episode_kwargs(trajectory: Trajectory) -> dict[str, Any]:
    """The keyword arguments (ARGUMENTS and OPTIONAL) a reward function may get for one
    episode; `_serve` leaves out the optional ones its function does not take."""
    messages = [m.to_dict() for m in trajectory.prompt_messages]
    for turn in trajectory.turns:
        messages.append({"role": "assistant", "content": turn.action})
        messages.extend(m.to_dict() for m in turn.observation)
    return {
        "messages": messages,
        "completion": "\n".join(turn.action for turn in trajectory.turns),
        "turns": [turn.action for turn in trajectory.turns],
        "task_id": trajectory.task_id,
        "env_reward": trajectory.reward,
        "env_reward_parts": dict(trajectory.reward_parts),
    }


def _check(index: int, path: str) -> None:
    """Imports `path` here, before any worker starts; ConfigError naming the field if it fails."""
    field = f"rewards.functions[{index}].fn = {path!r}"
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"{field}: cannot import module {module_name!r} ({err}); name a module importable "
            "where the run starts, as 'package.module:function'"
        ) from err
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(
            key
            for key, value in vars(module).items()
            if inspect.isfunction(value)
            and value.__module__ == module.__name__
            and not key.startswith("_")
        )
        raise ConfigError(
            f"{field}: module {module_name!r} has no function {name!r}; "
            f"its functions: {', '.join(defined) or 'none'}"
        )
    try:
        named = [n for n in OPTIONAL if _takes(fn, n)]
        inspect.signature(fn).bind(**dict.fromkeys([*ARGUMENTS, *named]))
    except TypeError as err:
        raise ConfigError(
            f"{field}: the function cannot be called with the keyword arguments "
            f"{', '.join(ARGUMENTS)} ({err}); give it **kwargs"
        ) from err
    except ValueError:  # no signature to read (a builtin): the first call will tell
        pass


def _resolve(path: str) -> Callable[..., Any]:
    module_name, _, name = path.partition(":")
    return getattr(importlib.import_module(module_name), name)


def _serve(conn: Connection, paths: list[str]) -> None:
    """The worker: imports the functions, says so, then answers (index, kwargs) requests.

    Each answer is (True, value as a finite float) or (False, why there is none).
    It returns when the trainer closes the pipe.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setsid()  # its own process group, so that a kill reaches what a function started
    try:
        functions = [_resolve(path) for path in paths]
    except Exception as err:
        conn.send((False, f"importing the functions raised {type(err).__name__}: {err}"))
        return
    conn.send((True, None))
    dropped = [{n for n in OPTIONAL if not _takes(fn, n)} for fn in functions]
    while True:
        try:
            index, kwargs = conn.recv()
        except EOFError:
            return
        given = {k: v for k, v in kwargs.items() if k not in dropped[index]}
        conn.send(_apply(functions[index], given))


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` takes the keyword argument `name` (by that name, or as **kwargs)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except ValueError:  # no signature to read (a builtin)
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def _apply(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, float | str]:
    try:
        value = fn(**kwargs)
    except Exception as err:
        return False, f"raised {type(err).__name__}: {err}"
    number = _as_number(value)
    if number is None:
        shown = repr(value) if len(repr(value)) <= 40 else type(value).__name__
        return False, f"returned {shown}, not a number"
    if not math.isfinite(number):
        return False, f"returned {number}"
    return True, number


def _as_number(value: Any) -> float | None:
    """`value` as a float (ints, bools, numpy and 0-d torch scalars convert); None if not one."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
