"""Attacks on the inputs a run reads (issue 53, item 4): config files with limits. Each runs
`agentgym train --config FILE` in a child process under a memory limit (RLIMIT_AS) and a
time limit, so that a regression fails the test instead of the machine.

Before: a YAML alias bomb of 649 bytes took 56 s and 4.8 GB, then a MemoryError traceback;
a 50 MB config took up to 200 s and 4.1 GB and ended in a 100 MB error message; a config
nested thousands deep was a RecursionError traceback; a non-UTF-8 file was named by byte
offset only."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

LIMIT_BYTES = 6 << 30
"""The child's address space: torch and transformers load within it; 4.8 GB of expanded
aliases on top of them do not."""
LIMIT_S = 60


def _train(config: Path) -> tuple[int, str, float]:
    """`agentgym train --config config` in a child held to LIMIT_BYTES: its exit code,
    stderr and wall seconds."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_BYTES, LIMIT_BYTES))

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agentgym", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        preexec_fn=limit,
    )
    return done.returncode, done.stderr, time.monotonic() - started


def _bomb(levels: int = 9) -> str:
    """The billion-laughs shape inside a field the config has (`sampling.stop`, a list): each
    level a list of ten aliases of the one before."""
    shapes = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for k in range(1, levels):
        shapes.append(f"&a{k} [" + ",".join([f"*a{k - 1}"] * 10) + "]")
    return "sampling:\n  stop: [" + ", ".join(shapes) + "]\n"


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(_bomb())
    assert config.stat().st_size < 1000
    code, err, _ = _train(config)
    assert code == 2, err[-2000:]
    assert "its aliases expand it to 100001 values, more than 100000" in err
    assert "Traceback" not in err and len(err) < 2000


def test_a_huge_config_is_refused_by_its_size_with_a_short_message(tmp_path):
    config = tmp_path / "huge.yaml"
    config.write_text("grpo:\n  beta: 0.0\n" + "# " + "x" * (50 << 20) + "\n")
    code, err, seconds = _train(config)
    assert code == 2 and "bytes; a config file is at most 1048576" in err
    assert len(err) < 2000 and seconds < LIMIT_S


@pytest.mark.parametrize("depth", [150, 10_000])
def test_a_config_nested_thousands_deep_is_refused_without_a_traceback(tmp_path, depth):
    config = tmp_path / "deep.yaml"
    config.write_text("grpo: " + "[" * depth + "]" * depth + "\n")
    code, err, _ = _train(config)
    assert code == 2, err[-2000:]
    assert "is refused: it nests" in err and "Traceback" not in err


def test_a_config_that_is_not_utf8_is_named_by_line_and_column(tmp_path):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("grpo:\n  beta: 0.0\n# caf\u00e9\n".encode("latin-1"))
    code, err, _ = _train(config)
    assert code == 2, err[-2000:]
    assert "is not UTF-8 text (line 3, column 6: byte 0xe9)" in err


def test_anchors_and_merges_a_real_config_uses_still_load(tmp_path):
    from agentgym.config import load_config

    config = tmp_path / "anchors.yaml"
    config.write_text("sampling: {temperature: &t 0.7, top_p: *t}\ngrpo: {beta: *t}\n")
    loaded = load_config(config)
    assert loaded.sampling.temperature == loaded.sampling.top_p == loaded.grpo.beta == 0.7


# -- data files: per-cell size and nesting limits, errors by line ----------------------------

ROWS = [
    {"prompt": "What is 1 + 1?", "answer": "2", "split": "train"},
    {"prompt": "What is 2 + 2?", "answer": "4", "split": "test"},
]


def _tasks(path: Path):
    import gymnasium as gym

    import agentgym  # noqa: F401  (registers the built-in environments)

    return gym.make("agentgym/Tasks-v0", data=str(path))


def _jsonl(path: Path, rows: list) -> Path:
    import json

    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_huge_string_in_a_data_row_is_refused_naming_its_line_and_column(tmp_path):
    from agentgym.envs.tasks.data import MAX_CELL_CHARS as limit

    huge = {"prompt": "x" * (limit + 1), "answer": "1", "split": "train"}
    path = _jsonl(tmp_path / "huge.jsonl", [*ROWS, huge])
    with pytest.raises(ValueError) as caught:
        _tasks(path)
    message = str(caught.value)
    assert f"line 3: column 'prompt' holds a string of {limit + 1} characters" in message
    assert len(message) < 2000


@pytest.mark.parametrize("depth", [100, 10_000])
def test_a_cell_nested_thousands_deep_is_refused_naming_its_line(tmp_path, depth):
    schema = "[" * depth + "]" * depth
    deep = '{"prompt": "p", "answer": "1", "split": "train", "tools": ' + schema + "}"
    path = _jsonl(tmp_path / "deep.jsonl", [*ROWS, deep])
    with pytest.raises(ValueError, match="line 3: (column 'tools' nests deeper|nests too deep)"):
        _tasks(path)


def test_a_data_file_that_is_not_utf8_is_named_by_line_and_column(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"not UTF-8 text \(line 2, column 16: byte 0xe9\)"):
        _tasks(path)


# -- view: the files it is given are checked, each problem named -----------------------------


@pytest.mark.parametrize("damage", ["metrics", "episodes", "report"])
def test_view_names_a_malformed_file_with_exit_2(tmp_path, capsys, damage):
    from agentgym.cli import main

    folder = tmp_path / "run"
    (folder / "episodes").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    if damage == "metrics":
        bad = folder / "metrics.jsonl"
        bad.write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew\n')
        want = f"{bad}: line 2 is not JSON"
    elif damage == "episodes":
        bad = folder / "episodes" / "step-000001.npz"
        bad.write_bytes(b"PK\x03\x04 this is not a whole zip file")
        want = f"{bad}: not an episodes file as agentgym writes it"
    else:
        bad = folder / "report.json"
        bad.write_text('{"tasks": [1, 2')
        want = f"{bad}: not JSON"
    assert main(["view", str(folder)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert want in err and "Traceback" not in err
