"""One τ² conversation: the domain's environment in the task's initial state, the messages
in τ²'s own types (`tau2.data_model.message`), and τ²'s evaluator over them at the end.

The trajectory is what τ²'s orchestrator would record: its greeting
(`DEFAULT_FIRST_AGENT_MESSAGE`, or the task's message history where it has one), the
scripted user's messages, each agent turn with tool calls as one `AssistantMessage` with
those calls (its text, which τ² routes to the environment and no user reads, is not kept:
it could hold a call's arguments and pass the communicate check) followed by one
`ToolMessage` per call, each agent turn without calls as an `AssistantMessage` with its text.
Calls run through the environment's own `get_response`, errors included, so replaying the
trajectory (as the evaluator does) gives the same results.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.tau2.package import Domain, tau2_module
from agentgym.envs.tau2.user import STOP, TRANSFER_TOOL, ScriptedUser
from agentgym.tools import CallAttempt, ToolErrorKind, ToolResult

GREETING = "Hi! How can I help you today?"  # tau2.orchestrator's DEFAULT_FIRST_AGENT_MESSAGE
PARTS: tuple[str, ...] = (
    "correctness",
    "tau2_reward",
    "db",
    "env_assertion",
    "action",
    "communicate",
)
ZERO_PARTS: Mapping[str, float] = dict.fromkeys(PARTS, 0.0)
SCORED_ENDS = ("agent_stop", "user_stop")  # what evaluate_simulation scores; others get 0


def messages() -> Any:
    """`tau2.data_model.message`: τ²'s message types."""
    return tau2_module("data_model.message")


def max_errors() -> int:
    """Call errors after which τ²'s orchestrator stops an episode (`DEFAULT_MAX_ERRORS`)."""
    return int(tau2_module("config").DEFAULT_MAX_ERRORS)


class Episode:
    """A conversation on `task` (a τ² `Task`) of `domain`; `termination` is None until it
    ends, then a `tau2.data_model.simulation.TerminationReason` value."""

    def __init__(self, domain: Domain, task: Any, user: ScriptedUser):
        self.domain, self.task, self.user = domain, task, user
        m = messages()
        state = task.initial_state
        history = list(state.message_history or []) if state is not None else []
        self.trajectory: list[Any] = [msg.model_copy(deep=True) for msg in history] or [
            m.AssistantMessage(role="assistant", content=GREETING, cost=0.0)
        ]
        self.trajectory.append(m.UserMessage(role="user", content=user.opening(task)))
        self.calls = self.errors = self.replies = 0
        self.transferred = False
        self.termination: str | None = None

    @functools.cached_property
    def environment(self) -> Any:
        """The domain's environment in the task's initial state, built at the first call (an
        episode of talk alone never needs it: the evaluator builds its own)."""
        state = self.task.initial_state
        environment = self.domain.environment()
        environment.set_state(
            initialization_data=state.initialization_data if state is not None else None,
            initialization_actions=state.initialization_actions if state is not None else None,
            message_history=(state.message_history or []) if state is not None else [],
        )
        return environment

    def run_calls(self, attempts: Sequence[CallAttempt]) -> list[ToolResult]:
        """Runs a turn's calls in the environment; one result per attempt, in order."""
        m = messages()
        calls, results = [], []
        for attempt in attempts:
            if attempt.call is None:
                self.errors += 1
                kind = attempt.error or ToolErrorKind.INVALID_JSON
                results.append(ToolResult("", f"Error: {attempt.message or kind}", kind))
                continue
            self.calls += 1
            call = m.ToolCall(
                id=f"call_{self.calls}",
                name=attempt.call.name,
                arguments=dict(attempt.call.arguments),
                requestor="assistant",
            )
            response = self.environment.get_response(call)
            calls.append((call, response))
            results.append(self._result(call, response))
        if calls:
            tool_calls = [call for call, _ in calls]
            self.trajectory.append(m.AssistantMessage(role="assistant", tool_calls=tool_calls))
            self.trajectory.extend(response for _, response in calls)
        if self.errors >= max_errors():
            self.termination = "too_many_errors"
        return results

    def _result(self, call: Any, response: Any) -> ToolResult:
        """What the agent is told of a call that ran (τ²'s `ToolMessage`); counts errors and
        notes a transfer."""
        if not response.error:
            self.transferred = self.transferred or call.name == TRANSFER_TOOL
            return ToolResult(call.name, response.content or "", None)
        self.errors += 1
        known = any(t["function"]["name"] == call.name for t in self.domain.tools)
        kind = ToolErrorKind.TOOL_RAISED if known else ToolErrorKind.UNKNOWN_TOOL
        return ToolResult(call.name, response.content or "", kind)

    def agent_says(self, text: str) -> str | None:
        """Records the agent's message to the user; the user's answer, or None when the
        agent ended the conversation (τ²'s stop token in its text)."""
        m = messages()
        self.trajectory.append(m.AssistantMessage(role="assistant", content=text))
        if STOP in text:
            self.termination = "agent_stop"
            return None
        reply, ends = self.user.reply(self.replies, self.transferred)
        self.replies += 1
        self.trajectory.append(m.UserMessage(role="user", content=reply))
        if ends:
            self.termination = "user_stop"
        return reply


