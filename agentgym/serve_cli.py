"""`agentgym serve`'s arguments, its limits on requests among them (`ServeLimits`)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any


def serve_parser(sub: Any) -> None:
    """Adds `serve` to the `agentgym` command's subparsers."""
    from agentgym.serve.requests import ServeLimits

    p = sub.add_parser("serve", help="Serve a model behind an OpenAI-compatible endpoint.")
    p.add_argument("--model", help="path, hub id, 'tiny-random' or 'embedded' (model.name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    p.add_argument("--policy", choices=["hf", "vllm"], help="sampling backend (policy.backend)")
    p.add_argument("--api-key", help="requests must send it as 'Authorization: Bearer <key>'")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads decoding on CPU (default: OMP_NUM_THREADS, else all cores but one, "
        "left to the HTTP server and tokenizer)",
    )
    p.add_argument("--config", type=Path, help="YAML config (model, sampling, run.env_kwargs)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field: run.env_kwargs.tool_format (auto, hermes, react), "
        "sampling.max_new_tokens (a request's default limit), model.chat_template",
    )
    limits = ServeLimits()
    for flag, what, past in (
        ("max_tokens", "the most tokens a request may ask for", "400"),
        ("max_n", "the most choices a request may ask for", "400"),
        ("max_body_bytes", "the largest request body", "400"),
        ("max_json_depth", "the deepest nesting of a request's JSON", "400"),
        ("max_waiting", "the most requests waiting or computing at once", "429, Retry-After"),
    ):
        default = getattr(limits, flag)
        name, words = f"--{flag.replace('_', '-')}", f"{what} (default {default}); past it: {past}"
        p.add_argument(name, type=int, default=default, help=words)


def limits_from(args: argparse.Namespace) -> Any:
    """The `ServeLimits` the command line gives; ConfigError naming a flag below 1."""
    from agentgym.config import ConfigError
    from agentgym.serve.requests import ServeLimits

    values = {f.name: getattr(args, f.name) for f in fields(ServeLimits)}
    for name, value in [*values.items(), ("threads", 1 if args.threads is None else args.threads)]:
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: give 1 or more")
    return ServeLimits(**values)
