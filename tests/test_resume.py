"""A run that survives: exact resume, SIGTERM, killed checkpoint writes, non-finite steps."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.learn.learner import Learner, lr_factor
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.run.checkpoint import is_complete, latest_checkpoint, prune, read_state
from agentgym.run.interrupt import StopRequest
from agentgym.run.runlog import set_aside

# Rewards that vary within groups under a random model (the share of digits in the reply),
# a cosine schedule after one warm-up step and a beta schedule: every step moves the weights,
# the learning rate and beta, so a resume that lost any of them would show.
RUN = [
    "train", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random",
    "--set", "lora.enabled=true", "--set", "lora.r=4", "--set", "optim.lr=5e-3",
    "--set", "optim.lr_scheduler=cosine", "--set", "optim.warmup_steps=1",
    "--set", "grpo.beta=0.04", "--set", "grpo.beta_start=0.01", "--set", "grpo.beta_warmup_steps=3",
    "--set", "grpo.group_size=4", "--set", "grpo.tasks_per_step=4",
    "--set", "sampling.max_new_tokens=12", "--set", "run.report_to=[]",
    "--set", "run.save_every=2",
]  # fmt: skip
WITH_SFT_AND_EVALS = [
    "--env", "cli_envs:cli_envs/TaughtDigits-v0",
    "--set", "sft.warmup=true", "--set", "sft.steps=2", "--set", "sft.demonstrations=4",
    "--set", "sft.batch_size=2", "--set", "eval.every=2", "--set", "eval.tasks=2",
    "--set", "eval.report_tasks=2", "--set", "eval.n=2",
]  # fmt: skip
TIMING = {"step_seconds", "rollout_seconds", "tokens_per_second"}
STEPS = 4
TESTS = Path(__file__).parent


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def _weights(checkpoint: Path) -> str:
    """The digest of a checkpoint's weight files: equal exactly when every byte is. A digest,
    not the bytes, so that a failing comparison reports in a line: pytest diffs two unequal
    byte strings in full where the `CI` variable is set, for hours at megabytes."""
    files = sorted(checkpoint.glob("*.safetensors"))
    assert files, f"no weights in {checkpoint}"
    return _digest(b"".join(f.read_bytes() for f in files))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _assert_it_trained(run: Path) -> None:
    """Every step had a gradient and moved the learning rate and beta; the weights moved."""
    rows = _metrics(run)
    assert all(r["grad_norm"] > 0 for r in rows), [r["grad_norm"] for r in rows]
    assert all(r["zero_variance_groups"] < 1 for r in rows)
    assert len({r["lr"] for r in rows}) == len(rows)  # warm-up, then the cosine decay
    assert [r["beta"] for r in rows] == pytest.approx([0.01, 0.02, 0.03, 0.04][: len(rows)])
    assert _weights(run / "checkpoint-000002") != _weights(run / f"checkpoint-{STEPS:06d}")


def _stop_after(monkeypatch, steps: int) -> None:
    """SIGTERM to this process as GRPO step `steps` ends: the run checkpoints and stops there."""
    import agentgym.run.train as train_module

    real, calls = train_module.train_step, []

    def train_step(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == steps:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(train_module, "train_step", train_step)


def _split_run(monkeypatch, run: Path, argv: list[str], at: int = 2) -> None:
    """The run of `argv` stopped after step `at`, then resumed from that checkpoint."""
    with monkeypatch.context() as m:
        _stop_after(m, at)
        assert main([*argv, "--output", str(run)]) == 0
    assert latest_checkpoint(run) == run / f"checkpoint-{at:06d}"
    assert main(["train", "--resume", str(run / f"checkpoint-{at:06d}")]) == 0


# LoRA's KL reference is its adapters switched off; a full fine-tune's is a frozen copy of
# the start model, which a resume must load again beside the checkpoint's weights.
TUNING = {"lora": [], "full": ["--set", "lora.enabled=false"]}


@pytest.fixture(scope="module")
def whole_runs(tmp_path_factory):
    """The uninterrupted run of RUN for STEPS steps with `tuning`, made once per module."""
    made: dict[str, Path] = {}

    def whole(tuning: str) -> Path:
        if tuning not in made:
            run = tmp_path_factory.mktemp(f"whole-{tuning}") / "run"
            assert main([*RUN, *TUNING[tuning], "--steps", str(STEPS), "--output", str(run)]) == 0
            _assert_it_trained(run)
            made[tuning] = run
        return made[tuning]

    return whole


@pytest.fixture
def whole_run(whole_runs) -> Path:
    """The uninterrupted LoRA run, shared by the tests that resume it."""
    return whole_runs("lora")


@pytest.mark.parametrize("tuning", sorted(TUNING))
def test_n_steps_then_resume_for_m_more_is_bitwise_one_run_of_n_plus_m(
    tmp_path, whole_runs, monkeypatch, tuning
):
    whole = whole_runs(tuning)
    # the steps after the resume (3, 4) have a live KL term: a lost reference would show
    assert all(r["kl"] > 0 for r in _metrics(whole)[2:]), [r["kl"] for r in _metrics(whole)]
    split = tmp_path / "split"
    _split_run(monkeypatch, split, [*RUN, *TUNING[tuning], "--steps", str(STEPS)])
    _assert_it_trained(split)
    last = f"checkpoint-{STEPS:06d}"
    assert (split / last / "adapter_model.safetensors").is_file() == (tuning == "lora")
    assert _weights(whole / last) == _weights(split / last)
    assert _metrics(whole) == _metrics(split)
    assert [r["step"] for r in _metrics(split)] == [1, 2, 3, 4]


def test_resume_with_sft_and_evals_is_bitwise_one_run_after_the_folder_moved(tmp_path, monkeypatch):
    """Stopped after step 2, the run folder moved elsewhere (its SFT model, the start and KL
    reference, with it), then resumed there: bitwise the run that never stopped."""
    whole, first, split = tmp_path / "whole", tmp_path / "first", tmp_path / "moved" / "split"
    argv = [*RUN, *WITH_SFT_AND_EVALS, "--steps", str(STEPS)]
    assert main([*argv, "--output", str(whole)]) == 0
    with monkeypatch.context() as m:
        _stop_after(m, 2)
        assert main([*argv, "--output", str(first)]) == 0
    split.parent.mkdir()
    shutil.move(first, split)
    assert main(["train", "--resume", str(split / "checkpoint-000002")]) == 0
    _assert_it_trained(split)
    last = f"checkpoint-{STEPS:06d}"
    assert _weights(whole / last) == _weights(split / last)
    assert _metrics(whole) == _metrics(split)
    # GRPO's adapters name the SFT model as their base, so `eval --model` loads them right
    adapter = json.loads(
        (split / "checkpoint-best" / "adapter" / "adapter_config.json").read_text()
    )
    assert adapter["base_model_name_or_path"] == "../../checkpoint-sft"  # relative: it travels
    numbered = json.loads((split / last / "adapter_config.json").read_text())
    assert numbered["base_model_name_or_path"] == "../checkpoint-sft"
    report = json.loads((split / "report" / "report.json").read_text())
    assert list(report["models"])[:2] == ["start", "sft"]  # kept across the resume
    assert report == json.loads((whole / "report" / "report.json").read_text())
    assert (
        not first.exists()
        and str(first) not in (split / "checkpoint-best" / "state.json").read_text()
    )


def test_checkpoint_best_loads_in_plain_transformers_after_the_run_folder_moved(tmp_path):
    """A LoRA run after SFT: checkpoint-best is the merged model (transformers alone loads
    it, from anywhere) with its adapters beside, whose base (../../checkpoint-sft) our loader
    finds where the folder is now; both give the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    argv = [*RUN, *WITH_SFT_AND_EVALS, "--steps", "2", "--set", "eval.every=1"]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 0
    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(tmp_path / "run", moved)
    best = moved / "checkpoint-best"
    model = AutoModelForCausalLM.from_pretrained(best)
    tokenizer = AutoTokenizer.from_pretrained(best)
    ids = tokenizer("2 + 2 =", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)
    adapters, _ = load_model_and_tokenizer(str(best / "adapter"))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, adapters(ids).logits, atol=1e-5)
    state = json.loads((moved / "checkpoint-000002" / "state.json").read_text())
    assert state["start_model"] == "checkpoint-sft"  # relative to the run folder


