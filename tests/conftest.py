"""Shared fixtures: nothing here downloads; models are built in code or embedded."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny():
    """The tiny random Qwen2-style model and its tokenizer (built once, cached)."""
    from agentgym.policy.models import load_model_and_tokenizer

    return load_model_and_tokenizer("tiny-random")


# Tests of the local sandbox: under AGENTGYM_REQUIRE_SANDBOX=1 (CI) they may not skip, so
# a machine that cannot isolate code fails them instead of passing them all by skipping.
SANDBOX_TEST_FILES = frozenset(
    {"test_sandbox_local.py", "test_sandbox_claims.py", "test_sandbox_tree.py", "test_code_env.py"}
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under AGENTGYM_REQUIRE_SANDBOX=1, turns a local-sandbox test's skip into a failure.

    That is a test of `SANDBOX_TEST_FILES`, or any test that skips on a
    `SandboxUnavailableError` (the tool-call env's python tool). Docker's tests,
    skipped as a module where no engine starts, are not affected.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("AGENTGYM_REQUIRE_SANDBOX") != "1" or not report.skipped:
        return
    if hasattr(report, "wasxfail"):  # an expected failure reports as skipped too
        return
    from agentgym.sandboxes import SandboxUnavailableError

    cause = call.excinfo.value.__context__ if call.excinfo is not None else None
    if item.path.name in SANDBOX_TEST_FILES or isinstance(cause, SandboxUnavailableError):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"AGENTGYM_REQUIRE_SANDBOX=1: a sandbox test may not skip: {reason}"


SERIAL_FILES = {"test_sandbox_local.py", "test_sandbox_docker.py", "test_sandbox_tree.py"}
"""Their leak checks count the machine's processes, zombies and /tmp entries: another test
running beside them would be counted too. `make test` runs the rest on every core
(pytest-xdist), then these alone (`-m serial`)."""


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
