"""The declared step metrics: what a real step logs is declared, docs/metrics.md is current,
and a checkpoint's state round-trips with its keys in state.json's order."""

from __future__ import annotations

import json
from pathlib import Path

from agentgym import records
from agentgym.records import CheckpointState

ROOT = Path(__file__).parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "start_run"


def test_every_key_a_step_logged_is_declared():
    """The rows of a run written by an older commit (the start_run fixture) use only
    declared keys, so nothing a step logs goes undocumented."""
    rows = [json.loads(line) for line in (FIXTURE / "metrics.jsonl").read_text().splitlines()]
    keys = {k for row in rows for k in row} - {"step", "health"}
    undeclared = {k for k in keys if k not in records.STEP_METRICS
                  and not k.startswith(records.TOOL_ERRORS_PREFIX)}  # fmt: skip
    assert rows and undeclared == set()


def test_timing_keys_are_the_wall_clock_ones():
    assert {
        "step_seconds",
        "rollout_seconds",
        "tokens_per_second",
        "rollout/weight_sync_seconds",
        "rollout/sync_seconds",
    } == records.TIMING


def test_the_curves_panels_come_from_the_declarations_in_order():
    assert records.panels() == [
        (("reward/mean",), "reward (mean ± std)"),
        (("correctness_rate", "eval/correctness", "eval/pass@1"), "correctness (train, held-out)"),
        (("kl",), "KL to the reference"),
        (("entropy",), "entropy"),
        (("avg_completion_length",), "completion length (tokens)"),
    ]


def test_docs_metrics_md_is_generated_from_the_declarations():
    assert (ROOT / "docs" / "metrics.md").read_text() == records.metrics_markdown()


def test_a_key_declared_twice_is_refused():
    try:
        records.declare("kl", "again")
    except ValueError as err:
        assert "declared twice" in str(err)
    else:
        raise AssertionError("a second declaration of 'kl' was accepted")


def test_checkpoint_state_round_trips_an_old_state_json_in_its_key_order():
    raw = json.loads((FIXTURE / "checkpoint-000002" / "state.json").read_text())
    state = CheckpointState.from_json(raw)
    assert state.step == 2 and len(state.history) == 2
    assert list(state.to_json()) == list(raw)
    assert json.dumps(state.to_json()) == json.dumps(raw)
