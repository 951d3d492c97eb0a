"""`agentgym/BFCLMultiTurn-v0`: BFCL v4's multi-turn categories played as episodes, scored by
BFCL's own multi-turn checker (the `bfcl-eval` wheel, extra `bfcl`).

An episode is one published entry (`multi_turn_base_12`). The opening is the system message
and the entry's first user turn; the tools are the function docs of the entry's API classes
(`data` says how they are built). Each assistant message with calls is one of BFCL's
"steps": its calls run, in order, on the episode's instances of the API classes, through
BFCL's executor (`execute`), and their results come back as tool messages. A message without
calls ends the user turn: the next user turn is the observation, or, after the last one, the
episode ends and BFCL's checker decides `correctness`. As in BFCL's inference loop, a user
turn that reaches `max_steps_per_turn` + 1 steps with calls (BFCL's `MAXIMUM_STEP_LIMIT`,
20) is force-quit: the episode ends there, and fails unless it was the last turn.

`multi_turn_miss_func`: at the turn an entry names in `missed_function`, the withheld
functions join the tools; the model is told so by that turn's user message: their schemas
(JSON, as the first ones were given) and BFCL's sentence "I have updated some more functions
you can choose from. What about now?" (BFCL's prompting mode; its function-calling mode
re-sends `tools=` instead, which a conversation whose prefix is fixed cannot do). Before that
turn a call to one of them is an unknown tool.

The reward is `combine(parts, reward_weights)` over ToolEnv's three parts (default weights
`{"correctness": 1.0, "tool": 0.5, "format": 0.1}`), paid as the episode goes:
"correctness" 1/0 as BFCL's checker decides at the end (end state and results per turn
against the ground truth executed on fresh instances); "tool", ToolEnv's `tool_reward` of
the episode's calls against the ground truth's (a training signal; BFCL has none); "format"
0.3 when every call parsed and the episode played all its turns, else -0.2.

Splits: `benchmark=True` makes every entry of the chosen categories a test task, in
published order, and refuses the train split. For training (`benchmark=False`), an entry
that involves one of `held_out_classes` is a test task and any other a train task, so train
tasks use only the other classes' tools and every test task needs at least one API class
never trained on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.env.core import Feedback, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ExpectedCall, ToolEnv, tool_reward
from agentgym.envs.bfcl_multi import data
from agentgym.envs.bfcl_multi.execute import (
    Session,
    argument_problem,
    call_string,
    ground_truth_calls,
    verdict,
)
from agentgym.tools import RunnableTool, ToolBox, error_counts
from agentgym.tools.native import NativeFormat
from agentgym.tools.toolbox import CallOutcome, run_with_limit
from agentgym.types import Message

BOXES_CACHED = 512
EXECUTION_ERROR = "Error during execution"


@dataclass(frozen=True)
class BfclFunction:
    """One BFCL function as a ToolBox tool: its schema as BFCL gives it to function-calling
    models; a checked call is written as BFCL writes it and run by `run` (the episode's)."""

    doc: Mapping[str, Any]
    run: Callable[[str], str]  # runs one call string in the current episode
    timeout_s: float | None = None

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    @functools.cached_property
    def _schema(self) -> str:
        return json.dumps(data.openai_tool(self.doc))

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = json.loads(self._schema)
        return schema

    def check_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any] | str:
        """Any JSON arguments, as BFCL runs whatever the model wrote; only names that cannot
        be keyword arguments are refused."""
        return argument_problem(arguments) or dict(arguments)

    def invoke(self, arguments: dict[str, Any], timeout_s: float | None) -> CallOutcome:
        text = call_string(self.name, arguments)
        return run_with_limit(lambda: self.run(text), timeout_s, self.name)


