"""The scripted user that stands in for τ²-bench's LLM user simulator.

τ²'s user simulator is an LLM (reached through litellm, over the network) that plays the
task's `user_scenario`. Offline there is none, so a script plays the user, the same for
every task:

1. Its first message is the scenario itself, as τ² renders it for its simulator
   (`str(task.user_scenario)`: persona, reason for the call, what the user knows and does
   not know, their instructions), after one line saying that this is what it is.
2. It answers each of the agent's messages (a turn without tool calls) with `REPLY`, a
   fixed text that adds nothing and confirms what the first message asks for, as τ²'s
   policies require the agent to obtain an explicit "yes" before writing to the database.
3. It ends the conversation with τ²'s stop token (`###STOP###`) at the agent's message
   after `replies` replies, and with `###TRANSFER###` at the agent's first message after a
   successful `transfer_to_human_agents` (as τ²'s simulation guidelines tell the user
   simulator to). The agent may end it itself by writing `###STOP###`, τ²'s agent stop.

A user that confirms whatever was asked cannot test what τ²'s simulator tests through
conversation (an agent that acts before asking, a user who changes their mind later); the
scenario's conditions are all in the first message, so a policy-following agent has what it
needs. Both ends (user stop, agent stop) are terminations τ²'s evaluator scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STOP = "###STOP###"  # tau2.user.base.STOP, and tau2.agent.llm_agent's agent STOP_TOKEN
TRANSFER = "###TRANSFER###"  # tau2.user.base.TRANSFER
TRANSFER_TOOL = "transfer_to_human_agents"
OPENING = (
    "(A scripted customer: what follows is the customer's situation as τ²-bench gives it to "
    "its user simulator; it is everything the customer will tell you.)\n\n{scenario}"
)
REPLY = (
    "I have nothing to add to what I told you. Where you need my confirmation to do what I "
    "asked for, yes, I confirm. If you are done, end the conversation with " + STOP + "."
)
GOODBYE = "That is all, thank you. " + STOP


@dataclass(frozen=True)
class ScriptedUser:
    """The scripted user (see the module); `replies` fixed replies before it says goodbye."""

    replies: int = 3

    def __post_init__(self) -> None:
        if isinstance(self.replies, bool) or not isinstance(self.replies, int) or self.replies < 0:
            raise ValueError(f"user_replies={self.replies!r}; valid: an int >= 0")

    def opening(self, task: Any) -> str:
        """The first message, from a τ² `Task`."""
        return OPENING.format(scenario=str(task.user_scenario))

    def reply(self, replied: int, transferred: bool) -> tuple[str, bool]:
        """(the answer to the agent's message, whether it ends the conversation), given how
        many replies came before it and whether the agent has transferred the user."""
        if transferred:
            return TRANSFER, True
        if replied >= self.replies:
            return GOODBYE, True
        return REPLY, False

    def config(self) -> dict[str, Any]:
        """The script, for the env's `scoring` record."""
        return {
            "kind": "scripted",
            "opening": OPENING,
            "reply": REPLY,
            "replies": self.replies,
            "goodbye": GOODBYE,
            "after_transfer": TRANSFER,
            "agent_stop": STOP,
        }
