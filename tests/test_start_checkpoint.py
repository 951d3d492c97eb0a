"""A run written by an older agentgym still resumes and evaluates the same.

`fixtures/start_run` is a tiny-random LoRA run's checkpoint at step 2 (of 4) as commit
66acda5 wrote it, with that commit's own figures in `expected.json`: its weights at step 4,
its metrics rows for steps 3 and 4, and its held-out report of the step-2 checkpoint. The
files on disk (adapters, optimizer and RNG state, config, metrics) must keep loading, and
the training they resume must go on as it did.

"As it did" is bitwise on one machine, not across machines: float32 sums come out in
another order on another CPU (AVX-512 or AVX2 kernels, MKL's paths, the thread count), and
the step-4 adapter's bytes differ with them. So the weights are compared with a reference
written by 66acda5's own code (`expected-checkpoint-000004-adapter.safetensors`; the
current code writes the same bytes on that machine), within `WEIGHT_TOLERANCE`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_distributed_learner import assert_close

from agentgym.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "start_run"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_second"}
ADDED = {"tokens/checked", "tokens/resampled"}
"""Metrics agentgym logs since 66acda5 (every row): present, and checked apart."""
ADAPTER = "adapter_model.safetensors"

WEIGHT_TOLERANCE = 1e-5
"""Measured: resuming on one machine with ATen's AVX-512, AVX2 and scalar kernels, MKL and
oneDNN held to AVX2 or SSE4.1, and one thread instead of two, moves the step-4 adapter by
at most 5.6e-7 from the reference; steps 3 and 4 move each adapter tensor by 3.4e-3 to
5.0e-3, which the test checks is far beyond this tolerance."""
METRIC_REL, METRIC_ABS = 1e-5, 1e-7
"""The same runs' metrics agree to 1e-6 relative, but for the policy loss, a sum of
advantages that cancel (about 1e-8, off by up to 5e-8)."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_old_checkpoint_resumes_to_the_same_weights_and_metrics(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run, ignore=shutil.ignore_patterns("expected*"))
    assert main(["train", "--resume", str(run / "checkpoint-000002")]) == 0
    weights = load_file(run / "checkpoint-000004" / ADAPTER)
    reference = load_file(FIXTURE / EXPECTED[f"checkpoint-000004/{ADAPTER}"]["reference"])
    assert_close(weights, reference, "step 4's adapter", WEIGHT_TOLERANCE)
    # steps 3 and 4 move every adapter tensor far beyond the tolerance, or it proves nothing
    step_2 = load_file(FIXTURE / "checkpoint-000002" / ADAPTER)
    assert all((reference[n] - step_2[n]).abs().max() > 100 * WEIGHT_TOLERANCE for n in reference)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    resumed = [{k: v for k, v in r.items() if k not in TIMING | ADDED} for r in rows[2:]]
    assert all(r["tokens/resampled"] == 0 and r["tokens/checked"] > 0 for r in rows[2:])
    want = EXPECTED["metrics_after_resume"]
    assert [r.keys() for r in resumed] == [r.keys() for r in want]
    for got, row in zip(resumed, want, strict=True):
        for key, value in row.items():  # None (a metric the run has no figure for) exactly
            close = (
                pytest.approx(value, rel=METRIC_REL, abs=METRIC_ABS) if value is not None else None
            )
            assert got[key] == close, f"step {row['step']} {key}: {got[key]} != {value}"


def test_the_old_checkpoint_evaluates_to_the_same_report(tmp_path):
    # The fixture's adapters were saved by peft 0.21; an older peft refuses fields it does not
    # know (`make test-lowest` runs peft 0.13), which says nothing about agentgym.
    import dataclasses

    from peft import LoraConfig

    saved = json.loads((FIXTURE / "checkpoint-000002" / "adapter_config.json").read_text())
    unknown = set(saved) - {f.name for f in dataclasses.fields(LoraConfig)}
    if unknown:
        pytest.skip(f"this peft cannot read adapters saved with {sorted(unknown)}")
    expected = EXPECTED["eval_of_checkpoint-000002"]
    argv = ["eval", "--env", "cli_envs:cli_envs/TaughtDigits-v0"]
    argv += ["--model", str(FIXTURE / "checkpoint-000002"), *expected["args"]]
    assert main([*argv, "--output", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["models"] == expected["models"]
    assert _sha(json.dumps(report["tasks"], sort_keys=True).encode()) == expected["tasks_sha256"]
