"""`agentgym/Harbor-v0` (`--env harbor:<folder>`): a folder of Harbor tasks, played by a
multi-turn code agent in each task's own Docker container.

An episode: the opening user message is the task's `instruction.md`; the agent calls
tools (`shell`: a command under `bash -lc` in the container; `write_file`; `edit_file`:
one exact replacement in a file), in the format of the other tool envs, and each call's
result comes back as a tool message. The episode ends when the agent answers without a
call, or after `max_turns` turns. Then, as harbor's verifier does, the task's `tests/`
are copied to `/tests` in the same container, `tests/test.sh` runs (as `[verifier] user`,
with `[verifier] env`, under `[verifier] timeout_sec`), and the reward it wrote to
`/logs/verifier/reward.json` or `reward.txt` is the episode's reward, read by `reward`
(named numbers as reward parts; a missing or garbled file is 0, with the reason in
`info["harbor"]`). Every step before the last pays 0.

Rewards are paid only at the end the env sees: an episode cut by the rollout's token
budget (`sampling.max_episode_tokens`) or a `TimeLimit` shorter than `max_turns` is not
tested and scores 0; the registered limit equals the default `max_turns` for that reason.

Tasks are the folder's task folders (`tasks.read_tasks`; ids: their names). The splits
are disjoint: `test_tasks` names the held-out ones, else a stable `test_fraction` of them
by name hash (`tasks.split_tasks`); a folder of one task plays it in both.
The container (`container`) starts at the episode's first tool call or its tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.env.core import Feedback, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ToolEnv
from agentgym.envs.harbor.container import Container, Engine, Output
from agentgym.envs.harbor.reward import REWARD_JSON, REWARD_TXT, Verdict, read_reward
from agentgym.envs.harbor.schema import HarborTaskError
from agentgym.envs.harbor.tasks import HarborTask, read_tasks, split_tasks
from agentgym.tools import RunnableTool, error_counts, tool
from agentgym.types import ToolCall

MAX_OUTPUT_BYTES = 16_000
"""Each of a shell command's stdout and stderr is cut here (a marker says so)."""
MAX_FILE_BYTES = 64_000
"""The largest file `write_file` and `edit_file` write (the text travels as an argument)."""
_TEMPLATE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def format_output(result: Output, limit_s: float) -> str:
    """A command's outcome as the agent reads it: exit code, then the non-empty streams."""
    head = f"exit code {result.exit_code}"
    if result.timed_out:
        head += f" (killed: past the {limit_s:g} s limit)"
    if result.cut:  # said first: the tool's result may be cut shorter still
        head += f" [output cut at {MAX_OUTPUT_BYTES} bytes per stream]"
    parts = [head]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            parts.append(f"{name}:\n{text.rstrip()}")
    return "\n".join(parts)


def resolve_env(values: Mapping[str, str], where: str) -> dict[str, str]:
    """task.toml `env` values with `${VAR}` and `${VAR:-default}` filled from this process's
    environment, as harbor fills them; HarborTaskError naming a variable that is unset."""

    def fill(match: re.Match[str]) -> str:
        value = os.environ.get(match[1], match[2])
        if value is None:
            raise HarborTaskError(f"{where} needs the environment variable {match[1]}")
        return value

    return {key: _TEMPLATE.sub(fill, value) for key, value in values.items()}