@dataclass(frozen=True)
class Verdict:
    """τ²'s reward for an episode, its components, and what the evaluator noted."""

    reward: float
    parts: Mapping[str, float]
    info: Mapping[str, Any] = field(default_factory=dict)


def evaluate(domain: Domain, task: Any, trajectory: list[Any], termination: str) -> Verdict:
    """τ²'s reward as `tau2.evaluator.evaluator.evaluate_simulation` gives it with
    `EvaluationType.ALL` (τ²'s default), from the same evaluators: an episode that did not
    end by an agent or user stop scores 0; a task without evaluation criteria 1; else the
    product, over the task's reward basis, of the environment evaluator's reward (DB and
    ENV_ASSERTION), the action evaluator's (ACTION) and the communicate evaluator's
    (COMMUNICATE). That function itself cannot be imported here (`package`); the test
    suite checks this one against it.

    An evaluator that raises scores 0, the error in `info["evaluation_error"]`, as τ²'s runner
    scores a sample whose run raised (`skip_failed_samples`): an env assertion on a record
    the agent never created raises (mock's `assert_task_status`)."""
    info: dict[str, Any] = {"termination_reason": termination}
    criteria = task.evaluation_criteria
    if termination not in SCORED_ENDS or criteria is None:
        reward = 0.0 if termination not in SCORED_ENDS else 1.0
        parts = {**ZERO_PARTS, "correctness": reward, "tau2_reward": reward}
        return Verdict(reward, parts, {**info, "reward_basis": None})
    try:
        env_info, action_info, communicate_info = _evaluators(domain, task, trajectory)
    except Exception as err:  # what τ²'s run does with skip_failed_samples: the run scores 0
        failed = {**info, "reward_basis": None, "evaluation_error": f"{type(err).__name__}: {err}"}
        return Verdict(0.0, dict(ZERO_PARTS), failed)
    basis = {b.value for b in criteria.reward_basis}
    reward = 1.0
    if basis & {"DB", "ENV_ASSERTION"}:
        reward *= env_info.reward
    if "ACTION" in basis:
        reward *= action_info.reward
    if "COMMUNICATE" in basis:
        reward *= communicate_info.reward
    assertions = env_info.env_assertions or []
    parts = {
        "correctness": 1.0 if reward == 1.0 else 0.0,
        "tau2_reward": float(reward),
        "db": float(env_info.db_check.db_reward) if env_info.db_check is not None else 1.0,
        "env_assertion": 1.0 if all(a.met for a in assertions) else 0.0,
        "action": float(action_info.reward),
        "communicate": float(communicate_info.reward),
    }
    info["reward_basis"] = sorted(basis)
    return Verdict(float(reward), parts, info)


def _evaluators(domain: Domain, task: Any, trajectory: list[Any]) -> tuple[Any, Any, Any]:
    """The `RewardInfo`s of τ²'s environment, action and communicate evaluators."""
    env_eval = tau2_module("evaluator.evaluator_env").EnvironmentEvaluator
    action_eval = tau2_module("evaluator.evaluator_action").ActionEvaluator
    communicate_eval = tau2_module("evaluator.evaluator_communicate").CommunicateEvaluator
    env_info = env_eval.calculate_reward(
        environment_constructor=domain.environment,
        task=task,
        full_trajectory=trajectory,
        solo_mode=False,
    )
    return (
        env_info,
        action_eval.calculate_reward(task=task, full_trajectory=trajectory),
        communicate_eval.calculate_reward(task=task, full_trajectory=trajectory),
    )
