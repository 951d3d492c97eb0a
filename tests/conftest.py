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
