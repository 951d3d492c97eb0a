"""The GPU path, on the device `AGENTGYM_CHECK_DEVICE` names (bench/gpu_check.sh sets it).

Without it these tests run on the GPU when there is one and skip otherwise, so CI (no GPU)
skips them; `bash bench/gpu_check.sh --dry-run` runs them here on the CPU. They check
what only a device shows: train, sft and eval put the model there and keep its dtype
(bf16 under `model.precision: auto` on a GPU that has it), a bf16 learner gradient on it,
DistributedDataParallel on it, and packed rows on its attention kernels.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from test_distributed_learner import CASES, assert_close, run_on_two_ranks

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.learn.learner import Learner
from agentgym.learn.logprobs import token_logprobs
from agentgym.policy import models
from agentgym.policy.models import load_dtype

NAMED = os.environ.get("AGENTGYM_CHECK_DEVICE")
DEVICE = torch.device(NAMED or ("cuda" if torch.cuda.is_available() else "cpu"))
pytestmark = pytest.mark.skipif(
    NAMED is None and not torch.cuda.is_available(),
    reason="no GPU (AGENTGYM_CHECK_DEVICE=cpu runs these on the CPU, as gpu_check.sh --dry-run)",
)
BF16 = DEVICE.type == "cuda" and torch.cuda.is_bf16_supported()
SMALL = ["--model", "tiny-random", "--env", "tool_call", "--set", f"model.device={DEVICE}",
         "--set", "eval.tasks=2", "--set", "eval.report_tasks=2", "--set", "eval.n=0",
         "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
         "--set", "sampling.max_new_tokens=16", "--set", "sft.steps=1",
         "--set", "sft.demonstrations=2", "--set", "sft.batch_size=2",
         "--set", "run.report_to=[]"]  # fmt: skip


@pytest.fixture
def placed(monkeypatch) -> list[torch.device]:
    """Where each model `train` placed landed (the real placement, recorded)."""
    devices: list[torch.device] = []
    real = models.place

    def recording(model, config):
        model = real(model, config)
        devices.append(next(model.parameters()).device)
        return model

    monkeypatch.setattr(models, "place", recording)
    return devices


def _dtypes(path) -> set[torch.dtype]:
    with safe_open(str(path), "pt") as f:
        return {f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)


def test_train_with_sft_runs_on_the_device_and_saves_its_dtype(tmp_path, placed):
    out = tmp_path / "run"
    argv = ["train", *SMALL, "--steps", "1", "--set", "sft.warmup=true", "--output", str(out)]
    assert main(argv) == 0
    assert placed and all(d.type == DEVICE.type for d in placed)
    want = torch.bfloat16 if BF16 else torch.float32
    assert _dtypes(out / "checkpoint-sft" / "model.safetensors") == {want}
    assert (out / "report" / "report.json").exists()


def test_eval_and_sft_run_on_the_device(tmp_path):
    assert main(["sft", *SMALL, "--output", str(tmp_path / "sft")]) == 0
    assert main(["eval", *SMALL, "--output", str(tmp_path / "eval")]) == 0
    assert (tmp_path / "eval" / "report.json").exists()


OWN_LOGPROB_OFFSET = 0.05
"""How far below the model's own logprobs the bf16 test sets the old ones: every ratio is
exp(0.05) = 1.05 in fp32, and bf16 moves the logprobs by 2.8e-3 at most on tiny-random (on
the CPU), so every ratio stays far inside the clip [0.8, 1.2] in both precisions and the
gradients differ by rounding alone. `fixed_batch`'s own old logprobs lie about 5 nats above
the model's: every ratio near e^-5, the clip zeroing the rows of negative advantage and e^-5
scaling the rest, so a loss compared there is mostly the clip's constants."""
BF16_GRADIENT_TOLERANCE = 5e-2
"""Largest |bf16 gradient - fp32 gradient| / |fp32 gradient| accepted (L2 over all weights).
bf16 keeps 8 significant bits (2^-9 = 2e-3 relative): the weights are stored so, as train
loads them, and autocast rounds the inputs of every matmul, forward and backward, summing
in fp32. On tiny-random that leaves the gradient 6.1e-3 off (measured with
AGENTGYM_CHECK_DEVICE=cpu; a GPU's bf16 kernels round in the same places). 5e-2 leaves
eight times that for other kernels, while a gradient with a term, a token or a row wrong is
off by order 1, and one that bf16 never touched by exactly 0."""


