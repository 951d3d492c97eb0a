"""`agentgym/ToolTalk-v0`: ToolTalk's published dialogues replayed, scored by ToolTalk's metrics.

ToolTalk (Farn & Shin, 2023; the `nvidia-tooltalk` wheel) evaluates a tool-using assistant by
replaying dialogues: at each assistant turn of a published dialogue (a prediction point) the
model sees the ground-truth history up to that turn and makes calls, one after another,
each run in the simulated APIs (account, alarm, calendar, email, message, reminder, weather)
and answered, until it replies without a call; the dialogue then goes on with the ground
truth. The conversation's calls are matched against all its ground-truth calls by
ToolTalk's `evaluate_predictions` (`replay.py` says what runs and the one offline change).

An episode is one dialogue; a step is one model turn:

- Opening: the system message of ToolTalk's OpenAI predictor (location, timestamp and
  username from the dialogue's metadata; text formats add the tools' description), then the
  user turns before the first assistant turn. The tools are every ToolTalk API, their
  documents as `to_openai_doc()` writes them (ToolTalk's `api_mode="all"`).
- A turn with calls: each call runs in ToolTalk's executor as one prediction (a call that
  cannot be read is ToolTalk's "Failed to parse API call"), answered in the model's format
  with the result as ToolTalk's predictor shows it (`{"response": ..., "exception": ...}`).
- A turn without calls is the model's reply: the prediction point ends. So does the
  `max_steps_per_turn`-th turn at a point (ToolTalk's loop has no limit). The next
  observation is the point's ground truth (each call as an assistant turn in the model's
  format and its result, then the published reply) and the user turns up to the next
  assistant turn, whose simulated state is ToolTalk's replay of the ground truth.
- After the last assistant turn the episode ends (`terminated`); trailing user turns
  are not shown.

Where ToolTalk's replay shows the next point only the ground-truth history, an episode's
conversation also keeps the model's own calls and reply of earlier points (it is one
growing conversation, appended turn by turn): the ground truth follows them.

Reward parts, from ToolTalk's metrics of the calls so far against every ground-truth call
of the dialogue (as if it ended now; paid as each step's change, so an episode's rewards
sum to its final score): "correctness" = ToolTalk's success (1.0: every ground-truth call
matched and no bad action), "precision", "recall", "bad_action_rate" (an action API call
that succeeded without matching). Default weights 1.0, 0.1, 0.2, -0.2: a failed dialogue
scores at most 0.3, a successful one at least 1.2. The last step's info has
"tooltalk_metrics" (ToolTalk's whole dict) and "correct".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from agentgym.env.core import Feedback, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ToolEnv
from agentgym.envs.tooltalk import replay
from agentgym.envs.tooltalk.data import (
    TEST_EVERY,
    Dialogue,
    check_categories,
    load_dialogues,
    split_dialogues,
)
from agentgym.envs.tooltalk.play import PARTS, DialoguePlay
from agentgym.rewards.verifiable import check_weights, combine
from agentgym.tools import ToolErrorKind, ToolResult
from agentgym.tools.native import NativeFormat
from agentgym.types import Message, ToolCall

DEFAULT_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"correctness": 1.0, "precision": 0.1, "recall": 0.2, "bad_action_rate": -0.2}
)
SYSTEM_PROMPT = (  # tooltalk.evaluation.evaluate_openai.OpenAIPredictor.system_prompt
    "You are a helpful assistant. Here is some user data:"
    "\nlocation: {location}"
    "\ntimestamp: {timestamp}"
    "\nusername (if logged in): {username}"
)
_BOXED = "When you know the answer, write it as \\boxed{answer}."
_REPLY = "When you are done, reply to the user without a tool call."


class _Doc:
    """A ToolTalk API document as the text formats list tools (name and schema)."""

    def __init__(self, doc: Mapping[str, Any]):
        self.name = str(doc["name"])
        self._doc = dict(doc)

    def schema(self) -> dict[str, Any]:
        return {"type": "function", "function": dict(self._doc)}


class ToolTalkEnv(ToolEnv):
    """ToolTalk's published dialogues replayed with its simulated APIs and scored by its metrics.

    Args:
        categories: ToolTalk's datasets to play, "easy" (28 dialogues) and "tooltalk" (50);
            None: both, in that order.
        benchmark: True: the test split is every dialogue of the categories in published
            order, and there is no train split (resetting on it is refused). False: every
            4th dialogue of each category (published order) is held out as test.
        semantic_match: "normalized" (offline: ToolTalk's DistilBERT comparisons of free
            text replaced by equality after normalisation) or "distilbert" (ToolTalk's own,
            which loads distilbert-base-uncased from the Hugging Face hub or its cache).
        tool_format, tool_parser: As `ToolEnv` ("auto": native where the chat template
            renders tools).
        max_steps_per_turn: Model turns at one prediction point after which the env ends
            the point itself.
        reward_weights: Weights of "correctness", "precision", "recall",
            "bad_action_rate"; default `DEFAULT_WEIGHTS`.
        render_mode: None or "ansi".
    """

    default_system_prompt = SYSTEM_PROMPT

    def __init__(
        self,
        categories: Sequence[str] | None = None,
        benchmark: bool = False,
        semantic_match: replay.SemanticMatch = "normalized",
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        max_steps_per_turn: int = 10,
        reward_weights: Mapping[str, float] | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(tool_format=tool_format, tool_parser=tool_parser, render_mode=render_mode)
        if semantic_match not in replay.SEMANTIC_MATCHES:
            valid = ", ".join(replay.SEMANTIC_MATCHES)
            raise ValueError(f"semantic_match={semantic_match!r}; valid: {valid}")
        if not isinstance(benchmark, bool):
            raise ValueError(f"benchmark={benchmark!r}; valid: True or False")
        if (
            isinstance(max_steps_per_turn, bool)
            or not isinstance(max_steps_per_turn, int)
            or max_steps_per_turn < 1
        ):
            raise ValueError(f"max_steps_per_turn={max_steps_per_turn!r}; valid: an int >= 1")
        self.categories = check_categories(categories)
        self.benchmark = benchmark
        self.semantic_match: replay.SemanticMatch = semantic_match
        self.max_steps_per_turn = max_steps_per_turn
        self.part_weights = check_weights(reward_weights, PARTS, DEFAULT_WEIGHTS)
        self.splits = split_dialogues(load_dialogues(self.categories), benchmark=benchmark)
        self.dialogues = {d.name: d for split in self.splits.values() for d in split}
        self.split_of = {d.name: s for s, ds in self.splits.items() for d in ds}
        rule = (
            "benchmark: test = every dialogue of the categories in published order; no train"
            if benchmark
            else f"every {TEST_EVERY}th dialogue of each category in published order "
            f"(positions {TEST_EVERY - 1}, {2 * TEST_EVERY - 1}, ...) is test, the rest train"
        )
        self.scoring: dict[str, Any] = replay.scoring(self.categories, semantic_match, rule)
        self.executor = replay.Executor()
        self.docs = [_Doc(doc) for doc in replay.openai_docs()]
        self.play: DialoguePlay | None = None

    # -- tasks -----------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        if split == "train" and self.benchmark:
            raise ValueError(
                "agentgym/ToolTalk-v0 with benchmark=True has no train split: every dialogue "
                "is in 'test' (reset with options={'split': 'test'}), or use benchmark=False"
            )
        return len(self.splits[split])

    def task_id(self, split: Split, index: int) -> str:
        tasks = self.splits[split]
        if not 0 <= index < len(tasks):
            raise IndexError(f"task index {index} out of range 0..{len(tasks) - 1} ({split})")
        return tasks[index].name

    def load_task(self, task_id: str) -> Task:
        dialogue = self.dialogues.get(task_id)
        if dialogue is None:
            raise KeyError(
                f"no ToolTalk dialogue {task_id!r} in categories {list(self.categories)} "
                f"(ids are the dialogues' names, such as {next(iter(self.dialogues))!r})"
            )
        data = dialogue.data
        return Task(
            task_id,
            prompt=str(dialogue.turns[0]["text"]),
            metadata={
                "category": dialogue.category,
                "split": self.split_of[task_id],
                "suites_used": list(data.get("suites_used", [])),
                "apis_used": list(data.get("apis_used", [])),
                "prediction_points": len(dialogue.points),
                "ground_truth_calls": sum(len(t.get("apis", [])) for t in dialogue.turns),
            },
        )

    def tools(self) -> list[dict[str, Any]]:
        return [doc.schema() for doc in self.docs]

    # -- messages --------------------------------------------------------------

    def system_text(self, task: Task, *, with_tools: bool = True) -> str:
        """ToolTalk's system prompt for the task's dialogue, then (text formats) the tools."""
        metadata = self.dialogues[task.task_id].data["metadata"]
        text = SYSTEM_PROMPT.format(
            location=metadata["location"],
            timestamp=metadata["timestamp"],
            username=metadata.get("username"),
        )
        if not with_tools or isinstance(self.format, NativeFormat):
            return text
        return text + "\n\n" + self.format.instructions(self.docs).replace(_BOXED, _REPLY)

    def initial_messages(self, task: Task) -> list[Message]:
        dialogue = self.dialogues[task.task_id]
        end = dialogue.points[0] if dialogue.points else len(dialogue.turns)
        users = [Message("user", str(t["text"])) for t in dialogue.turns[:end]]
        return [Message("system", self.system_text(task)), *users]

    def agent_opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.task is None or not messages or messages[0]["role"] != "system":
            return messages
        return [
            {"role": "system", "content": self.system_text(self.task, with_tools=False)},
            *messages[1:],
        ]

    def call_text(self, api: Mapping[str, Any], *, for_model: bool = False) -> str:
        """A ground-truth call written in the env's format; `for_model` leaves out the
        session token that ToolTalk's executor adds itself (demonstrations)."""
        request = api["request"]
        arguments = dict(request["parameters"])
        if for_model and replay.requires_auth(request["api_name"]):
            arguments.pop("session_token", None)
        return self.format.render_call(ToolCall(request["api_name"], arguments))

    def continuation(self, dialogue: Dialogue, index: int) -> list[Message]:
        """The ground truth of assistant turn `index` and the user turns after it, up to the
        next assistant turn."""
        turn = dialogue.turns[index]
        messages: list[Message] = []
        for api in turn.get("apis", []):
            messages.append(Message("assistant", self.call_text(api)))
            result = ToolResult(api["request"]["api_name"], replay.result_text(api), None)
            messages.extend(self.format.observation([result]))
        messages.append(Message("assistant", str(turn["text"])))
        for later in dialogue.turns[index + 1 :]:
            if later["role"] == "assistant":
                break
            messages.append(Message("user", str(later["text"])))
        return messages

    def demonstration(self, task: Task) -> list[str]:
        """The ground truth as the model's turns: each call alone, then the reply."""
        turns: list[str] = []
        dialogue = self.dialogues[task.task_id]
        for index in dialogue.points:
            turn = dialogue.turns[index]
            turns.extend(self.call_text(api, for_model=True) for api in turn.get("apis", []))
            turns.append(str(turn["text"]))
        return turns

    # -- the episode -----------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None  # reset loaded it
        dialogue = self.dialogues[self.task.task_id]
        self.play = DialoguePlay(dialogue, self.executor, self.semantic_match)
        self._paid: Mapping[str, float] = dict.fromkeys(PARTS, 0.0)
        info["category"] = dialogue.category
        return obs, info

    def respond(self, action: str) -> Feedback:
        """Runs the turn's calls as ToolTalk predictions, or ends the prediction point."""
        play = self.play
        assert play is not None and not play.done  # step() checked that an episode runs
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        results, errors = [], dict[str, int]()
        for attempt in parsed.calls:
            call = attempt.call
            record = play.call(call.name, call.arguments) if call else play.call(None, None)
            kind = attempt.error or (
                ToolErrorKind.UNKNOWN_TOOL if call and call.name not in self.executor.apis else None
            )
            if kind is not None:
                errors[str(kind)] = errors.get(str(kind), 0) + 1
            name = call.name if call else ""
            results.append(ToolResult(name, replay.result_text(record), kind))
        messages = list(self.format.observation(results))
        play.steps += 1
        point = play.turn_index
        if not parsed.calls or play.steps >= self.max_steps_per_turn:
            play.close(None if parsed.calls else str(action))
            if not play.done:
                messages.extend(self.continuation(play.dialogue, point))
        info: dict[str, Any] = {
            "tool_calls": len(parsed.calls),
            "tool_errors": errors,
            "prediction_point": point,
        }
        parts = play.parts()
        if play.done:
            info.update(correct=parts["correctness"] == 1.0, tooltalk_metrics=dict(play.metrics))
        delta = {k: parts[k] - self._paid[k] for k in PARTS}
        self._paid = parts
        info["episode_parts"] = dict(parts)
        reward = combine(delta, self.part_weights)
        return Feedback(tuple(messages), reward, delta, terminated=play.done, info=info)
