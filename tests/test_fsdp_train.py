"""`agentgym train` under torchrun with `distributed.learner: fsdp`: the DDP run's steps,
checkpoints one process loads, and an exact resume."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_distributed_learner import assert_close, run_on_two_ranks

from agentgym.cli import main
from agentgym.config import ConfigError, load_config
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.run import preflight

HERE = Path(__file__).parent
TOLERANCE = 1e-5
"""FSDP and DDP sum the same gradients in another order, which moves an entry by up to
about 1e-9. AdamW divides each entry by its own size plus eps, so an entry whose gradient is
about eps moves its weight by up to lr / eps times that: with AdamW's default eps (1e-8) at
lr 1e-3, 1e-4 (an AMD EPYC measured 1.8e-5 where another CPU had passed 1e-5). The runs use
eps 1e-6: the weights after two steps differ by up to 7e-7 there, 4e-8 but in the entries
whose gradient is below 1e-4."""

RUN = [
    "train", "--env", "tool_call", "--model", "tiny-random", "--steps", "2",
    "--set", "optim.lr=1e-3", "--set", "optim.adam_epsilon=1e-6",
    "--set", "optim.micro_batch_size=3",
    "--set", "grpo.group_size=4", "--set", "grpo.tasks_per_step=2",
    "--set", "sampling.max_new_tokens=10", "--set", "run.report_to=[]",
    "--set", "run.save_every=1",
    "--set", "rewards.functions=[{fn: 'test_fsdp_train:distinct_characters'}]",
]  # fmt: skip
"""Two steps, a checkpoint after each; 8 episodes in micro-batches of 3, so that the two
ranks hold unequal shares."""

VARIANTS = {"lora": ["--set", "lora.enabled=true", "--set", "lora.r=4"], "full": []}


def distinct_characters(completion: str, **kwargs) -> float:
    """A reward that differs between the members of a group: tiny-random's episodes all
    get the same reward from the environment, so its advantages would all be 0."""
    return len(set(completion)) / 10


def _train(*argv: str) -> None:
    # the reward worker imports this module by name
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    run_on_two_ranks("-m", "agentgym", *argv, PYTHONPATH=path)


@pytest.fixture(scope="module", params=list(VARIANTS))
def runs(request, tmp_path_factory) -> dict[str, Path]:
    """A LoRA or a full fine-tune's run folders: two steps under DDP ("ddp") and under FSDP
    ("fsdp"), and the FSDP run stopped after step 1 and resumed ("resumed")."""
    root = tmp_path_factory.mktemp(request.param)
    for learner in ("ddp", "fsdp"):
        _train(*RUN, *VARIANTS[request.param], "--set", f"distributed.learner={learner}",
               "--output", str(root / learner))  # fmt: skip
    stopped = root / "resumed"
    shutil.copytree(root / "fsdp", stopped)
    shutil.rmtree(stopped / "checkpoint-000002")
    _train("train", "--resume", str(stopped / "checkpoint-000001"))
    return {"ddp": root / "ddp", "fsdp": root / "fsdp", "resumed": stopped}


def _trained(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's trained weights: its LoRA adapters, or its whole model."""
    found = [
        checkpoint / "adapter_model.safetensors",
        checkpoint / "adapter" / "adapter_model.safetensors",
    ]
    adapters = [f for f in found if f.is_file()]
    return load_file(adapters[0] if adapters else checkpoint / "model.safetensors")


def _optimizer(checkpoint: Path) -> dict[int, dict[str, torch.Tensor]]:
    """AdamW's state in a checkpoint, as `name/index` -> tensor (the step count included)."""
    state = torch.load(checkpoint / "optimizer.pt")["learner"]["optimizer"]["state"]
    return {f"{key}/{index}": value for index, entry in state.items()
            for key, value in entry.items()}  # fmt: skip


