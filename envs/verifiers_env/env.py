"""`agentgym/Verifiers-v0`: a verifiers (0.4.0, `verifiers.v1`) environment, trained on.

`--env verifiers:<module>` names an environment package as verifiers names one: a module
exporting its `vf.Taskset` subclass in `__all__` (its `Task` holds the rewards and metrics).
It is loaded with verifiers' own `load_environment(EnvConfig)`, the taskset's config fields
given by `run.env_kwargs` (each checked by the taskset's config class), and played by its
own harness: each episode is `Env.run_episode(task, ctx)` inside `Env.serving()`, the
harness program run by the subprocess runtime on this machine (prepared with `uv`), its
model calls relayed by verifiers' interception server to the episode's path on agentgym's
endpoint (`agentgym.envs.verifiers_env.agent:play`, which `make_player` chooses for this
env). Nothing is uploaded: verifiers uploads only from its eval CLI, which is not used.

Tasks are the taskset's rows, in `load()` order, at most `max_tasks` of them. Verifiers'
tasksets have no splits; here every `test_every`-th row (rows `test_every - 1`,
`2 * test_every - 1`, ...) is a test task and the rest are train tasks. A task's id is its
row's `id` (else `name`) where every row has a distinct one, else `row-<index>`.

The reward is the episode's: the sum over its traces of each `@vf.reward`'s score times its
weight (a single-agent env has one trace), as verifiers' `Trace.reward` sums it. Each
reward is a reward part under its name (weighted); each `@vf.metric` under `metric/<name>`.
An episode verifiers marks failed (a harness or scoring error) fails with its errors.

`step()` is not how it is played: its turns are the harness's, and `respond` refuses.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any, ClassVar

from agentgym.env.core import AgentEnv, Feedback, Split, Task
from agentgym.extras import require
from agentgym.types import Message

require("verifiers", "agentgym/Verifiers-v0")  # before its import: the error names the extra
import verifiers.v1 as vf  # noqa: E402
from pydantic import ValidationError  # noqa: E402

OWN_KWARGS = ("harness", "test_every", "max_tasks", "tool_format", "tool_parser")
"""`run.env_kwargs` this env reads itself; every other one is the taskset's config field."""


class VerifiersError(RuntimeError):
    """A verifiers episode that did not complete: its errors, as verifiers recorded them."""