class BFCLMultiTurnEnv(ToolEnv):
    """BFCL v4 multi-turn entries as episodes, scored by BFCL's checker (see the module).

    Args:
        categories: BFCL multi-turn categories (`multi_turn_base`, `multi_turn_miss_func`,
            `multi_turn_miss_param`, `multi_turn_long_context`); None for all four.
        benchmark: True: every entry is a test task, in published order, and there is no
            train split. False: splits disjoint by API class (`held_out_classes`).
        held_out_classes: The API classes whose entries are test tasks when training.
        max_steps_per_turn: Steps with calls per user turn before BFCL's force quit.
        max_calls_per_turn: Calls per assistant message that are run (the rest are not).
        max_result_chars: Tool results are cut to this many characters (the longest
            ground-truth result, in `multi_turn_long_context`, has 31,706).
        tool_timeout_s: The time limit of one call.
        tool_format, tool_parser, max_turns, reward_weights, system_prompt, render_mode:
            as for `ToolEnv` (the default system prompt is BFCL's multi-turn instruction).
    """

    session: Session | None = None  # the episode's instances, from reset() on

    def __init__(
        self,
        categories: Sequence[str] | None = None,
        benchmark: bool = False,
        held_out_classes: Sequence[str] = data.DEFAULT_HELD_OUT,
        max_steps_per_turn: int | None = None,
        max_calls_per_turn: int = 16,
        max_result_chars: int = 40_000,
        tool_timeout_s: float = 5.0,
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        max_turns: int | None = None,
        reward_weights: Mapping[str, float] | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        prompts = data.bfcl("constants.default_prompts")
        self.categories = data.check_categories(categories)
        self.benchmark = bool(benchmark)
        self.held_out = None if self.benchmark else data.check_held_out(held_out_classes)
        self.splits = data.make_splits(self.categories, self.held_out)
        self.train_ids = frozenset(self.splits.train)
        limit = prompts.MAXIMUM_STEP_LIMIT if max_steps_per_turn is None else max_steps_per_turn
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_steps_per_turn={limit!r}; valid: None or an int >= 1")
        if not tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s={tool_timeout_s!r}; valid: a number > 0")
        self.max_steps_per_turn = limit
        self.tool_timeout_s = float(tool_timeout_s)
        self.added_prompt = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING
        behaviour = prompts.PROMPT_STYLE_TEMPLATES["classic"]["multiturn_behavior"]
        super().__init__(
            tool_format=tool_format,
            tool_parser=tool_parser,
            max_turns=max_turns,
            max_result_chars=max_result_chars,
            max_calls_per_turn=max_calls_per_turn,
            reward_weights=reward_weights,
            system_prompt=behaviour if system_prompt is None else system_prompt,
            render_mode=render_mode,
        )
        self.boxes = functools.lru_cache(maxsize=BOXES_CACHED)(self._box)

    @property
    def scoring(self) -> dict[str, Any]:
        """The exact scoring configuration, JSON-able, for reports."""
        return {
            "benchmark": "bfcl_multi_turn",
            "package": "bfcl-eval",
            "version": importlib.metadata.version("bfcl-eval"),
            "checker": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker."
            "multi_turn_checker",
            "executor": "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils."
            "execute_multi_turn_func_call",
            "categories": list(self.categories),
            "split": "published order, all test"
            if self.held_out is None
            else f"by API class, held out: {', '.join(self.held_out)}",
            "max_steps_per_turn": self.max_steps_per_turn,
            "max_turns": self.max_turns,
            "max_calls_per_turn": self._box_options["max_calls_per_turn"],
            "max_result_chars": self._box_options["max_result_chars"],
            "tool_timeout_s": self.tool_timeout_s,
            "missed_function_prompt": "schemas as JSON + " + repr(self.added_prompt),
        }

    # -- tasks -----------------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        return len(self.splits.train if split == "train" else self.splits.test)

    def task_id(self, split: Split, index: int) -> str:
        ids = self.splits.train if split == "train" else self.splits.test
        if not 0 <= index < len(ids):
            raise IndexError(f"task index {index} out of range 0..{len(ids) - 1} of {split!r}")
        return ids[index]

    def entry(self, task_id: str) -> data.BfclEntry:
        """The published entry of a task id; KeyError naming it and what is valid."""
        try:
            return self.splits.entries[task_id]
        except KeyError:
            raise KeyError(
                f"unknown task id {task_id!r}; valid: the ids of BFCL's "
                f"{', '.join(self.categories)} entries, e.g. {self.categories[0]}_0"
            ) from None

    def load_task(self, task_id: str) -> Task:
        entry = self.entry(task_id)
        split = "train" if task_id in self.train_ids else "test"
        first = entry.turns[0]
        return Task(
            task_id=task_id,
            prompt="\n".join(m["content"] for m in first),
            metadata={
                "category": entry.category,
                "split": split,
                "involved_classes": list(entry.classes),
                "user_turns": len(entry.turns),
            },
        )

    # -- tools -----------------------------------------------------------------------

    def _box(self, task_id: str, stage: int) -> ToolBox:
        """The tools offered in an entry once `stage` of its missed-function turns came."""
        entry = self.entry(task_id)
        docs = list(entry.functions)
        for turn in sorted(entry.missed)[:stage]:
            docs.extend(entry.missed[turn])
        tools: list[RunnableTool] = [BfclFunction(doc, self._execute) for doc in docs]
        return ToolBox(
            tools,
            max_argument_chars=20_000,
            default_timeout_s=self.tool_timeout_s,
            **self._box_options,
        )

    def _stage(self) -> int:
        assert self.task is not None
        return sum(1 for turn in self.entry(self.task.task_id).missed if turn <= self.turn)

    @property
    def toolbox(self) -> ToolBox:
        """The tools the current task offers at its current turn."""
        assert self.task is not None, "reset() first"
        return self.boxes(self.task.task_id, self._stage())

    def tools(self) -> list[dict[str, Any]]:
        return [] if self.task is None else self.toolbox.schemas()

    def make_tools(self) -> list[RunnableTool]:
        return []

    def _execute(self, call: str) -> str:
        """Runs one checked call in the episode's session and notes it for the verdict."""
        assert self.session is not None, "reset() first"
        self.step_calls.append(call)
        return self.session.execute([call])[0]

    # -- the episode -----------------------------------------------------------------

    def _begin_episode(self) -> None:
        super()._begin_episode()
        self.close_session()
        self.turn = 0
        self.steps = 0
        self.record: list[list[tuple[str, ...]]] = [[]]
        self.step_calls: list[str] = []

    def initial_messages(self, task: Task) -> list[Message]:
        entry = self.entry(task.task_id)
        box = self.boxes(task.task_id, 0)
        instructions = (
            ""
            if isinstance(self.format, NativeFormat)
            else self.format.instructions(list(box.tools.values()))
        )
        system = "\n\n".join(p for p in (self.system_prompt, instructions) if p)
        opening = [Message("system", system)] if system else []
        return [*opening, *self.user_messages(entry, 0)]

    def user_messages(self, entry: data.BfclEntry, turn: int) -> list[Message]:
        """A user turn's messages; at a missed-function turn, the added functions."""
        if turn in entry.missed:
            schemas = [data.openai_tool(doc)["function"] for doc in entry.missed[turn]]
            return [Message("user", self.added_prompt.format(functions=json.dumps(schemas)))]
        return [Message.from_dict(m) for m in entry.turns[turn]]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        chosen = dict(options or {})
        if self.benchmark and "task_id" not in chosen and chosen.get("split", "train") == "train":
            raise ValueError(
                "BFCLMultiTurn-v0 with benchmark=True has no train split: every published "
                "task is a test task; reset with options={'split': 'test'}, or make the env "
                "with benchmark=False to train (splits by API class)"
            )
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None
        self.session = Session(self.entry(self.task.task_id))
        info["category"] = self.task.metadata["category"]
        return obs, info

    def respond(self, action: str) -> Feedback:
        """Runs a step's calls, or ends the user turn (and, after the last, the episode)."""
        assert self.task is not None  # step() checked it
        entry = self.entry(self.task.task_id)
        self.turns += 1
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        info: dict[str, Any] = {
            "tool_calls": len(parsed.calls),
            "category": entry.category,
            "user_turn": self.turn,
        }
        if not parsed.calls:
            info["tool_errors"] = {}
            if self.turn + 1 == len(entry.turns):
                return self._finish(entry, (), info, forced=False)
            self.turn, self.steps = self.turn + 1, 0
            self.record.append([])
            opening = tuple(self.user_messages(entry, self.turn))
            return self._go_on(entry, opening, info)
        self.step_calls = []
        results = self.toolbox.run(parsed.calls)
        self._record(parsed.calls, results)
        self.record[self.turn].append(tuple(self.step_calls))
        self.steps += 1
        info["tool_errors"] = error_counts(results)
        info["execution_errors"] = sum(r.content.startswith(EXECUTION_ERROR) for r in results)
        observation = tuple(self.format.observation(results))
        if self.steps > self.max_steps_per_turn:
            return self._finish(entry, observation, info, forced=True)
        return self._go_on(entry, observation, info)

    def _go_on(
        self, entry: data.BfclEntry, messages: tuple[Message, ...], info: dict[str, Any]
    ) -> Feedback:
        """The episode goes on (unless `max_turns` cuts it here: then it is not correct)."""
        if self._out_of_turns():
            info.update(correct=False, final_answer=None, expected_answer=None)
        return self._pay(self._score_now(entry), messages, False, info)

    def _score_now(self, entry: data.BfclEntry, correct: bool = False) -> dict[str, float]:
        """The episode's parts if it were cut now (or, with `correct`, its final ones)."""
        expected = [ExpectedCall(c.name, c.arguments) for t in self.truth(entry) for c in t]
        return {
            "correctness": 1.0 if correct else 0.0,
            "tool": tool_reward(expected, self.calls),
            "format": -0.2,
        }

    def _finish(
        self,
        entry: data.BfclEntry,
        observation: tuple[Message, ...],
        info: dict[str, Any],
        *,
        forced: bool,
    ) -> Feedback:
        """Ends the episode with BFCL's verdict."""
        judged = verdict(entry, self.record)
        parts = self._score_now(entry, correct=judged["valid"])
        parts["format"] = 0.3 if self._well_formed and not forced else -0.2
        info.update(
            correct=judged["valid"],
            bfcl_error_type=judged["error_type"],
            bfcl_error_message=judged["error_message"],
            force_quit=forced,
            final_answer=None,
            expected_answer=None,
        )
        return self._pay(parts, observation, True, info)

    def truth(self, entry: data.BfclEntry) -> tuple[tuple[Any, ...], ...]:
        """The ground truth's calls per turn (ToolCalls), parsed once per entry."""
        return _truth(entry)

    def demonstration(self, task: Task) -> list[str]:
        """The ground truth played: each turn's calls (in messages of at most
        `max_calls_per_turn`), then a message without calls that ends the turn."""
        limit = self._box_options["max_calls_per_turn"]
        turns: list[str] = []
        for calls in self.truth(self.entry(task.task_id)):
            for start in range(0, len(calls), limit):
                chunk = calls[start : start + limit]
                text = "\n".join(self.format.render_call(c) for c in chunk)
                react = self.format.name == "react"
                turns.append(f"Thought: I will call the functions.\n{text}" if react else text)
            said = "Done." if calls else "I cannot do this with the functions and details I have."
            turns.append(
                f"Thought: {said}\nFinal Answer: {said}" if self.format.name == "react" else said
            )
        return turns

    def close_session(self) -> None:
        """Drops the episode's instances (BFCL's executor keeps them until then)."""
        if self.session is not None:
            self.session.close()
        self.session = None

    def close(self) -> None:
        self.close_session()
        super().close()


@functools.lru_cache(maxsize=4096)
def _truth(entry: data.BfclEntry) -> tuple[tuple[Any, ...], ...]:
    return ground_truth_calls(entry)