def _metrics(run: Path) -> list[dict]:
    """The logged metrics, without the timings."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(("seconds", "per_second"))}
            for r in rows]  # fmt: skip


def _assert_relatively_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
                             what: str, tolerance: float = 1e-4) -> None:  # fmt: skip
    """Each tensor within `tolerance` of the largest entry of its wanted value (AdamW's
    second moments are about 1e-9: an absolute tolerance would let anything pass)."""
    assert got.keys() == want.keys(), what
    for name, value in want.items():
        scale = value.abs().max().item()
        worst = (got[name] - value).abs().max().item()
        assert worst <= tolerance * scale, f"{what}: {name} off by {worst:.2e}"


def _largest_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


@pytest.mark.slow
def test_fsdp_takes_the_steps_ddp_takes(runs):
    fsdp, ddp = runs["fsdp"], runs["ddp"]
    for step in (1, 2):
        checkpoint = f"checkpoint-{step:06d}"
        assert_close(_trained(fsdp / checkpoint), _trained(ddp / checkpoint), f"step {step}",
                     TOLERANCE)  # fmt: skip
        _assert_relatively_close(_optimizer(fsdp / checkpoint), _optimizer(ddp / checkpoint),
                                 f"step {step}'s optimizer state")  # fmt: skip
    # each step moves the weights far beyond the tolerance (AdamW's first step by lr, 1e-3),
    # or equal weights would prove nothing
    first, second = _trained(fsdp / "checkpoint-000001"), _trained(fsdp / "checkpoint-000002")
    assert _largest_change(second, first) > 50 * TOLERANCE
    start, _ = load_model_and_tokenizer("tiny-random")
    if "model.embed_tokens.weight" in first:
        before = {n: p.detach() for n, p in start.state_dict().items() if n in first}
    else:  # LoRA: B starts at 0
        before = {n: torch.zeros_like(w) for n, w in first.items() if "lora_B" in n}
    assert _largest_change({n: first[n] for n in before}, before) > 50 * TOLERANCE
    for got, want in zip(_metrics(fsdp), _metrics(ddp), strict=True):
        assert got["reward/mean"] == want["reward/mean"]  # the same episodes
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
        assert got["grad_norm"] > 0


@pytest.mark.slow
def test_an_fsdp_checkpoint_is_one_process_s_and_loads_in_one(runs, tmp_path):
    fsdp, ddp = runs["fsdp"] / "checkpoint-000002", runs["ddp"] / "checkpoint-000002"
    assert sorted(p.name for p in fsdp.iterdir()) == sorted(p.name for p in ddp.iterdir())
    loaded, _ = load_model_and_tokenizer(str(fsdp))  # LoRA: merged into the base it names
    want, _ = load_model_and_tokenizer(str(ddp))
    assert_close(dict(loaded.state_dict()), dict(want.state_dict()), "loaded", TOLERANCE)
    argv = ["eval", "--env", "tool_call", "--model", str(fsdp), "--tasks", "2", "--n", "0",
            "--set", "sampling.max_new_tokens=6", "--output", str(tmp_path / "eval")]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((tmp_path / "eval" / "report.json").read_text())["models"]["model"]


@pytest.mark.slow
def test_an_fsdp_run_resumed_after_step_1_takes_the_uninterrupted_step_2(runs):
    resumed, whole = runs["resumed"] / "checkpoint-000002", runs["fsdp"] / "checkpoint-000002"
    assert_close(_trained(resumed), _trained(whole), "step 2 resumed", 0.0)
    assert_close(_optimizer(resumed), _optimizer(whole), "step 2's optimizer state resumed", 0.0)
    assert _metrics(runs["resumed"]) == _metrics(runs["fsdp"])


@pytest.mark.slow
def test_one_process_resumes_an_fsdp_checkpoint(runs, tmp_path):
    stopped = tmp_path / "one"
    shutil.copytree(runs["fsdp"], stopped)
    shutil.rmtree(stopped / "checkpoint-000002")
    assert main(["train", "--resume", str(stopped / "checkpoint-000001")]) == 0
    got, want = stopped / "checkpoint-000002", runs["fsdp"] / "checkpoint-000002"
    assert_close(_trained(got), _trained(want), "step 2 in one process", TOLERANCE)
    _assert_relatively_close(_optimizer(got), _optimizer(want), "its optimizer state")


@pytest.mark.parametrize(
    ("field", "value"), [("policy.backend", "vllm"), ("distributed.backend", "ray")]
)
def test_fsdp_under_torchrun_refuses_what_it_does_not_run_with(monkeypatch, field, value):
    config = load_config(overrides={"distributed.learner": "fsdp", field: value})
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=rf"{field} must be '\w+' \(got '{value}'\)"):
        preflight.check_torchrun(config)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: the plain learner, nothing to refuse
    preflight.check_torchrun(config)
    monkeypatch.setenv("WORLD_SIZE", "2")
    preflight.check_torchrun(load_config(overrides={field: value}))  # ddp


@pytest.mark.slow
def test_the_whole_pipeline_runs_under_fsdp_and_keeps_the_best_weights(tmp_path):
    out = tmp_path / "run"
    _train(*RUN, *VARIANTS["lora"], "--steps", "3", "--set", "distributed.learner=fsdp",
           "--set", "sft.warmup=true", "--set", "sft.steps=2", "--set", "sft.demonstrations=4",
           "--set", "sft.batch_size=2", "--set", "eval.every=1", "--set", "eval.tasks=2",
           "--set", "eval.report_tasks=2", "--output", str(out))  # fmt: skip
    best = json.loads((out / "checkpoint-best" / "state.json").read_text())["step"]
    kept = _trained(out / "checkpoint-best")
    if best == 0:  # the start (step 0) scored highest: its adapters add nothing (B = 0)
        assert [n for n, t in kept.items() if "lora_B" in n and t.any()] == []
    else:
        assert_close(kept, _trained(out / f"checkpoint-{best:06d}"), "checkpoint-best", 0.0)
    if best != 3:  # the steps moved the weights after the best one
        last = _trained(out / "checkpoint-000003")
        assert _largest_change(_trained(out / "checkpoint-best"), last) > 50 * TOLERANCE
    adapter = json.loads((out / "checkpoint-best" / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "../../checkpoint-sft"  # relative: it travels
    report = json.loads((out / "report" / "report.json").read_text())
    assert list(report["models"]) == ["start", "sft", f"best@{best}"]