def _drop_learner_state(part: str):
    """`Learner.load_state_dict` that keeps the fresh learner's own `part` instead."""
    real = Learner.load_state_dict

    def load(self, state):
        real(self, {**state, part: self.state_dict()[part]})

    return load


def _drop_run_rng():
    """`restore` that leaves the run's random stream (tasks, sampling seeds) fresh."""
    from agentgym.run.resume import restore as real

    def restore(state, resume, learner, rng):
        fresh = rng.bit_generator.state
        progress = real(state, resume, learner, rng)
        rng.bit_generator.state = fresh
        return progress

    return restore


@pytest.mark.parametrize("dropped", ["optimizer", "scheduler", "rng"])
def test_a_resume_that_drops_a_state_breaks_equality(tmp_path, whole_run, monkeypatch, dropped):
    """Each state the checkpoint holds is needed: without it, the resumed run differs."""
    import agentgym.run.setup as setup_module

    if dropped == "rng":
        monkeypatch.setattr(setup_module, "restore", _drop_run_rng())
    else:
        monkeypatch.setattr(Learner, "load_state_dict", _drop_learner_state(dropped))
    split = tmp_path / "split"
    _split_run(monkeypatch, split, [*RUN, "--steps", str(STEPS)])
    last = f"checkpoint-{STEPS:06d}"
    assert _weights(whole_run / last) != _weights(split / last)
    assert _metrics(whole_run)[:2] == _metrics(split)[:2]  # the same until the resume
    assert _metrics(whole_run)[2:] != _metrics(split)[2:]


