"""`truncate_logs`: a resumed run keeps its logs up to the checkpoint's step, byte for byte."""

from __future__ import annotations

from agentgym.run.runlog import truncate_logs


def test_truncate_logs_keeps_steps_up_to_the_checkpoint_exactly_and_drops_a_torn_line(tmp_path):
    # spacing, key order, a non-ASCII string, a null: kept as written, never re-serialised
    kept = ['{"step": 1, "reward/mean": 0.25}\n', '{"loss":null,"step":2,"note":"naïve ✓"}\n']
    later = ['{"step": 3, "reward/mean": 0.75}\n', '{"step": 10}\n']
    torn = '{"step": 4, "reward/me'  # what a process killed mid-write leaves last
    (tmp_path / "metrics.jsonl").write_bytes("".join([*kept, *later, torn]).encode())
    episodes = [f'{{"step": {s}, "reply": "é{i}"}}\n' for s in (1, 2, 3) for i in range(2)]
    # a whole record whose newline never came is torn as well; it is always past the
    # checkpoint, since a step's lines are written and closed before its checkpoint
    (tmp_path / "completions.jsonl").write_bytes("".join([*episodes, '{"step": 3}']).encode())

    truncate_logs(tmp_path, 2)

    assert (tmp_path / "metrics.jsonl").read_bytes() == "".join(kept).encode()
    assert (tmp_path / "completions.jsonl").read_bytes() == "".join(episodes[:4]).encode()
    assert {p.name for p in tmp_path.iterdir()} == {"metrics.jsonl", "completions.jsonl"}


def test_truncate_logs_to_step_0_empties_the_logs_and_creates_none(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2')
    truncate_logs(tmp_path, 0)  # a run killed before its first checkpoint starts afresh
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""
    assert not (tmp_path / "completions.jsonl").exists()
