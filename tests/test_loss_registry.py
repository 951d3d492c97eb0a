"""One registry entry per policy loss: its function and its micro-batch weight together."""

import pytest

from agentgym.learn.grpo import (
    LOSSES,
    MICRO_BATCH_WEIGHTS,
    POLICY_LOSSES,
    RegisteredLoss,
    register_policy_loss,
)


def test_each_builtin_loss_is_one_entry_with_its_weight():
    assert set(LOSSES) == {"grpo", "bnpo", "dr_grpo", "dapo", "token_mean"}
    weights = {name: entry.weight for name, entry in LOSSES.items()}
    assert weights == {
        "grpo": "sequences", "bnpo": "sequences", "dr_grpo": "sequences",
        "dapo": "tokens", "token_mean": "tokens",
    }  # fmt: skip
    assert LOSSES["token_mean"].fn is LOSSES["dapo"].fn  # the older name of dapo


def test_the_name_views_read_and_remove_the_one_entry():
    def loss(*args, **kwargs):
        raise AssertionError("never called")

    before = len(LOSSES)
    register_policy_loss("test_view", weight="tokens")(loss)
    try:
        assert LOSSES["test_view"] == RegisteredLoss(loss, "tokens")
        assert POLICY_LOSSES["test_view"] is loss and MICRO_BATCH_WEIGHTS["test_view"] == "tokens"
        assert len(POLICY_LOSSES) == len(MICRO_BATCH_WEIGHTS) == before + 1
        assert list(MICRO_BATCH_WEIGHTS) == list(LOSSES)
        with pytest.raises(TypeError) as refused:
            MICRO_BATCH_WEIGHTS["test_view"] = "sequences"
        assert str(refused.value) == "add a policy loss with register_policy_loss(name, weight)"
        assert POLICY_LOSSES.pop("test_view") is loss
        assert "test_view" not in LOSSES and MICRO_BATCH_WEIGHTS.pop("test_view", None) is None
    finally:
        LOSSES.pop("test_view", None)
    assert len(LOSSES) == before
