"""The action and observation of EchoDigit (the layout `openenv init` writes)."""

from openenv.core.env_server.types import Action, Observation


class SayAction(Action):
    message: str


class PromptObservation(Observation):
    prompt: str = ""
