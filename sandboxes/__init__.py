"""Sandboxes that run model-written code: the contract in `base`, `local` and `docker`."""

from agentgym.sandboxes.contract import (
    ExecutionResult,
    Sandbox,
    SandboxUnavailableError,
    Status,
)
from agentgym.sandboxes.factory import make_sandbox

__all__ = ["ExecutionResult", "Sandbox", "SandboxUnavailableError", "Status", "make_sandbox"]
