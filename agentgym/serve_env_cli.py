"""`agentgym serve-env ENV`: the command's arguments and the call that serves the env."""

from __future__ import annotations

import argparse
from typing import Any

from agentgym.config import ConfigError
from agentgym.config_cli import load
from agentgym.extras import require


def serve_env_parser(sub: Any) -> None:
    """Adds `serve-env` to the `agentgym` command's subparsers."""
    p = sub.add_parser(
        "serve-env", help="Serve an environment as an OpenEnv server (actions {'message': text})."
    )
    p.add_argument("env", metavar="ENV", help="tool_call, a registered id, or module:Env-v0")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument(
        "--api-key",
        help="requests must send 'Authorization: Bearer <key>'; needed off loopback",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=64,
        metavar="N",
        help="most episodes (WebSocket sessions) at once; more are refused (default: 64)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="run.env_kwargs.NAME=VALUE",
        help="a keyword argument of the environment, e.g. run.env_kwargs.families=[sql]",
    )


def cmd_serve_env(args: argparse.Namespace) -> int:
    """Serves `args.env` until interrupted (docs/ecosystem.md)."""
    require("openenv", "agentgym serve-env")
    from agentgym.serve.openenv_server import run_serve_env

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port {args.port}: give a port from 1 to 65535")
    config = load(None, [*args.overrides, f"run.env={args.env}"])
    run_serve_env(
        config.run.env,
        config.run.env_kwargs,
        args.host,
        args.port,
        max_sessions=args.max_sessions,
        api_key=args.api_key,
    )
    return 0
