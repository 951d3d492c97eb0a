"""The ASGI app `openenv.yaml` names: EchoDigit behind openenv-core's server, as the app
`openenv init` writes (`uvicorn server.app:app`, from this folder)."""

from openenv.core.env_server.http_server import create_app

try:
    from ..models import PromptObservation, SayAction
    from .echo_digit_environment import EchoDigit
except ImportError:
    from models import PromptObservation, SayAction

    from server.echo_digit_environment import EchoDigit

app = create_app(
    EchoDigit,
    SayAction,
    PromptObservation,
    env_name="echo_digit",
    max_concurrent_envs=64,
)
