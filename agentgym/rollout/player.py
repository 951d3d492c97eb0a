"""Who plays an episode: the `Player` protocol, the `Submission` it plays, and the turn loop.

A sampler decides when and where a step's episodes are played (in this process, ahead of
the learner, on Ray workers, on torchrun ranks); a `Player` decides how: it is handed a
policy, the environments and a `Submission`, and returns the finished trajectories. The
built-in players are `TurnPlayer` (the turn loop of `agentgym.rollout.episodes`:
transformers or vLLM, barrier or continuous turn batching, env worker threads, timeouts)
and `agentgym.serve.agents.AgentPlayer` (an agent program through the OpenAI-compatible
endpoint). Another kind (an environment served by another process, a user's own loop) is
one more class with `play` and `close`, named by `run.player` (`load_player`); samplers,
held-out evaluation and the loop do not change for it.

A player samples with the policy it is given and never loads weights: the sampler that
holds it does (`Sampler.load_weights`), and merges LoRA adapters around `play`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, cast

import gymnasium as gym
from transformers import PreTrainedTokenizerBase

from agentgym.policy.base import Policy, SamplingParams
from agentgym.rollout.episodes import TurnBatching, collect
from agentgym.types import TaskSpec, Trajectory

if TYPE_CHECKING:
    from agentgym.config import Config

Versions = Callable[[], int]
"""Called before each turn: the policy version the turn samples with (it may load newer
weights first: partial rollouts, `agentgym.rollout.ahead`)."""


@dataclass(frozen=True)
class Submission:
    """A step's (or an evaluation chunk's) episodes to play: `group_size` episodes of each
    task spec, sampled with `params`, each cut at `max_tokens` tokens (None: no limit)."""

    specs: tuple[TaskSpec, ...]
    group_size: int
    params: SamplingParams
    max_tokens: int | None = None

    @property
    def episodes(self) -> int:
        """How many episodes it plays: one per environment it needs."""
        return len(self.specs) * self.group_size

    def share(self, start: int, stop: int) -> Submission:
        """The same submission for groups `start .. stop` only (a worker's or a rank's)."""
        return Submission(self.specs[start:stop], self.group_size, self.params, self.max_tokens)


class Player(Protocol):
    """Plays a submission's episodes with a policy; returns their trajectories.

    `play` returns `submission.episodes` trajectories, grouped by task in the order of
    `submission.specs` (`Trajectory.group` numbering the task within the submission),
    each with the exact ids the policy sampled (mask 1) and every other token masked 0.
    A fault of one episode (its environment raising or hanging, its agent failing) makes
    that trajectory unscorable (`Trajectory.error`); it never fails the submission.
    """

    def play(
        self,
        policy: Policy,
        envs: Sequence[gym.Env],
        submission: Submission,
        versions: Versions | None = None,
    ) -> list[Trajectory]:
        """Plays `submission` in `envs` (at least `submission.episodes` of them, reset
        here; a list may have a hung one replaced). `versions`, when given, is asked
        before each turn for the version it samples with, and the sampled tokens record
        it (`Trajectory.token_versions`); None, or a player that does not ask: the caller
        stamps them."""
        ...

    def close(self) -> None:
        """Frees what the player holds (a server, its port); the policy is the caller's.
        A `play` after it starts again (held-out evaluation closes its player after each
        evaluation, so that nothing is held between two)."""
        ...


@dataclass(frozen=True)
class TurnPlayer:
    """The built-in turn loop (`agentgym.rollout.episodes.collect`): every live episode's
    turn in one decode batch, the environments' steps on `env_workers` threads.

    Attributes:
        tokenizer: The policy's tokenizer.
        env_timeout_s: Seconds an environment's `reset` or `step` may take before its
            episode is given up as unscorable (`run.env_step_timeout_s`); None: no limit.
        env_workers: Threads that call the environments at once (`run.env_workers`).
        turn_batching: How turns share the decode batch (`run.turn_batching`).
    """

    tokenizer: PreTrainedTokenizerBase
    env_timeout_s: float | None = None
    env_workers: int | None = None
    turn_batching: TurnBatching = "barrier"

    def play(
        self,
        policy: Policy,
        envs: Sequence[gym.Env],
        submission: Submission,
        versions: Versions | None = None,
    ) -> list[Trajectory]:
        s = submission
        return collect(
            envs,
            s.specs,
            s.group_size,
            policy,
            self.tokenizer,
            s.params,
            s.max_tokens,
            self.env_timeout_s,
            self.env_workers,
            versions,
            self.turn_batching,
        )

    def close(self) -> None:
        return None


PlayerFactory = Callable[["Config", PreTrainedTokenizerBase], Player]
"""What `run.player` names: called with the run's config and the policy's tokenizer, it
gives a `Player` (a class whose `__init__` takes those two is one)."""


def turn_player(config: Config, tokenizer: PreTrainedTokenizerBase) -> TurnPlayer:
    """The turn loop with the run's environment options (`run.env_step_timeout_s`,
    `run.env_workers`, `run.turn_batching`)."""
    run = config.run
    return TurnPlayer(tokenizer, run.env_step_timeout_s, run.env_workers, run.turn_batching)


def load_player(path: str) -> PlayerFactory:
    """The player factory `module:name` or `path/to/file.py:name` names (`run.player`);
    ValueError naming `run.player` and what is wrong."""
    where, name, factory = named_object("run.player", path, "my_players:Remote")
    if factory is None or not callable(factory):
        raise ValueError(
            f"run.player {path!r}: {where} has no callable {name!r}; a player factory is "
            "called with (config, tokenizer) and gives an object with play() and close()"
        )
    return cast(PlayerFactory, factory)


def named_object(option: str, path: str, example: str) -> tuple[str, str, Any]:
    """What `module:name` or `path/to/file.py:name` names, as (module, name, the object or
    None where the module has no such name); ValueError naming `option` when `path` is not
    of that form or its module cannot be imported (`run.player`, `run.agent`)."""
    where, _, name = path.rpartition(":")
    if not where or not name:
        raise ValueError(
            f"{option} {path!r}: give it as module:name or file.py:name, e.g. {example}"
        )
    try:
        module = _import(where)
    except (ImportError, OSError) as err:
        raise ValueError(f"{option} {path!r}: cannot import {where!r}: {err}") from None
    return where, name, getattr(module, name, None)


def _import(where: str) -> ModuleType:
    """The module `where` names: a dotted module, or a Python file's path (`.py`)."""
    if not where.endswith(".py"):
        return importlib.import_module(where)
    file = Path(where)
    spec = importlib.util.spec_from_file_location(f"agentgym_user_{file.stem}", file)
    if spec is None or spec.loader is None or not file.is_file():
        raise ImportError(f"no Python file at {where}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def user_player(config: Config, tokenizer: PreTrainedTokenizerBase) -> Player | None:
    """The player `run.player` names, made for this run; None without one."""
    if config.run.player is None:
        return None
    made: Any = load_player(config.run.player)(config, tokenizer)
    for method in ("play", "close"):
        if not callable(getattr(made, method, None)):
            raise ValueError(
                f"run.player {config.run.player!r} gave a {type(made).__name__}, which has "
                f"no {method}(); a player has play(policy, envs, submission, versions) and close()"
            )
    return cast(Player, made)
