"""`FunctionCallsEnv`: function-calling rows, each with its own tools, judged by their calls.

The rows of published function-calling data (see `agentgym.rewards.calls` for the two
forms of expected calls) become tasks whose answer *is* the calls. The row's function
schemas are rendered to the model the way every tool is (the native template's
`tools=`, Hermes, ReAct). By default nothing runs (judge-only): the episode ends after
the first assistant turn, which either calls or answers, and that turn's calls are
judged against the row's. With `tools` given (callables named as the rows' functions),
the calls run and the episode goes on until a turn without calls; all its calls are
judged then.

The reward is `combine(parts, reward_weights)` over ToolEnv's three parts, default
weights `{"correctness": 1.0, "tool": 0.5, "format": 0.1}`: "correctness" and "tool" from
`agentgym.rewards.calls.call_parts` (`call_reward` "seed" or "toolrl"), and "format":
0.3 when no call was malformed (invalid JSON, cut off, no name, arguments not an object)
and the episode ended with a turn that was not cut off, else -0.2. `info` carries
"correct", "category" (the row's, or None) and "calls_expected".
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.env.core import Feedback, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import FORMAT_ERRORS, ToolEnv
from agentgym.envs.tasks.table import opening_messages
from agentgym.rewards.bfcl import bfcl_demonstration, bfcl_parts
from agentgym.rewards.calls import (
    CALL_REWARDS,
    STRING_MATCHES,
    CallReward,
    StringMatch,
    call_parts,
    match_calls,
)
from agentgym.tools import RunnableTool, ToolBox, error_counts, schema_tool
from agentgym.tools.function_tools import SchemaTool
from agentgym.tools.toolbox import CallOutcome
from agentgym.types import Message, ToolCall

BOXES_CACHED = 512
"""Rows whose ToolBox is kept (a row's box is built at its first reset)."""


def _not_run(**arguments: Any) -> str:
    """What a judge-only tool answers if ever run: nothing runs without callables."""
    return "Error: this function is not executed; the call itself is the answer"


@dataclass(frozen=True)
class BoundTool:
    """A row's function (its schema, its argument checks) run by the given tool of its name."""

    row: SchemaTool
    given: RunnableTool

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def timeout_s(self) -> float | None:
        return self.given.timeout_s

    def schema(self) -> dict[str, Any]:
        return self.row.schema()

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        return self.row.check_arguments(arguments)

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        return self.given.invoke(arguments, timeout_s)


class FunctionCallsEnv(ToolEnv):
    """Rows with their own function schemas and expected calls (see the module).

    Subclasses that generate their rows override the task hooks; the rows' tasks carry
    metadata "schemas" (OpenAI "function" objects, strict types), "call_specs" and
    "category", as `agentgym.envs.tasks.table` makes them.

    Args:
        string_match: "exact" or "normalized" string comparison of argument values, or
            "bfcl": BFCL v4's checker decides "correctness" (`agentgym.rewards.bfcl`).
        call_reward: "seed" or "toolrl", the tool part's rule.
        tools: Callables to run the calls with, by function name; empty: judge-only.
        instructions: The system prompt's task instructions; None for the default.
        tool_format, tool_parser, max_turns, max_result_chars, max_calls_per_turn,
        reward_weights, render_mode: as for `ToolEnv`.
    """

    default_system_prompt = (
        "You can call the functions below. When one of them answers the user's request, "
        "call it (several calls at once if the request needs them), with every argument "
        "the request gives. When none of them fits, say so in a sentence and call nothing."
    )

    def __init__(
        self,
        *,
        string_match: StringMatch = "exact",
        call_reward: CallReward = "seed",
        tools: Sequence[RunnableTool] = (),
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        max_turns: int | None = None,
        max_result_chars: int = 2000,
        max_calls_per_turn: int = 8,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        if string_match not in STRING_MATCHES:
            raise ValueError(f"string_match={string_match!r}; valid: {', '.join(STRING_MATCHES)}")
        if call_reward not in CALL_REWARDS:
            raise ValueError(f"call_reward={call_reward!r}; valid: {', '.join(CALL_REWARDS)}")
        self.string_match: StringMatch = string_match
        self.call_reward: CallReward = call_reward
        self.callables = {t.name: t for t in tools}
        self.execute = bool(tools)
        self.box_options = {
            "max_result_chars": max_result_chars,
            "max_calls_per_turn": max_calls_per_turn,
        }
        super().__init__(
            tool_format=tool_format,
            tool_parser=tool_parser,
            max_turns=max_turns if self.execute else 1,
            max_result_chars=max_result_chars,
            max_calls_per_turn=max_calls_per_turn,
            reward_weights=reward_weights,
            system_prompt=system_prompt,
            render_mode=render_mode,
        )
        self.offered = functools.lru_cache(maxsize=BOXES_CACHED)(self._offered)

    # -- the row's tools -------------------------------------------------------------

    def _offered(self, task_id: str) -> tuple[ToolBox, str, dict[str, Any]]:
        """The ToolBox of a task's functions, their schemas as JSON, and their parameters."""
        functions = self.load_task(task_id).metadata["schemas"]
        tools = [self._tool(function) for function in functions]
        box = ToolBox(tools, **self.box_options)
        parameters = {f["name"]: f["parameters"] for f in functions}
        return box, json.dumps(box.schemas()), parameters

    def _tool(self, function: Mapping[str, Any]) -> RunnableTool:
        row = schema_tool(function, _not_run)
        if not self.execute:
            return row
        given = self.callables.get(row.name)
        if given is None:
            raise ValueError(
                f"function {row.name!r} of the data has no callable among tools "
                f"({', '.join(sorted(self.callables))}); valid: a tool of each name, or no "
                "tools (judge-only)"
            )
        return BoundTool(row, given)

    def make_tools(self) -> list[RunnableTool]:
        return []

    @property
    def toolbox(self) -> ToolBox:
        """The tools of the current task: the model sees and may call only those."""
        assert self.task is not None, "reset() first"
        return self.offered(self.task.task_id)[0]

    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the current task's functions (a fresh copy), as `info["tools"]`."""
        if self.task is None:
            return []
        schemas: list[dict[str, Any]] = json.loads(self.offered(self.task.task_id)[1])
        return schemas

    def initial_messages(self, task: Task) -> list[Message]:
        box = self.offered(task.task_id)[0]
        instructions = self.format.instructions(list(box.tools.values()))
        return opening_messages(task, self.system_prompt, instructions)

    # -- the episode -----------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        info["category"] = self.task.metadata.get("category")
        return obs, info

    def respond(self, action: str) -> Feedback:
        """Judges the turn's calls (judge-only), or runs them and goes on (with callables)."""
        assert self.task is not None  # step() checked it
        self.turns += 1
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        if self.execute and parsed.calls:
            results = self.toolbox.run(parsed.calls)
            self._record(parsed.calls, results)
        else:
            results = []
            self._note(parsed.calls)
        ended = not (self.execute and parsed.calls)
        parts = self._call_parts(finished=ended and not cut_off)
        info: dict[str, Any] = {
            "tool_calls": len(parsed.calls),
            "tool_errors": (
                error_counts(results)
                if results
                else dict(Counter(a.error.value for a in parsed.calls if a.error is not None))
            ),
            "category": self.task.metadata.get("category"),
        }
        if ended or self._out_of_turns():
            specs = self.task.metadata["call_specs"]
            info.update(
                correct=parts["correctness"] == 1.0,
                calls_expected=len(specs),
                final_answer=None if parsed.calls else parsed.final_answer,
                expected_answer=self.task.answer,
            )
        observation = tuple(self.format.observation(results))
        return self._pay(parts, observation, ended, info)

    def _note(self, attempts: Sequence[Any]) -> None:
        """A judge-only turn: its parsed calls are the episode's; malformed ones cost format."""
        for attempt in attempts:
            if attempt.error in FORMAT_ERRORS:
                self._well_formed = False
            if attempt.call is not None:
                self.calls.append(attempt.call)

    def _call_parts(self, *, finished: bool) -> dict[str, float]:
        """The episode's score parts if it ended now."""
        assert self.task is not None
        parameters = self.offered(self.task.task_id)[2]
        specs = self.task.metadata["call_specs"]
        calls = [(c.name, c.arguments) for c in self.calls]
        if self.string_match == "bfcl":
            parts = bfcl_parts(specs, calls, parameters, self.call_reward)
        else:
            match = match_calls(specs, calls, parameters, self.string_match)
            parts = call_parts(match, self.call_reward)
        return {**parts, "format": 0.3 if finished and self._well_formed else -0.2}

    def demonstration(self, task: Task) -> list[str]:
        """The expected calls in one turn, written this env's way; for `[]`, a sentence."""
        parameters = self.offered(task.task_id)[2]
        calls = [
            ToolCall(
                spec.name,
                bfcl_demonstration(spec, parameters.get(spec.name))["arguments"]
                if self.string_match == "bfcl"
                else spec.demonstration()["arguments"],
            )
            for spec in task.metadata["call_specs"]
        ]
        if not calls:
            text = "None of the functions I can call fits this request."
            return [
                f"Thought: {text}\nFinal Answer: {text}" if self.format.name == "react" else text
            ]
        if self.format.name == "react":
            return [
                "Thought: I will call the functions.\n"
                + "\n".join(map(self.format.render_call, calls))
            ]
        return ["\n".join(self.format.render_call(c) for c in calls)]
