"""The ASGI app `openenv.yaml` names: AddTwo behind openenv-core's server, as the app
`openenv init` writes (`uvicorn server.app:app`, from this folder)."""

from openenv.core.env_server.http_server import create_app

try:
    from ..models import AnswerAction, QuestionObservation
    from .add_two_environment import AddTwo
except ImportError:
    from models import AnswerAction, QuestionObservation

    from server.add_two_environment import AddTwo

app = create_app(
    AddTwo, AnswerAction, QuestionObservation, env_name="add_two", max_concurrent_envs=64
)