class HarborEnv(ToolEnv):
    """A folder of Harbor tasks; see the module docstring.

    Args:
        folder: A Harbor task folder, or a folder of them (`--env harbor:<folder>`).
        test_fraction: Share of the tasks held out as the test split (by name hash).
        test_tasks: The held-out tasks by name; overrides `test_fraction`.
        max_turns: Turns after which the episode ends and the tests run.
        command_timeout_s: Time limit of one shell command (at most `[agent] timeout_sec`).
        memory_mb: Memory of each container (no swap), where task.toml sets none.
        cpus: CPU quota of each container, where task.toml sets none.
        tool_format, tool_parser, max_result_chars, system_prompt, render_mode: As for
            `ToolEnv`.
    """

    default_system_prompt = (
        "You are an agent in a Linux container. Complete the user's task there with the "
        "tools: run shell commands, write and edit files. The container has no network. "
        "When the task is done, answer without calling a tool; your work is then tested."
    )

    def __init__(
        self,
        folder: str | None = None,
        test_fraction: float = 0.2,
        test_tasks: Sequence[str] | None = None,
        max_turns: int = 16,
        command_timeout_s: float = 60.0,
        memory_mb: int = 2048,
        cpus: float = 1.0,
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        max_result_chars: int = 8000,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(
            tool_format=tool_format,
            max_turns=max_turns,
            max_result_chars=max_result_chars,
            system_prompt=system_prompt,
            render_mode=render_mode,
            tool_parser=tool_parser,
        )
        if not folder:
            raise HarborTaskError(
                "agentgym/Harbor-v0 needs a folder of Harbor tasks: --env harbor:<folder>"
            )
        if not command_timeout_s > 0 or not memory_mb >= 64 or not cpus > 0:
            raise HarborTaskError(
                f"command_timeout_s={command_timeout_s}, memory_mb={memory_mb}, cpus={cpus}; "
                "valid: a positive timeout, memory_mb >= 64, positive cpus"
            )
        self.harbor_tasks = {t.task_id: t for t in read_tasks(folder)}
        self.splits = split_tasks(list(self.harbor_tasks), test_fraction, test_tasks)
        self.command_timeout_s, self.memory_mb, self.cpus = command_timeout_s, memory_mb, cpus
        self.engine = Engine()
        try:
            self.images = self._build_images()
        except HarborTaskError:
            self.engine.close()
            raise
        self.container: Container | None = None

    def _build_images(self) -> dict[str, str]:
        """Each task's image, built once; every task that cannot be built, named together."""
        images, problems = {}, []
        for task_id, task in self.harbor_tasks.items():
            try:
                images[task_id] = self.engine.image(task)
            except HarborTaskError as err:
                problems.append(str(err))
        if problems:
            raise HarborTaskError("\n".join(problems))
        return images

    # -- tasks -------------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        return len(self.splits[split])

    def task_id(self, split: Split, index: int) -> str:
        ids = self.splits[split]
        if not 0 <= index < len(ids):
            raise IndexError(f"task index {index} out of range 0..{len(ids) - 1}")
        return ids[index]

    def load_task(self, task_id: str) -> Task:
        if task_id not in self.harbor_tasks:
            raise KeyError(f"no Harbor task {task_id!r}; valid: {sorted(self.harbor_tasks)}")
        split = "test" if task_id in self.splits["test"] else "train"
        if task_id in self.splits["train"] and task_id in self.splits["test"]:
            split = "train"  # a folder of one task: it is in both
        task = self.harbor_tasks[task_id]
        return Task(task_id, task.instruction, metadata={"split": split})

    @property
    def harbor_task(self) -> HarborTask:
        assert self.task is not None  # asked within an episode
        return self.harbor_tasks[self.task.task_id]

    def demonstration(self, task: Task) -> list[str]:
        """The task's `solution/solve.sh`, run as one shell call, then a closing answer."""
        script = self.harbor_tasks[task.task_id].solve_script
        if not script.is_file():
            raise NotImplementedError(f"Harbor task {task.task_id!r} has no {script}")
        call = self.format.render_call(ToolCall("shell", {"command": script.read_text()}))
        return [call, "Done."]

    # -- the container and its tools -----------------------------------------------

    def box(self) -> Container:
        """This episode's container, started on first use."""
        if self.container is None:
            task = self.harbor_task
            self.container = self.engine.start(
                task,
                self.images[task.task_id],
                memory_mb=task.memory_mb or self.memory_mb,
                cpus=task.cpus or self.cpus,
            )
        return self.container

    def _agent_user(self) -> str | None:
        user = self.harbor_task.section("agent").get("user")
        return None if user is None else str(user)

    def _command_limit_s(self) -> float:
        agent_limit = self.harbor_task.agent_timeout_s
        return min(self.command_timeout_s, agent_limit or self.command_timeout_s)

    def make_tools(self) -> Sequence[RunnableTool]:
        env = self

        def shell(command: str) -> str:
            """Runs a command with bash in the task's container and returns its output.

            Args:
                command: The shell command (pipes, &&, heredocs work; no network).
            """
            limit = env._command_limit_s()
            result = env.box().run(
                ["bash", "-lc", command],
                timeout_s=limit,
                max_bytes=MAX_OUTPUT_BYTES,
                user=env._agent_user(),
            )
            return format_output(result, limit)

        def write_file(path: str, content: str) -> str:
            """Writes a file in the container (its folders are made), replacing it if it exists.

            Args:
                path: The file's path, absolute or from the working directory.
                content: The whole text of the file.
            """
            return env._write(path, content)

        def edit_file(path: str, old: str, new: str) -> str:
            """Replaces the one occurrence of `old` in a file of the container with `new`.

            Args:
                path: The file's path, absolute or from the working directory.
                old: Text that occurs exactly once in the file.
                new: The text to put in its place.
            """
            data = env.box().read(path, MAX_FILE_BYTES, user=env._agent_user())
            if data is None:
                return f"error: cannot read {path}"
            text = data.decode("utf-8", errors="replace")
            count = text.count(old) if old else 0
            if count != 1:
                return f"error: `old` occurs {count} times in {path}; it must occur exactly once"
            return env._write(path, text.replace(old, new, 1))

        limit = self.command_timeout_s + 30  # the container's own limit comes first
        return [tool(f, timeout_s=limit) for f in (shell, write_file, edit_file)]

    def _write(self, path: str, content: str) -> str:
        data = content.encode()
        if len(data) > MAX_FILE_BYTES:
            return f"error: {len(data)} bytes; files are written up to {MAX_FILE_BYTES} bytes"
        result = self.box().write(path, data, user=self._agent_user())
        if result.exit_code != 0:
            return f"error: cannot write {path}: {result.stderr.strip() or result.exit_code}"
        return f"wrote {len(data)} bytes to {path}"

    # -- the episode -------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self._remove_container()
        return super().reset(seed=seed, options=options)

    def respond(self, action: str) -> Feedback:
        """Runs the turn's calls; at the episode's end, the task's tests give the reward."""
        self.turns += 1
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        results = self.toolbox.run(parsed.calls) if parsed.calls else []
        info: dict[str, Any] = {
            "tool_calls": len(parsed.calls),
            "tool_errors": error_counts(results),
        }
        observation = tuple(self.format.observation(results))
        ended = not parsed.calls
        if not ended and not self._out_of_turns():
            return Feedback(observation, 0.0, {}, terminated=False, info=info)
        verdict, details = self.verify()
        info["harbor"] = {**details, "reason": verdict.reason}
        return Feedback(observation, verdict.reward, dict(verdict.parts), ended, info)

    def verify(self) -> tuple[Verdict, dict[str, Any]]:
        """Runs the task's tests in this episode's container, as harbor's verifier does;
        returns the verdict and what the run said (exit code, output's tail)."""
        task = self.harbor_task
        verifier = task.section("verifier")
        try:
            environment = resolve_env(verifier.get("env", {}), f"{task.task_id}: [verifier] env")
        except HarborTaskError as err:
            return Verdict(0.0, reason=str(err)), {}
        box = self.box()
        prepare = (
            "mkdir -p /logs/verifier && chmod 777 /logs /logs/verifier && "
            f"rm -f {REWARD_JSON} {REWARD_TXT}"
        )
        box.run(["sh", "-c", prepare], timeout_s=30, max_bytes=4096, user="root")
        box.upload(task.folder / "tests", "/tests")
        user = verifier.get("user")
        run = box.run(
            ["bash", "-c", "/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"],
            timeout_s=task.verifier_timeout_s,
            max_bytes=MAX_OUTPUT_BYTES,
            user=None if user is None else str(user),
            environment=environment,
        )
        log = box.read("/logs/verifier/test-stdout.txt", MAX_OUTPUT_BYTES, user="root") or b""
        details = {
            "test_exit_code": run.exit_code,
            "test_timed_out": run.timed_out,
            "test_output": log.decode("utf-8", errors="replace")[-2000:],
        }
        texts = [box.read(p, MAX_FILE_BYTES, user="root") for p in (REWARD_JSON, REWARD_TXT)]
        verdict = read_reward(*(None if t is None else t.decode("utf-8", "replace") for t in texts))
        if run.timed_out and verdict.reason:
            reason = f"the tests ran past [verifier] timeout_sec={task.verifier_timeout_s:g}"
            verdict = Verdict(0.0, verdict.parts, f"{reason}; {verdict.reason}")
        return verdict, details

    def _remove_container(self) -> None:
        if self.container is not None:
            self.container.remove()
            self.container = None

    def close(self) -> None:
        self._remove_container()
        self.engine.close()
        super().close()
