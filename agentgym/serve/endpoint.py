"""`agentgym serve`: the policy behind an OpenAI-compatible endpoint, in the foreground."""

from __future__ import annotations

import logging
import os
import signal
import threading

import torch

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


GRACE_S = float(os.environ.get("AGENTGYM_SERVE_GRACE_S", 20))
"""How long `agentgym serve` waits, after SIGINT or SIGTERM, for the requests computing to
end before it exits all the same (with 0: it was asked to stop, and it stopped)."""


def on_signal(stop: threading.Event, number: int) -> None:
    """The first SIGINT or SIGTERM: stop serving, within GRACE_S; a second: exit at once."""
    if stop.is_set():
        print(f"agentgym serve: {signal.Signals(number).name} again: exiting now", flush=True)
        os._exit(128 + number)
    stop.set()
    timer = threading.Timer(GRACE_S, _overdue)
    timer.daemon = True
    timer.start()


def _overdue() -> None:
    print(
        f"agentgym serve: requests still computing {GRACE_S:g} s after the stop; exiting "
        "without them",
        flush=True,
    )
    os._exit(0)


def decode_threads(threads: int | None) -> int:
    """The torch threads that decode on CPU: `threads`, else OMP_NUM_THREADS, else all the
    cores this process may run on but one. The spare core answers HTTP and tokenizes: torch's
    OpenMP threads wait for each other at every operation, so one of them preempted by the
    server's own work stalls them all (beside 5 clients sending over-long prompts, short
    requests took 8x as long with 2 threads on 2 cores, 1.8x with 1; vLLM's CPU backend
    reserves a core for its API server for the same reason)."""
    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = int(os.environ["OMP_NUM_THREADS"])
    if threads is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        threads = max(1, (cores or os.cpu_count() or 2) - 1)
    return threads


def run_serve(
    config: Config,
    host: str,
    port: int,
    api_key: str | None,
    limits: ServeLimits | None = None,
    threads: int | None = None,
) -> None:
    """Loads `model.name` as the config says, and serves it until SIGINT or SIGTERM, after
    which the listener, the engine and the policy are closed and it returns: within
    `GRACE_S` (else it exits 0 without the requests still computing), or at once on a
    second signal. On CPU, `decode_threads(threads)` torch threads decode."""
    check_host(host, api_key)
    if config.policy.backend == "hf":  # vLLM sets its own threads
        torch.set_num_threads(decode_threads(threads))
    model, tokenizer = load_configured(config.model.name, config.model)
    model = place(model, config.model)
    engine_dir = engine_folder(config, model, tokenizer)
    policy = make_policy(config, model, tokenizer, engine_dir=engine_dir)
    engine = Engine(policy, continuous=True)  # no weights change while it serves
    kwargs = config.run.env_kwargs
    service = ChatService(
        engine,
        tokenizer,
        resolve_model_name(config.model.name),
        tool_format=kwargs.get("tool_format", "auto"),
        tool_parser=kwargs.get("tool_parser"),
        max_new_tokens=config.sampling.max_new_tokens,
        limits=limits,
        aliases=(config.model.name or "embedded",),  # the name as the user gave it
    )
    calls = service.format.name
    where = f"{calls} tool calls; decode threads: {torch.get_num_threads()}"
    print(f"agentgym serve: {service.model_name} at http://{host}:{port}/v1 ({where})")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _: on_signal(stop, number))
    try:
        with Server(create_app(service, api_key), host, port):
            stop.wait()
    except OSError as err:
        raise ConfigError(str(err)) from None
    finally:
        engine.close()
        policy.close()
    print("agentgym serve: stopped; the port is closed")