class VerifiersEnv(AgentEnv):
    """A verifiers environment package's taskset, played by its harness through the
    endpoint.

    Args:
        module: The environment package (importable; `vf-sums` and `vf_sums` name the same).
        harness: The verifiers harness id that plays it ("null": verifiers' chat loop,
            with the taskset's MCP tools, which runs no model-written code).
        test_every: Every `test_every`-th row is a test task.
        max_tasks: Most rows read (an infinite taskset is cut there).
        tool_format, tool_parser: Read by the endpoint (`docs/agents.md`), not here.
        system_prompt, render_mode: As for `AgentEnv` (the row's own system prompt wins).
        **taskset: The taskset config's fields (`num_tasks=6`).
    """

    agent_program: ClassVar[str | None] = "agentgym.envs.verifiers_env.agent:play"

    def __init__(
        self,
        module: str | None = None,
        harness: str = "null",
        test_every: int = 5,
        max_tasks: int = 100_000,
        tool_format: str = "auto",
        tool_parser: str | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
        **taskset: Any,
    ):
        super().__init__(system_prompt, render_mode)
        if not module:
            raise ValueError(
                "agentgym/Verifiers-v0 needs its environment package: --env verifiers:<module>"
            )
        if test_every < 2 or max_tasks < 1:
            raise ValueError(
                f"run.env_kwargs.test_every={test_every}, max_tasks={max_tasks}: test_every "
                "must be at least 2 and max_tasks at least 1"
            )
        self.module, self.harness = module, harness
        self.vf_env = load(module, harness, taskset)
        rows = list(self.vf_env.taskset.take(max_tasks))
        ids = row_ids(rows)
        self.rows = dict(zip(ids, rows, strict=True))
        self.splits: dict[Split, list[str]] = {
            "train": [i for n, i in enumerate(ids) if n % test_every != test_every - 1],
            "test": [i for n, i in enumerate(ids) if n % test_every == test_every - 1],
        }
        for split, held in self.splits.items():
            if not held:
                raise ValueError(
                    f"verifiers environment {module!r} gives {len(ids)} task(s): its {split} "
                    f"split is empty (every {test_every}th row is a test task; "
                    "run.env_kwargs.test_every sets it)"
                )

    # -- tasks: the taskset's rows ---------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        return len(self.splits[split])

    def task_id(self, split: Split, index: int) -> str:
        return self.splits[split][index]

    def load_task(self, task_id: str) -> Task:
        row = self.rows.get(task_id)
        if row is None:
            some = ", ".join(list(self.rows)[:5])
            raise KeyError(
                f"no task {task_id!r} in verifiers environment {self.module!r}: {some}, ..."
            )
        data = row.data
        split = "train" if task_id in set(self.splits["train"]) else "test"
        answer = getattr(data, "answer", None)
        prompt = data.prompt if isinstance(data.prompt, str) else ""
        metadata = {"split": split, "row": data.idx, "key": row.key}
        return Task(task_id, prompt, None if answer is None else str(answer), metadata)

    def initial_messages(self, task: Task) -> list[Message]:
        data = self.rows[task.task_id].data
        system = data.system_prompt or self.system_prompt
        opening = [Message("system", system)] if system else []
        if isinstance(data.prompt, str):
            return [*opening, Message("user", data.prompt)]
        for message in data.prompt or []:
            content = message.content if isinstance(message.content, str) else str(message.content)
            opening.append(Message(message.role, content))
        return opening

    def respond(self, action: str) -> Feedback:
        raise NotImplementedError(
            "agentgym/Verifiers-v0 is played by its verifiers harness through the endpoint "
            f"({self.agent_program}), not turn by turn with step()"
        )

    # -- an episode, played by the harness ---------------------------------------------

    async def play(
        self, base_url: str, task_id: str, api_key: str = "EMPTY"
    ) -> tuple[float, dict[str, float]]:
        """Plays task `task_id` with the harness, its model calls sent to `base_url` (an
        OpenAI-compatible endpoint) with `api_key`; the episode's reward and its parts.
        Raises VerifiersError when verifiers records the episode as failed."""
        # verifiers reads the key from an environment variable it is given the name of: one
        # of the episode's own, so that episodes played at once each send their own key
        variable = f"AGENTGYM_VERIFIERS_KEY_{uuid.uuid4().hex}"
        os.environ[variable] = api_key
        try:
            client = vf.EvalClientConfig(base_url=base_url, api_key_var=variable)
            ctx = vf.ModelContext(model="agentgym", client=client)
            async with self.vf_env.serving():
                episode = await self.vf_env.run_episode(self.rows[task_id], ctx)
        finally:
            os.environ.pop(variable, None)
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if not episode.ok or errors:
            said = "; ".join(f"{e.type}: {e.message}" for e in errors) or "no error recorded"
            raise VerifiersError(f"verifiers episode of task {task_id!r} failed: {said}")
        reward, parts = 0.0, dict[str, float]()
        for trace in episode.traces:
            reward += trace.reward
            for name, value in trace.rewards.items():
                if value is not None:
                    parts[name] = parts.get(name, 0.0) + value.value
            for name, metric in trace.metrics.items():
                if metric is not None:
                    parts[f"metric/{name}"] = parts.get(f"metric/{name}", 0.0) + metric
        return reward, parts


def load(module: str, harness: str, taskset: dict[str, Any]) -> Any:
    """The verifiers `Env` of the package `module`, its agent played by `harness` in the
    subprocess runtime; ValueError naming the module and what is wrong."""
    config = {
        "taskset": {**taskset, "id": module},
        "agent": {
            "harness": {"id": harness, "env": {"PATH": uv_path()}},
            "runtime": {"type": "subprocess"},
        },
    }
    try:
        return vf.load_environment(vf.resolve_env_config(config))
    except ValidationError as err:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or '?'}: {e['msg']}" for e in err.errors()
        )
        raise ValueError(
            f"verifiers environment {module!r} refuses its run.env_kwargs ({fields}); "
            f"this env's own are {', '.join(OWN_KWARGS)}, the rest are its taskset's fields"
        ) from None
    except (ModuleNotFoundError, AttributeError, TypeError) as err:
        raise ValueError(
            f"--env verifiers:{module}: not a verifiers environment package: {err}"
        ) from None


def uv_path() -> str:
    """PATH with `uv` on it (verifiers prepares its harness programs with it), found
    where it is on PATH or beside this interpreter; ValueError if it is in neither."""
    path = os.environ.get("PATH", "")
    if shutil.which("uv") is not None:
        return path
    beside = Path(sys.executable).parent
    if (beside / "uv").exists():
        return f"{beside}{os.pathsep}{path}"
    raise ValueError(
        "agentgym/Verifiers-v0 needs `uv` (verifiers runs its harness programs with it): "
        "pip install 'agentgym[verifiers]'"
    )


def row_ids(rows: list[Any]) -> list[str]:
    """Each row's id: its `id`, else its `name`, where every row has a distinct one;
    else `row-<index>`."""
    for field in ("id", "name"):
        ids = [getattr(row.data, field) for row in rows]
        if all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids):
            return ids
    return [f"row-{n}" for n in range(len(rows))]
