"""`ToolEnv`: the base class of multi-turn tool-use environments.

A subclass supplies tasks (the `AgentEnv` hooks `num_tasks`, `task_id`,
`load_task`) and tools (`make_tools`), and may say which calls a task expects
(`expected_calls`) and how answers are judged (`is_correct`). `ToolEnv` does
the rest: it describes the tools in the system prompt in the chosen format
(Hermes or ReAct), parses each assistant turn, runs its calls through a
`ToolBox`, answers with the results, and scores the episode.

An episode: every turn with at least one tool call gets the calls' results and
continues; a turn without calls ends the episode (`terminated`), scored on its
final answer if it gives one in the format's way, else with no answer, as in
OpenAI-style agent loops. Running out of turns ends it with `truncated`.

The score is `combine(parts, reward_weights)` over three parts:

- "correctness": 1.0 if the final answer is correct, else 0.0.
- "tool": the seed tutorial's `tool_call_reward`, generalised to several
  expected calls: per expected call, 0.5 if some call used its tool and 0.5
  more if such a call had matching arguments, averaged over the expected calls
  (so in [0, 1]); -1.0 if the episode made no tool call at all.
- "format": the tutorial's `format_reward` values: 0.3 if every turn was well
  formed (no call that failed to parse: invalid JSON, cut off, no name,
  arguments not an object) and the episode ended with a final answer written
  the format's way; else -0.2.

Rewards are paid as the episode goes: each step's reward (and each of its
`reward_parts`) is the change in the episode's score, the score of an
unfinished episode being that of one ending now without an answer. So the
rewards of any prefix of an episode sum to the prefix's score, whoever cuts it:
the env itself, Gymnasium's `TimeLimit`, or a rollout's token budget. A cut
episode keeps its tool and format parts instead of scoring 0 (which would pay
an agent to ramble past the limit rather than answer). `info["episode_parts"]`
holds the running score's parts.

Correctness stays dominant (the tutorial's advice against reward hacking):
with the default weights {"correctness": 1.0, "tool": 0.5, "format": 0.1} a
wrong answer with perfect calls and format scores at most 0.5 + 0.03 = 0.53,
while a correct answer after at least one tool call scores at least
1.0 + 0.0 - 0.02 = 0.98. A correct answer without any tool call scores 0.48
to 0.53, no more than that wrong one: on tasks that need tools it is a guess.
Custom weights keep the guarantee when `w_correctness > w_tool + 0.5 * w_format`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentgym.env.core import AgentEnv, Feedback, Task
from agentgym.env.templates import TemplateFormat, ToolFormatName
from agentgym.rewards.verifiable import answers_equal, check_weights, combine
from agentgym.tools import (
    CallAttempt,
    RunnableTool,
    ToolBox,
    ToolCallFormat,
    ToolErrorKind,
    ToolResult,
    error_counts,
)
from agentgym.tools.mcp import McpServer, mcp_server
from agentgym.tools.native import NativeFormat
from agentgym.types import Message, ToolCall

REWARD_PARTS: tuple[str, ...] = ("correctness", "tool", "format")
DEFAULT_REWARD_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"correctness": 1.0, "tool": 0.5, "format": 0.1}
)
FORMAT_ERRORS: frozenset[ToolErrorKind] = frozenset(
    {
        ToolErrorKind.INVALID_JSON,
        ToolErrorKind.TRUNCATED,
        ToolErrorKind.MISSING_NAME,
        ToolErrorKind.ARGUMENTS_NOT_OBJECT,
    }
)
"""Errors in how a call is written (not in what it asks): they cost the format part."""

_NOT_RUN = frozenset({ToolErrorKind.TOO_MANY_CALLS})
_ZERO_PARTS: Mapping[str, float] = MappingProxyType(dict.fromkeys(REWARD_PARTS, 0.0))


def _normalised(value: Any) -> object:
    """`value` as JSON reads it back: tuples become lists; a value JSON cannot hold (a date,
    a Decimal in a task's expected arguments) becomes its text, as a model would write it."""
    return json.loads(json.dumps(value, default=str))


def arguments_equal(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """Whether two argument objects are equal as JSON (key order and 1 vs 1.0 do not matter)."""
    return _normalised(dict(expected)) == _normalised(dict(actual))


@dataclass(frozen=True)
class ExpectedCall:
    """A call that solving a task takes, for the "tool" reward part.

    `match(expected_arguments, actual_arguments)` judges the arguments (default:
    `arguments_equal`). It sees whatever arguments the model wrote and must
    return False, never raise, for ones that make no sense.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    match: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None

    def matches(self, call: ToolCall) -> bool:
        """Whether `call` is this call: the same tool, with matching arguments."""
        judge = self.match or arguments_equal
        return call.name == self.name and bool(judge(self.arguments, call.arguments))


def tool_reward(expected: Sequence[ExpectedCall], calls: Sequence[ToolCall]) -> float:
    """The "tool" part: -1.0 without calls; else the mean over expected calls of 0.5 + 0.5.

    Per expected call: 0.5 if some call used its tool, plus 0.5 if one of those
    had matching arguments. Order does not matter. With no expected calls, any
    call scores 0.0.
    """
    if not calls:
        return -1.0
    if not expected:
        return 0.0
    score = 0.0
    for want in expected:
        named = [c for c in calls if c.name == want.name]
        score += 0.5 * bool(named) + 0.5 * any(want.matches(c) for c in named)
    return score / len(expected)


class ToolEnv(AgentEnv):
    """Base class of tool-use environments: multi-turn, tools in the model's format.

    Subclasses implement `num_tasks`, `task_id`, `load_task` and `make_tools`,
    and usually `expected_calls`; see the module docstring for the episode and
    its reward. The system message is `system_prompt` (the task instructions)
    followed by the format's instructions: the tools themselves in the text
    formats (so a model whose chat template ignores `tools=` still sees them),
    only how to answer in the native one, whose template renders the tools from
    `info["tools"]` (JSON schemas; `info["tool_format"]` says which format
    the env speaks). Every step's info has "tool_calls" (call attempts this turn),
    "tool_errors" ({kind: count}), "reward_parts" and "episode_parts"; the
    last step's also "correct", "final_answer" and "expected_answer".

    Args:
        tool_format: How calls are written: "native" (the model's own format: its
            chat template lists the tools, a parser for the template's family reads
            the calls; see `agentgym.tools.native`), "hermes" (`<tool_call>` JSON in
            the system prompt), "react" (Thought / Action / Action Input, answer
            after `Final Answer:`), or "auto" (the default): native when the model's
            template renders `tools=`, else hermes. The answer of "native" and
            "hermes" is the last `\\boxed{}`. "auto" and "native" are resolved when
            a tokenizer is bound (`use_chat_template`, which the rollout calls);
            unbound, "auto" is hermes.
        tool_parser: The native parser ("hermes", "llama3_json", "mistral");
            None detects it from the template (its response schema first).
        mcp_servers: MCP servers whose tools join `make_tools()`'s: `McpServer`s or
            specs (`{"command": [...]}` for stdio, `{"url": "http://..."}` for
            streamable HTTP; see `agentgym.tools.mcp.mcp_server`). Each env starts
            its own server process at its first reset, lists the tools then, and
            closes it with the env; a server that crashes or hangs gives an error
            observation and is restarted at the next call, at most `max_restarts`
            times in a row (with backoff), then its calls answer an error.
        max_turns: Turns after which the env ends the episode itself
            (`truncated`); None for no limit of its own. Under `gymnasium.make`
            the registered `max_episode_steps` (TimeLimit) ends it anyway, and
            as rewards are paid per step, no score is lost either way.
        max_result_chars: Tool results are cut to this many characters.
        max_calls_per_turn: Calls beyond this many in one turn are not run.
        reward_weights: Weights of the parts "correctness", "tool", "format";
            parts left out are reported but not paid. Default
            `DEFAULT_REWARD_WEIGHTS`.
        system_prompt: The task instructions; None for `default_system_prompt`.
        render_mode: None or "ansi".
    """

    default_system_prompt = (
        "Solve the user's task. Use the tools whenever they can help: never guess what a "
        "tool would return."
    )

    def __init__(
        self,
        tool_format: ToolFormatName = "auto",
        max_turns: int | None = None,
        max_result_chars: int = 2000,
        max_calls_per_turn: int = 4,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
        tool_parser: str | None = None,
        mcp_servers: Sequence[Mapping[str, Any] | McpServer] = (),
    ):
        super().__init__(system_prompt=system_prompt, render_mode=render_mode)
        self.mcp_servers = [
            server if isinstance(server, McpServer) else mcp_server(server)
            for server in mcp_servers
        ]
        self.templates = TemplateFormat(tool_format, tool_parser)
        self.format: ToolCallFormat = self.templates.unbound()
        if max_turns is not None and (
            isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
        ):
            raise ValueError(f"max_turns={max_turns!r}; valid: None or an int >= 1")
        self.max_turns = max_turns
        self.reward_weights = check_weights(reward_weights, REWARD_PARTS, DEFAULT_REWARD_WEIGHTS)
        self._box_options = {
            "max_result_chars": max_result_chars,
            "max_calls_per_turn": max_calls_per_turn,
        }
        for name, value in self._box_options.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; valid: an int >= 1")
        self._begin_episode()

    # -- hooks for subclasses ------------------------------------------------

    def make_tools(self) -> Sequence[RunnableTool]:
        """The tools the agent may call; called once per env, on first use."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_tools()")

    def expected_calls(self, task: Task) -> Sequence[ExpectedCall]:
        """The calls that solve `task`; default: `task.metadata["expected_calls"]`, or none."""
        return tuple(task.metadata.get("expected_calls", ()))

    def is_correct(self, task: Task, answer: str) -> bool:
        """Whether `answer` solves `task`; default: math-verify equivalence to `task.answer`."""
        return answers_equal(answer, str(task.answer))

    def agent_opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The opening without the text format's description of the tools: the endpoint
        writes it from the request's `tools=` at the end of the system message, as here."""
        if isinstance(self.format, NativeFormat) or not messages or messages[0]["role"] != "system":
            return messages
        rest = messages[1:]
        return (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        ) + rest

    def turn_text(self, message: Mapping[str, Any]) -> str:
        """An OpenAI assistant message as this env reads an action: its content, then each
        of its `tool_calls` written in the env's format (arguments that are not a JSON
        object are written as text, which the format reads as a malformed call)."""
        parts = [super().turn_text(message)]
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            raw = function.get("arguments", "{}")
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                arguments = None
            name = str(function.get("name", ""))
            if isinstance(arguments, Mapping):
                parts.append(self.format.render_call(ToolCall(name, dict(arguments))))
            else:
                parts.append(f"{name}({raw})")
        return "\n".join(p for p in parts if p)

    def use_chat_template(self, tokenizer: Any) -> None:
        """Resolves "auto" and "native" against `tokenizer`'s chat template (the rollout
        calls this before each reset); ValueError if native cannot be used with it."""
        chosen = self.templates.resolve(tokenizer)
        if chosen is not self.format:
            self.format = chosen
            self.__dict__.pop("system_message", None)  # rebuilt in the new format

    # -- the tools -------------------------------------------------------------

    @functools.cached_property
    def toolbox(self) -> ToolBox:
        """The env's tools, built from `make_tools()` on first use."""
        served = [t for server in self.mcp_servers for t in server.tools()]
        return ToolBox([*self.make_tools(), *served], **self._box_options)

    @functools.cached_property
    def _schemas(self) -> tuple[dict[str, Any], ...]:
        return tuple(self.toolbox.schemas())

    def tools(self) -> list[dict[str, Any]]:
        """JSON schemas of the tools (a fresh copy), as `info["tools"]` carries them."""
        schemas: list[dict[str, Any]] = json.loads(json.dumps(self._schemas))
        return schemas

    @functools.cached_property
    def system_message(self) -> str:
        """The task instructions followed by the format's description of the tools."""
        instructions = self.format.instructions(list(self.toolbox.tools.values()))
        return "\n\n".join(p for p in (self.system_prompt, instructions) if p)

    def initial_messages(self, task: Task) -> list[Message]:
        return [Message("system", self.system_message), Message("user", task.prompt)]

    # -- the episode -----------------------------------------------------------

    def _begin_episode(self) -> None:
        self.turns = 0
        self.calls: list[ToolCall] = []
        self._well_formed = True
        self._score: Mapping[str, float] = _ZERO_PARTS

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self._begin_episode()
        obs, info = super().reset(seed=seed, options=options)
        info["tool_format"] = self.format.name  # "native": render with tools=info["tools"]
        return obs, info

    def respond(self, action: str) -> Feedback:
        """Runs the turn's calls, or scores its final answer; pays the change in score."""
        assert self.task is not None  # step() checked it
        self.turns += 1
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        results = self.toolbox.run(parsed.calls) if parsed.calls else []
        self._record(parsed.calls, results)
        info: dict[str, Any] = {
            "tool_calls": len(parsed.calls),
            "tool_errors": error_counts(results),
        }
        ended = not parsed.calls
        answer = parsed.final_answer if ended else None
        parts = self._parts(answer, finished=ended and answer is not None)
        if ended or self._out_of_turns():
            info.update(
                correct=parts["correctness"] == 1.0,
                final_answer=answer,
                expected_answer=self.task.answer,
            )
        return self._pay(parts, tuple(self.format.observation(results)), ended, info)

    def close(self) -> None:
        for server in self.mcp_servers:
            server.close()
        super().close()

    def step(self, action: str) -> tuple[list[dict[str, str]], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if not terminated and self._out_of_turns():
            self._done = truncated = True
        return obs, reward, terminated, truncated, info

    def _out_of_turns(self) -> bool:
        return self.max_turns is not None and self.turns >= self.max_turns

    def _record(self, attempts: Sequence[CallAttempt], results: Sequence[ToolResult]) -> None:
        """Adds the turn's calls that were run (well-typed or not) and notes format errors."""
        for attempt, result in zip(attempts, results, strict=True):
            if attempt.error in FORMAT_ERRORS:
                self._well_formed = False
            if attempt.call is not None and result.error not in _NOT_RUN:
                self.calls.append(attempt.call)

    def _parts(self, answer: str | None, *, finished: bool) -> dict[str, float]:
        """The episode's score parts if it ended now with `answer`."""
        assert self.task is not None  # only `respond` asks, within a step
        correct = answer is not None and self.is_correct(self.task, answer)
        return {
            "correctness": 1.0 if correct else 0.0,
            "tool": tool_reward(self.expected_calls(self.task), self.calls),
            "format": 0.3 if finished and self._well_formed else -0.2,
        }

    def _pay(
        self,
        parts: Mapping[str, float],
        messages: tuple[Message, ...],
        terminated: bool,
        info: dict[str, Any],
    ) -> Feedback:
        """Feedback paying the change from the previous score to `parts`."""
        delta = {k: parts[k] - self._score[k] for k in REWARD_PARTS}
        reward = combine(delta, self.reward_weights)
        self._score = MappingProxyType(dict(parts))
        info["episode_parts"] = dict(parts)
        return Feedback(messages, reward, delta, terminated=terminated, info=info)
