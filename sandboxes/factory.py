"""`make_sandbox`: a sandbox by name, "local" or "docker"."""

from __future__ import annotations

from typing import Any

from agentgym.sandboxes.contract import SANDBOX_KINDS, Sandbox, SandboxKind


def make_sandbox(kind: SandboxKind = "local", **kwargs: Any) -> Sandbox:
    """Builds a sandbox by name: "local" (namespaces + rlimits) or "docker".

    Args:
        kind: which implementation.
        **kwargs: passed to the implementation's constructor.

    Raises:
        ValueError: for an unknown kind.
        SandboxUnavailableError: when the kind cannot isolate code here.
    """
    if kind == "local":
        from agentgym.sandboxes.local import LocalSandbox

        return LocalSandbox(**kwargs)
    if kind == "docker":
        from agentgym.sandboxes.docker import DockerSandbox

        return DockerSandbox(**kwargs)
    raise ValueError(f"unknown sandbox kind {kind!r}; valid kinds: {', '.join(SANDBOX_KINDS)}")
