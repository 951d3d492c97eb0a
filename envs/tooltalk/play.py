"""One ToolTalk dialogue played as `ToolExecutor.run_conversation` plays it, a call at a time.

`run_conversation` walks the dialogue's turns; at each assistant turn (a prediction point)
it resets the simulated APIs (`init_conversation_state`: databases as shipped, the user's
session token and verification code set, every ground-truth call of the earlier assistant
turns replayed), then asks the model for a call, runs it, shows it the result, and asks
again until the model replies with text; those predictions are stored on the turn
(`turn["predictions"]`), and the history goes on with the turn's ground truth (its calls,
their results and its text). `DialoguePlay` keeps the same state and records, fed by the
env one parsed call at a time, so that ToolTalk's `evaluate_predictions` scores them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from agentgym.envs.tooltalk.data import Dialogue
from agentgym.envs.tooltalk.replay import Executor, SemanticMatch, evaluate

PARTS: tuple[str, ...] = ("correctness", "precision", "recall", "bad_action_rate")


class DialoguePlay:
    """The replay of one dialogue: which prediction point is open, and the predictions.

    Args:
        dialogue: The published dialogue.
        executor: The env's ToolTalk executor (its state is this play's from now on).
        semantic_match: How ToolTalk's free-text comparisons run (`replay.semantic_mode`).
    """

    def __init__(self, dialogue: Dialogue, executor: Executor, semantic_match: SemanticMatch):
        self.dialogue = dialogue
        self.executor = executor
        self.semantic_match = semantic_match
        self.predictions: dict[int, list[dict[str, Any]]] = {}  # turn index -> its records
        self.point = 0  # index into dialogue.points of the open prediction point
        self.steps = 0  # model turns taken at the open point
        self.metrics: dict[str, Any] = {}
        if not self.done:
            self._enter()

    @property
    def done(self) -> bool:
        """Whether every prediction point has been played."""
        return self.point >= len(self.dialogue.points)

    @property
    def turn_index(self) -> int:
        """The index in the conversation of the open prediction point's assistant turn."""
        return self.dialogue.points[self.point]

    def _enter(self) -> None:
        """Opens the current point: ToolTalk's state reset and ground-truth replay."""
        history = [  # execute_tool writes the session token into a request's parameters
            {"request": copy.deepcopy(api["request"])}
            for turn in self.dialogue.turns[: self.turn_index]
            if turn["role"] == "assistant"
            for api in turn.get("apis", [])
        ]
        data = self.dialogue.data
        user = copy.deepcopy(dict(data.get("user") or {}))
        self.executor.init_conversation_state(dict(data["metadata"]), history, user)
        self.predictions[self.turn_index] = []

    def _predictions(self) -> list[dict[str, Any]]:
        return self.predictions[self.turn_index]

    def conversation(self) -> dict[str, Any]:
        """The dialogue as `run_conversation` leaves it so far (the turns' roles, ground-truth
        calls and predictions), in fresh dicts for `evaluate_predictions` to annotate (it
        sets keys on the call and prediction dicts only)."""
        turns = [
            {
                "role": turn["role"],
                "apis": [dict(api) for api in turn.get("apis", [])],
                **(
                    {"predictions": [dict(p) for p in self.predictions[i]]}
                    if i in self.predictions
                    else {}
                ),
            }
            for i, turn in enumerate(self.dialogue.turns)
        ]
        return {"conversation": turns}

    def call(self, name: str | None, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Runs one predicted call at the open point; its prediction record."""
        record = self.executor.predict(name, arguments)
        self._predictions().append(record)
        return record

    def close(self, reply: str | None) -> None:
        """Ends the open point (`reply`: the model's text, None where the env cut it off)
        and opens the next one, if any."""
        if reply is not None:
            self._predictions().append({"role": "assistant", "text": reply})
        self.point += 1
        self.steps = 0
        if not self.done:
            self._enter()

    def parts(self) -> dict[str, float]:
        """ToolTalk's metrics of the predictions so far against all the dialogue's ground
        truth (as if the dialogue ended now); `metrics` keeps ToolTalk's whole dict."""
        self.executor.compare_errors = 0
        self.metrics = evaluate(self.executor, self.conversation(), self.semantic_match)
        self.metrics["compare_errors"] = self.executor.compare_errors
        return {
            "correctness": float(bool(self.metrics["success"])),
            "precision": float(self.metrics["precision"]),
            "recall": float(self.metrics["recall"]),
            "bad_action_rate": float(self.metrics["bad_action_rate"]),
        }

    def ground_truth(self, turn_index: int) -> list[Mapping[str, Any]]:
        """The ground-truth calls of the conversation's turn `turn_index`."""
        apis: list[Mapping[str, Any]] = self.dialogue.turns[turn_index].get("apis", [])
        return apis
