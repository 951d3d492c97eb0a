"""Asynchronous GRPO with a vLLM engine in this process (`policy.backend: vllm`,
`pipeline.max_off_policy_steps: 1`): the engine samples the next step on the sampler thread
while the learner steps, and a held-out evaluation, which needs the same engine with the
learner's weights, holds the thread between two steps and puts the sampler's weights back.

Runs where vLLM is installed (`.venv-vllm`); elsewhere it skips. The embedded model:
tiny-random cannot serve on vLLM's CPU build (see tests/test_vllm.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm"
)

STEPS = 3
SETS = [
    "grpo.group_size=2", "grpo.tasks_per_step=2", "sampling.max_new_tokens=32",
    "sampling.max_episode_tokens=1024", "lora.enabled=true", "optim.lr=1e-3",
    "run.report_to=[]", f"run.save_every={STEPS}", "run.log_episodes=false",
    "model.precision=fp32", "policy.dtype=float32", "pipeline.max_off_policy_steps=1",
    "eval.tasks=2", "eval.n=0", "eval.report_tasks=0",
]  # fmt: skip


def _train(out: Path, every: int) -> None:
    cmd = [sys.executable, "-m", "agentgym", "train", "--env", "tool_call", "--policy", "vllm",
           "--steps", str(STEPS), "--output", str(out), "--set", f"eval.every={every}"]  # fmt: skip
    for item in SETS:
        cmd += ["--set", item]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_an_async_run_on_an_in_process_engine_evaluates_without_disturbing_its_sampler(
    tmp_path,
):
    evaluated, plain = tmp_path / "evaluated", tmp_path / "plain"
    _train(evaluated, every=1)
    _train(plain, every=0)
    trained = _lines(evaluated / "trained.jsonl")
    assert [r["step"] for r in trained] == [1, 2, 3]
    for row in trained:  # version max(0, step - 2), as the transformers sampler's
        want = max(0, row["step"] - 2)
        assert [g["versions"] for g in row["groups"]] == [[want, want]] * 2, row
    metrics = _lines(evaluated / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    assert all("eval/correctness" in m for m in metrics)  # an evaluation at every step
    assert not any("eval/correctness" in m for m in _lines(plain / "metrics.jsonl"))
    # the evaluations loaded the learner's weights into the engine between steps; the
    # sampler got its own back, so it sampled the very episodes of the run without them
    assert trained == _lines(plain / "trained.jsonl")
    played = [
        [(c["turns"], c["reward"]) for c in _lines(run / "completions.jsonl")]
        for run in (evaluated, plain)
    ]
    assert len(played[0]) == STEPS * 4 and played[0] == played[1]
    weights = f"checkpoint-{STEPS:06d}/adapter_model.safetensors"
    assert (evaluated / weights).read_bytes() == (plain / weights).read_bytes()
