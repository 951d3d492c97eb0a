"""Under torchrun with a DDP learner every rank plays its share of each step's episodes
(`scale.samplers.RankSampler`), and the run is the one-process run."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from test_distributed_learner import run_on_two_ranks

from agentgym.cli import main

HERE = Path(__file__).parent
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_second", "rollout/weight_sync_seconds"}
RUN = [
    "train", "--env", "cli_envs:cli_envs/PlayedDigits-v0", "--model", "tiny-random",
    "--steps", "2", "--set", "optim.lr=1e-3", "--set", "optim.micro_batch_size=3",
    "--set", "grpo.group_size=4", "--set", "grpo.tasks_per_step=3",
    "--set", "sampling.max_new_tokens=10", "--set", "run.report_to=[]",
    "--set", "run.log_completions=12",
]  # fmt: skip
"""Two steps of 3 task groups of 4: on two ranks, rank 0 plays 1 group and rank 1 2."""


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def _completions(out: Path) -> list[str]:
    return (out / "completions.jsonl").read_text().splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, list[str]]]:
    """The run's folder and the "pid task_id" lines of its replies, in one process and on
    two torchrun ranks."""
    root = tmp_path_factory.mktemp("ranks")
    out: dict[str, tuple[Path, list[str]]] = {}
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    for name in ("one", "two"):
        played = root / f"{name}.played"
        played.touch()
        folder = root / name
        argv = [*RUN, "--output", str(folder)]
        if name == "one":
            os.environ["AGENTGYM_TEST_PLAYED"] = str(played)
            try:
                assert main(argv) == 0
            finally:
                del os.environ["AGENTGYM_TEST_PLAYED"]
        else:
            run_on_two_ranks("-m", "agentgym", *argv, PYTHONPATH=path,
                             AGENTGYM_TEST_PLAYED=str(played))  # fmt: skip
        out[name] = (folder, played.read_text().splitlines())
    return out


@pytest.mark.slow
def test_each_rank_plays_its_share_of_the_groups(runs):
    _, played = runs["two"]
    per_process = Counter(line.split()[0] for line in played)
    assert len(per_process) == 2  # both ranks played
    assert sorted(per_process.values()) == [2 * 4, 2 * 2 * 4]  # 1 and 2 groups a step, 2 steps
    _, alone = runs["one"]
    assert len({line.split()[0] for line in alone}) == 1 and len(alone) == 2 * 3 * 4


@pytest.mark.slow
def test_the_two_rank_run_is_the_one_process_run(runs):
    (one, _), (two, _) = runs["one"], runs["two"]
    assert _completions(two) == _completions(one)  # the same episodes, in the same order
    for a, b in zip(_rows(two), _rows(one), strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
            else:
                assert a[key] == value, key
