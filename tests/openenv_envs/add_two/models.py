"""The action and observation of AddTwo (the layout `openenv init` writes)."""

from openenv.core.env_server.types import Action, Observation


class AnswerAction(Action):
    message: str


class QuestionObservation(Observation):
    prompt: str = ""
