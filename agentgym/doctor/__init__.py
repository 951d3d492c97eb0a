"""`agentgym doctor`: whether a model's chat template can carry a multi-turn tool
conversation (`template_checks`), and the set-up check that refuses to train a tool
environment with one that cannot (`check_env_template`). Its names are re-exported here:
`agentgym.doctor` is the path earlier docs gave. What it may import:
docs/overview.md#layout.
"""

from agentgym.doctor.template_checks import (
    TOOLS,
    Check,
    check_env_template,
    check_mask,
    check_plain_tool_text,
    check_prefix,
    check_round_trip,
    masked_conversation,
    run_checks,
    run_doctor,
    sample_conversation,
    show_mask,
    template_calls,
    tool_format,
)

__all__ = [
    "TOOLS",
    "Check",
    "check_env_template",
    "check_mask",
    "check_plain_tool_text",
    "check_prefix",
    "check_round_trip",
    "masked_conversation",
    "run_checks",
    "run_doctor",
    "sample_conversation",
    "show_mask",
    "template_calls",
    "tool_format",
]
