"""The learner under torchrun: two gloo ranks take the step one process takes on the batch."""

from __future__ import annotations

import json
import os
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentgym.scale import ranks

HERE = Path(__file__).parent
WORLD = 2
TOLERANCE = 1e-6
"""For the weights after two steps, and the metrics (relative to those above 1: the
entropy, about 6.4, is a float32 figure good to about 5e-7)."""
GRAD_TOLERANCE = 1e-8
"""For the gradient, whose largest entries are about 1e-3: float32 sums taken in another
order differ by about 1e-9."""

LORA = {"lora.enabled": True, "lora.r": 4}
FSDP = {"distributed.learner": "fsdp"}
CASES = {
    "ddp-lora-grpo": {**LORA, "optim.micro_batch_size": 3},
    "ddp-full-grpo": {"optim.micro_batch_size": 2, "optim.max_grad_norm": 0.005},
    "ddp-lora-dapo": {**LORA, "grpo.loss": "dapo", "optim.micro_batch_size": 3},
    "ddp-full-dapo": {"grpo.loss": "dapo", "optim.micro_batch_size": 3},
    "ddp-full-bnpo": {"grpo.loss": "bnpo", "optim.micro_batch_size": 2},
    "ddp-one-micro-batch": {"optim.micro_batch_size": 8},  # rank 1 has nothing to run
    "fsdp-full-dapo": {**FSDP, "grpo.loss": "dapo", "optim.max_grad_norm": 0.005},
    "fsdp-lora-grpo": {**FSDP, **LORA, "optim.micro_batch_size": 3},  # rank 1 runs an empty one
}
"""Each a learner config: LoRA and full fine-tunes, losses weighted by rows (grpo, bnpo)
and by tokens (dapo), micro-batches that the ranks share unevenly (7 rows), and global
gradient-norm clipping that bites (max_grad_norm below the norm)."""

FOLLOW = "ddp-full-grpo"
"""Also run as in training: rank 0 sharing its batches (`ranks.share_step`), rank 1 in
`ranks.follow`; and with rank 0 releasing rank 1 before it built a learner."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_on_two_ranks(*args: str, timeout: float = 300, **env: str) -> None:
    """Runs `args` (a script and its arguments, or `-m module ...`) under torchrun on WORLD
    gloo ranks of this machine, one thread each, offline, with `env` added; fails the
    test with the output's end if it exits with an error."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}",
               "--master-addr=127.0.0.1", f"--master-port={_free_port()}", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **env}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Every case's results on each of two gloo ranks, from one torchrun launch."""
    out = tmp_path_factory.mktemp("ranks")
    cases = [{"overrides": o} for o in CASES.values()]
    cases += [{"overrides": CASES[FOLLOW], "follow": how} for how in ("steps", "release")]
    run_on_two_ranks(str(HERE / "distributed_step.py"), json.dumps(cases), str(out))
    names = [*CASES, "follow", "release"]
    return {
        name: [torch.load(out / f"case{i}-rank{r}.pt") for r in range(WORLD)]
        for i, name in enumerate(names)
    }


@pytest.fixture(scope="module")
def one_process() -> dict[str, dict]:
    """Every case's results in this process (one thread, as each rank has)."""
    from distributed_step import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: run(overrides) for name, overrides in CASES.items()}
    finally:
        torch.set_num_threads(threads)


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str,
                  tolerance: float = TOLERANCE):  # fmt: skip
    assert got.keys() == want.keys(), what
    worst = max((got[n] - want[n]).abs().max().item() for n in want)
    assert worst <= tolerance, f"{what}: differs by up to {worst:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_take_the_single_process_step(two_ranks, one_process, case):
    single = one_process[case]
    if "optim.max_grad_norm" in CASES[case]:  # the clipping must bite, or it proves nothing
        assert single["metrics"][0]["grad_norm"] > CASES[case]["optim.max_grad_norm"]
    for rank, got in enumerate(two_ranks[case]):
        assert got["world_size"] == WORLD
        # the gradient is summed by torch's own data parallelism: DDP's hooks, or FSDP's
        runner = "FSDP_Root" if case.startswith("fsdp") else "DistributedDataParallel"
        assert got["runner"] == runner
        assert_close(got["grads"], single["grads"], f"rank {rank}'s gradient", GRAD_TOLERANCE)
        for step, (g, s) in enumerate(zip(got["metrics"], single["metrics"], strict=True)):
            assert g.keys() == s.keys()
            for key in s:
                close = abs(g[key] - s[key]) <= TOLERANCE * max(1.0, abs(s[key]))
                assert close, f"rank {rank} step {step} {key}: {g[key]} != {s[key]}"
        assert_close(got["weights"], single["weights"], f"rank {rank}'s weights")


@pytest.mark.slow
def test_the_steps_move_the_weights_well_beyond_the_tolerance(one_process):
    """Else equal weights after two steps would prove nothing."""
    from agentgym.policy.models import load_model_and_tokenizer

    start, _ = load_model_and_tokenizer("tiny-random")
    initial = dict(start.named_parameters())
    trained = one_process["ddp-full-grpo"]["weights"]
    moved = [n for n in trained if (trained[n] - initial[n]).abs().max() > 10 * TOLERANCE]
    assert len(moved) > len(trained) // 2


@pytest.mark.slow
def test_a_follower_steps_on_the_batches_rank_0_shares(two_ranks, one_process):
    leader, follower = two_ranks["follow"]
    assert leader["steps"] == follower["steps"] == 2
    assert leader["built"] == follower["built"] == 1
    single = one_process[FOLLOW]
    for rank, got in enumerate((leader, follower)):
        assert_close(got["weights"], single["weights"], f"rank {rank}'s weights")


@pytest.mark.slow
def test_a_follower_released_before_rank_0_builds_a_learner_builds_none(two_ranks):
    _, follower = two_ranks["release"]
    assert follower["steps"] == 0 and follower["built"] == 0


def test_in_one_process_the_collectives_are_the_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert not ranks.active() and ranks.world_size() == 1 and ranks.rank() == 0 and ranks.is_main()
    assert ranks.init() is False  # no WORLD_SIZE: nothing to join
    ranks.barrier()
    ranks.shutdown()
    payload = {"batch": [1, 2]}
    assert ranks.broadcast_object(payload) is payload
    assert ranks.shard([3, 1, 2]) == [3, 1, 2]
    assert ranks.all_reduce_sum({"kl": 0.5}, ["kl", "entropy"]) == {"kl": 0.5, "entropy": 0.0}
    layer = torch.nn.Linear(2, 2)
    before = [t.clone() for t in layer.parameters()]
    ranks.broadcast_module(layer)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.parameters(), strict=True))


def test_before_init_the_rank_is_torchruns(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert (ranks.world_size(), ranks.rank(), ranks.is_main()) == (2, 1, False)
    assert not ranks.active()
    assert ranks.shard([3, 1, 2]) == [3, 1, 2]  # no group: nothing to share with


def test_python_m_agentgym_runs_the_cli(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["agentgym", "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("agentgym", run_name="__main__")
    assert exited.value.code == 0
    assert "usage: agentgym" in capsys.readouterr().out
