"""`agentgym serve`: the policy behind an OpenAI-compatible endpoint, in the foreground."""

from __future__ import annotations

import logging
import signal
import threading

from agentgym.config import Config, ConfigError
from agentgym.policy.backend import engine_folder, make_policy
from agentgym.policy.models import load_configured, place, resolve_model_name
from agentgym.serve.app import Server, create_app, is_loopback
from agentgym.serve.engine import Engine
from agentgym.serve.requests import ServeLimits
from agentgym.serve.service import ChatService

logger = logging.getLogger(__name__)


def check_host(host: str, api_key: str | None) -> None:
    """Refuses an empty host; warns when a host other than loopback has no API key (the
    model then serves anyone who can reach the port)."""
    if not host:
        raise ConfigError("--host is empty; give 127.0.0.1 (the default) or an address")
    if not is_loopback(host) and api_key is None:
        logger.warning(
            "agentgym serve: listening on %s without --api-key: anyone who can reach this "
            "port can use the model",
            host,
        )


def run_serve(
    config: Config, host: str, port: int, api_key: str | None, limits: ServeLimits | None = None
) -> None:
    """Loads `model.name` as the config says, and serves it until SIGINT or SIGTERM, after
    which the listener, the engine and the policy are closed and it returns."""
    check_host(host, api_key)
    model, tokenizer = load_configured(config.model.name, config.model)
    model = place(model, config.model)
    engine_dir = engine_folder(config, model, tokenizer)
    policy = make_policy(config, model, tokenizer, engine_dir=engine_dir)
    engine = Engine(policy)
    kwargs = config.run.env_kwargs
    service = ChatService(
        engine,
        tokenizer,
        resolve_model_name(config.model.name),
        tool_format=kwargs.get("tool_format", "auto"),
        tool_parser=kwargs.get("tool_parser"),
        max_new_tokens=config.sampling.max_new_tokens,
        limits=limits,
    )
    calls = service.format.name
    print(f"agentgym serve: {service.model_name} at http://{host}:{port}/v1 ({calls} tool calls)")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with Server(create_app(service, api_key), host, port):
            stop.wait()
    except OSError as err:
        raise ConfigError(str(err)) from None
    finally:
        engine.close()
        policy.close()
    print("agentgym serve: stopped; the port is closed")
