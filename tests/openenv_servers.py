"""An OpenEnv server written with openenv-core, for `agentgym/OpenEnv-v0` to play.

`EchoDigit` (in the folder `openenv_envs/echo_digit`, which OpenEnv-v0 also starts itself):
the reset's seed names a digit; the agent is asked to say it. A reply holding the digit ends
the episode with reward 1; any other gets 0 and one more try (two at most). `serve(...)`
runs it in this process on a free loopback port.
"""

from __future__ import annotations

import sys
from pathlib import Path

from openenv.core.env_server.http_server import create_fastapi_app

from agentgym.serve.app import Server

FOLDER = Path(__file__).resolve().parent / "openenv_envs" / "echo_digit"
"""EchoDigit's folder, laid out as `openenv init` lays one out (`OpenEnv-v0`'s `folder`)."""

sys.path.insert(0, str(FOLDER))
from models import PromptObservation, SayAction  # noqa: E402
from server.echo_digit_environment import EchoDigit  # noqa: E402

__all__ = ["FOLDER", "EchoDigit", "PromptObservation", "SayAction", "serve"]


def serve(max_sessions: int = 64) -> Server:
    """EchoDigit, to serve on a free loopback port: `with serve() as server:`."""
    app = create_fastapi_app(EchoDigit, SayAction, PromptObservation, max_sessions)
    return Server(app, "127.0.0.1", 0)