def test_beta_is_the_schedule_s_at_every_step_so_its_stored_value_is_not_needed(
    tmp_path, whole_run, monkeypatch
):
    """The learner's beta is set from `grpo.beta_at(step)` before every step, so a resume that
    drops the stored beta still matches: the schedule's position is the step counter."""
    monkeypatch.setattr(Learner, "load_state_dict", _drop_learner_state("beta"))
    split = tmp_path / "split"
    _split_run(monkeypatch, split, [*RUN, "--steps", str(STEPS)])
    last = f"checkpoint-{STEPS:06d}"
    assert _weights(whole_run / last) == _weights(split / last)
    assert [r["beta"] for r in _metrics(split)] == pytest.approx([0.01, 0.02, 0.03, 0.04])


def test_sigterm_finishes_the_step_checkpoints_exits_0_and_the_resumed_run_matches(tmp_path):
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    argv = [*RUN, "--steps", "8", "--set", "run.save_every=100"]
    pythonpath = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", *argv, "--output", str(stopped)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": pythonpath},
    )  # fmt: skip
    metrics = stopped / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, printed
    checkpoint = latest_checkpoint(stopped)
    assert checkpoint is not None, (printed, sorted(p.name for p in stopped.iterdir()))
    step = read_state(checkpoint)["step"]
    assert 1 <= step < 8, printed  # stopped early, after a whole step, with a checkpoint
    assert "SIGTERM" in printed and f"agentgym train --resume {checkpoint}" in " ".join(
        printed.split()
    )
    assert [r["step"] for r in _metrics(stopped)] == list(range(1, step + 1))
    assert main(["train", "--resume", "auto", "--output", str(stopped), *argv[1:]]) == 0
    assert main([*argv, "--output", str(whole)]) == 0
    rows = _metrics(whole)
    assert all(r["grad_norm"] > 0 for r in rows)
    assert len({r["lr"] for r in rows}) == len(rows)
    assert _weights(whole / "checkpoint-000008") == _weights(stopped / "checkpoint-000008")
    assert _metrics(whole) == _metrics(stopped)


def test_a_second_signal_stops_at_once():
    said, before = [], signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopRequest(said.append) as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.requested == "SIGINT" and "Ctrl-C again" in said[0]
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, before)


