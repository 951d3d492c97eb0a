"""A run written by an older agentgym still resumes and evaluates the same.

`fixtures/start_run` is a tiny-random LoRA run's checkpoint at step 2 (of 4) as commit
66acda5 wrote it, with that commit's own figures in `expected.json`: its weights at step 4,
its metrics rows for steps 3 and 4, and its held-out report of the step-2 checkpoint. The
files on disk (adapters, optimizer and RNG state, config, metrics) must keep loading, and
the training they resume must go on bitwise as it did.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from agentgym.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "start_run"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_second"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_old_checkpoint_resumes_to_the_same_weights_and_metrics(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run, ignore=shutil.ignore_patterns("expected.json"))
    assert main(["train", "--resume", str(run / "checkpoint-000002")]) == 0
    weights = run / "checkpoint-000004" / "adapter_model.safetensors"
    assert _sha(weights.read_bytes()) == EXPECTED["checkpoint-000004/adapter_model.safetensors"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    resumed = [{k: v for k, v in r.items() if k not in TIMING} for r in rows[2:]]
    assert resumed == EXPECTED["metrics_after_resume"]


def test_the_old_checkpoint_evaluates_to_the_same_report(tmp_path):
    expected = EXPECTED["eval_of_checkpoint-000002"]
    argv = ["eval", "--env", "cli_envs:cli_envs/TaughtDigits-v0"]
    argv += ["--model", str(FIXTURE / "checkpoint-000002"), *expected["args"]]
    assert main([*argv, "--output", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["models"] == expected["models"]
    assert _sha(json.dumps(report["tasks"], sort_keys=True).encode()) == expected["tasks_sha256"]
