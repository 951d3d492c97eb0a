"""The `info` keys the players read, typed at the boundary (`agentgym.env.info`)."""

from __future__ import annotations

import pytest

from agentgym.env.info import ResetInfo, StepInfo


def test_an_info_value_of_the_wrong_type_is_named_by_its_key():
    with pytest.raises(TypeError, match=r"env.step's info\['tool_errors'\] is a list"):
        StepInfo.read({"tool_errors": ["timeout"]})
    with pytest.raises(KeyError, match="no 'task_id'"):
        ResetInfo.read({"tools": []})
    read = ResetInfo.read({"task_id": "a", "tools": [{"type": "function"}]})
    assert read.native_tools is None  # rendered by the template only when it is native
    assert StepInfo.read({}).tool_calls is None  # no counter for an env that counts none