KILLED_WRITE = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch
    from agentgym.run.checkpoint import save_best, save_checkpoint
    from agentgym.config import Config
    from agentgym.policy.models import load_model_and_tokenizer

    run, stage = Path(sys.argv[1]), sys.argv[2]
    model, tokenizer = load_model_and_tokenizer("tiny-random")
    config = Config()
    save_checkpoint(run, 1, model, tokenizer, config, trainer={"x": torch.ones(2)})
    save_best(run, 1, model, tokenizer, config)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    if stage == "weights":  # killed while the weights of step 2 are half written
        model.save_pretrained = lambda path, **kw: (Path(path, "model.safetensors")
                                                     .write_bytes(b"half"), die())
        save_checkpoint(run, 2, model, tokenizer, config, trainer={"x": torch.ones(2)})
    else:  # killed after best-000002 was written, before the link moved to it
        os.symlink = die
        Path.symlink_to = die
        save_best(run, 2, model, tokenizer, config)
""")


@pytest.mark.parametrize("stage", ["weights", "link"])
def test_a_checkpoint_write_killed_midway_leaves_the_previous_one_loadable(tmp_path, stage):
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(run), stage],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert latest_checkpoint(run) == run / "checkpoint-000001"
    assert read_state(run / "checkpoint-best")["step"] == 1
    original, _ = load_model_and_tokenizer("tiny-random")
    for folder in (run / "checkpoint-000001", run / "checkpoint-best"):
        loaded, _ = load_model_and_tokenizer(str(folder))
        pairs = zip(original.state_dict().values(), loaded.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs)
    if stage == "weights":
        (leftover,) = run.glob(".checkpoint-000002.*")
        assert not is_complete(leftover)
        with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
            read_state(leftover)
    prune(run, keep=3)  # the next save clears what the killed write left
    assert not list(run.glob(".checkpoint-000002.*"))


def test_checkpoints_keep_the_last_k_and_the_best(tmp_path):
    run = tmp_path / "run"
    argv = [*RUN, *WITH_SFT_AND_EVALS, "--steps", "6", "--set", "run.save_every=1",
            "--set", "run.keep_last=2", "--output", str(run)]  # fmt: skip
    assert main(argv) == 0
    names = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint"))
    best = read_state(run / "checkpoint-best")["step"]
    assert names == sorted(["checkpoint-000005", "checkpoint-000006", "checkpoint-best",
                            f"checkpoint-best-{best:06d}", "checkpoint-sft"])  # fmt: skip
    assert not [p for p in run.iterdir() if p.name.startswith(".")]


def test_resume_refuses_a_folder_without_a_complete_checkpoint(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert "not a complete checkpoint" in capsys.readouterr().err


def test_resume_auto_without_a_checkpoint_starts_afresh(tmp_path):
    run = tmp_path / "run"
    assert main([*RUN, "--steps", "2", "--resume", "auto", "--output", str(run)]) == 0
    assert [r["step"] for r in _metrics(run)] == [1, 2]
    assert not list(run.glob("old-*"))  # nothing earlier: nothing set aside


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): _digest(p.read_bytes())
        for p in folder.rglob("*")
        if p.is_file()
    }


def test_resume_auto_without_a_checkpoint_keeps_the_earlier_start_s_files(tmp_path, monkeypatch,
                                                                         capsys):  # fmt: skip
    import agentgym.run.train as train_module

    real, calls = train_module.train_step, []

    def train_step(*args, **kwargs):  # killed in step 2, before the first checkpoint
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    run = tmp_path / "run"
    argv = [*RUN, "--steps", "2", "--set", "run.log_completions=2", "--resume", "auto"]
    with monkeypatch.context() as m:
        m.setattr(train_module, "train_step", train_step)
        assert main([*argv, "--output", str(run)]) == 130
    assert latest_checkpoint(run) is None and [r["step"] for r in _metrics(run)] == [1]
    earlier = _files(run)
    assert {"metrics.jsonl", "completions.jsonl"} <= earlier.keys()
    capsys.readouterr()
    assert main([*argv, "--output", str(run)]) == 0
    assert f"moved to {run / 'old-1'}" in " ".join(capsys.readouterr().out.split())
    assert _files(run / "old-1") == earlier  # every byte of the earlier start, moved aside
    assert [r["step"] for r in _metrics(run)] == [1, 2]  # the new start's own log


def test_set_aside_moves_to_the_next_free_old_folder_and_leaves_others_alone(tmp_path):
    assert set_aside(tmp_path) is None and not list(tmp_path.iterdir())
    (tmp_path / "mine.yaml").write_text("grpo: {}\n")  # the user's, not the run's
    for attempt in (1, 2):
        (tmp_path / "metrics.jsonl").write_text(f'{{"step": {attempt}}}\n')
        (tmp_path / "tb").mkdir()
        (tmp_path / "tb" / "events").write_text(str(attempt))
        (tmp_path / f"checkpoint-best-{attempt:06d}").mkdir()
        (tmp_path / "checkpoint-best").symlink_to(f"checkpoint-best-{attempt:06d}")
        assert set_aside(tmp_path) == tmp_path / f"old-{attempt}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml", "old-1", "old-2"]
    assert (tmp_path / "old-2" / "metrics.jsonl").read_text() == '{"step": 2}\n'
    assert (tmp_path / "old-1" / "tb" / "events").read_text() == "1"
    assert (tmp_path / "old-1" / "checkpoint-best").resolve().name == "checkpoint-best-000001"


def _inject_inf(monkeypatch, from_call: int) -> list[int]:
    """Makes every learner step from call `from_call` on see an inf gradient; returns the
    optimizer steps taken (AdamW's count) as each call began."""
    taken, real = [], Learner.accumulate

    def accumulate(self, batch):
        states = [s for s in self.optimizer.state.values() if "step" in s]
        taken.append(int(states[0]["step"]) if states else 0)
        totals = real(self, batch)
        if len(taken) >= from_call:
            grad = next(p.grad for p in self.model.parameters() if p.grad is not None)
            grad.view(-1)[0] = float("inf")
        return totals

    monkeypatch.setattr(Learner, "accumulate", accumulate)
    return taken


def test_non_finite_gradients_skip_the_update_count_it_and_stop_after_k(tmp_path, monkeypatch,
                                                                        capsys):  # fmt: skip
    taken = _inject_inf(monkeypatch, from_call=2)
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "6", "--set", "run.max_skipped_steps=3", "--output", str(run)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "3 steps in a row" in err and "run.max_skipped_steps=3" in err
    rows = _metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["skipped"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["train/skipped_steps"] for r in rows] == [0.0, 1.0, 2.0, 3.0]
    assert taken == [0, 1, 1, 1]  # step 1 updated; steps 2, 3, 4 left AdamW untouched


def test_a_skipped_step_then_a_finite_one_resets_the_count(tmp_path, monkeypatch):
    calls, real = [], Learner.accumulate

    def accumulate(self, batch):
        totals = real(self, batch)
        calls.append(1)
        if len(calls) in (2, 4):
            totals = {**totals, "loss/policy": float("nan")}
        return totals

    monkeypatch.setattr(Learner, "accumulate", accumulate)
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "5", "--set", "run.max_skipped_steps=2", "--output", str(run)]
    assert main(argv) == 0
    rows = _metrics(run)
    assert [r["skipped"] for r in rows] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert rows[-1]["train/skipped_steps"] == 2.0


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        # warm-up 2 of 10 steps: 0/2, 1/2, then from done = 2 on, progress (done - 2) / 8
        ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.0, 0.5, 1.0, 0.75, 0.5, 0.0]),  # 1 - progress at done 2, 4, 6, 10
        ("cosine", [0.0, 0.5, 1.0, 0.8535534, 0.5, 0.0]),  # (1 + cos(pi * progress)) / 2
    ],
)
def test_lr_schedules_match_hand_computed_factors(schedule, expected):
    config = load_config(overrides={"optim.lr_scheduler": schedule, "optim.warmup_steps": 2,
                                    "run.steps": 10})  # fmt: skip
    got = [lr_factor(config, done) for done in (0, 1, 2, 4, 6, 10)]
    assert got == pytest.approx(expected, abs=1e-6)