def _learner(model, precision: str) -> Learner:
    """A learner as train builds one on the device: its weights in the dtype train loads them
    in (bf16 under `model.precision: bf16`), its autocast per `model.precision`."""
    config = load_config(overrides={"model.precision": precision, "grpo.beta": 0.04})
    return Learner(copy.deepcopy(model).to(DEVICE, dtype=load_dtype(config.model)), config)


def _gradient(learner: Learner, batch) -> tuple[torch.Tensor, dict[str, float]]:
    """The gradient of `batch`'s loss, every weight's flattened into one float32 vector on
    the CPU, and the loss's metrics."""
    stats = learner.accumulate(batch)
    grads = [p.grad for p in learner.model.parameters() if p.grad is not None]
    return torch.cat([g.float().flatten().cpu() for g in grads]), stats


def test_a_bf16_learner_gradient_on_the_device_is_the_fp32_one_up_to_rounding(tiny):
    from distributed_step import fixed_batch

    model = tiny[0]
    fp32, bf16 = _learner(model, "fp32"), _learner(model, "bf16")
    assert (fp32.autocast, bf16.autocast) == (None, torch.bfloat16)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    batch = fixed_batch(model.config.vocab_size)
    own = fp32.old_logprobs(batch).cpu()
    batch = replace(batch, old_logprobs=(own - OWN_LOGPROB_OFFSET) * batch.loss_mask)
    exact, exact_stats = _gradient(fp32, batch)
    rounded, rounded_stats = _gradient(bf16, batch)
    assert exact_stats["clip_fraction"] == rounded_stats["clip_fraction"] == 0.0
    assert exact.shape == rounded.shape and bool(torch.isfinite(rounded).all())
    assert float(exact.norm()) > 0  # a gradient to compare, not two empty ones
    error = float((rounded - exact).norm() / exact.norm())
    print(f"bf16 gradient: relative L2 error {error:.2e} against fp32")
    assert 0 < error <= BF16_GRADIENT_TOLERANCE


def test_ddp_on_the_device_takes_the_one_process_step(tmp_path, monkeypatch):
    """Two ranks on this device (gloo lets them share one GPU) against one process on it."""
    import json

    from distributed_step import run

    monkeypatch.setenv("AGENTGYM_CHECK_DEVICE", str(DEVICE))
    case = CASES["ddp-lora-grpo"]
    cases = json.dumps([{"overrides": case}])
    run_on_two_ranks(str(os.path.join(os.path.dirname(__file__), "distributed_step.py")), cases,
                     str(tmp_path), AGENTGYM_CHECK_DEVICE=str(DEVICE),
                     AGENTGYM_DIST_BACKEND="gloo")  # fmt: skip
    single = run(case)
    for rank in range(2):
        got = torch.load(tmp_path / f"case0-rank{rank}.pt")
        assert got["runner"] == "DistributedDataParallel"
        assert_close(got["weights"], single["weights"], f"rank {rank}'s weights", 1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_give_the_padded_logprobs_on_the_device(tiny, attention):
    from distributed_step import fixed_batch

    model = copy.deepcopy(tiny[0]).to(DEVICE)
    model.set_attn_implementation(attention)
    batch = fixed_batch(model.config.vocab_size)
    batch = type(batch)(*(t.to(DEVICE) for t in (batch.input_ids, batch.attention_mask,
                          batch.loss_mask, batch.old_logprobs, batch.advantages)))  # fmt: skip
    with torch.no_grad():
        padded = token_logprobs(model, batch, 1.0, None, False)[0]
        packed = token_logprobs(model, batch, 1.0, None, False, True)[0]
    assert bool((packed != 0).any())
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-4)
