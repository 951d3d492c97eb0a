"""The run-time failure policy: failed episodes are counted, a run of failed steps stops.

An environment that raises (or hangs) in every episode must not train on advantage 0 to
the end: `run.max_failed_steps` steps in a row with more than `run.max_failed_fraction`
unscorable episodes stop the run with a checkpoint and a TrainingError naming the error.
"""

from __future__ import annotations

import json
import time

import pytest

from agentgym import records
from agentgym.cli import main
from agentgym.config import RunConfig
from agentgym.env.core import make_env
from agentgym.eval.heldout import HeldOut
from agentgym.eval.report import summarize
from agentgym.policy.base import Generation, SamplingParams
from agentgym.rollout.episodes import TaskSpec, collect
from agentgym.run.failures import failed_steps_in_a_row, most_frequent_error, stop_reason
from agentgym.types import Trajectory

ENV = "broken_envs:broken_envs/Broken-v0"
SMALL = ["--model", "tiny-random", "--set", "grpo.group_size=2", "--set",
         "grpo.tasks_per_step=2", "--set", "sampling.max_new_tokens=4", "--set",
         "run.report_to=[]"]  # fmt: skip


class FixedPolicy:
    """Answers every turn with "12" and the stop token."""

    def __init__(self, tokenizer):
        self.ids = (*tokenizer.encode("12", add_special_tokens=False), tokenizer.eos_token_id)

    def generate(self, prompts, params, streams=None):
        return [Generation(self.ids, (-0.5,) * len(self.ids), "stop") for _ in prompts]


def _failed(task_id: str, error: str | None) -> Trajectory:
    return Trajectory(task_id=task_id, group=0, tokens=(1, 2), loss_mask=(0, 1),
                      logprobs=(0.0, -0.5), prompt_length=1, reward=0.0, reward_parts={},
                      turns=(), finish_reason="stop", truncated=False, error=error)  # fmt: skip


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# -- the policy, by hand -------------------------------------------------------


def test_failed_steps_are_counted_in_a_row_from_the_end_of_the_history():
    f = records.FAILED_FRACTION
    history = [{f: 1.0}, {f: 0.25}, {f: 0.75}, {f: 1.0}, {f: 0.5}]
    assert failed_steps_in_a_row(history, 0.5) == 0  # 0.5 is not more than 0.5
    assert failed_steps_in_a_row(history[:4], 0.5) == 2  # 0.25 breaks the run of failures
    assert failed_steps_in_a_row(history[:4], 0.8) == 1
    assert failed_steps_in_a_row([{}, {f: 1.0}], 0.5) == 1  # an older row without the key


def test_the_stop_names_the_most_frequent_error_its_count_and_a_task():
    trajs = [_failed("a", "ValueError: x"), _failed("b", "OSError: y"), _failed("c", None),
             _failed("d", "OSError: y")]  # fmt: skip
    assert most_frequent_error(trajs) == ("OSError: y", 2, "b")
    run = RunConfig(max_failed_steps=2, max_failed_fraction=0.5)
    f = records.FAILED_FRACTION
    assert stop_reason([{f: 0.75}], trajs, run) is None
    reason = stop_reason([{f: 0.75}, {f: 0.75}], trajs, run)
    assert reason is not None
    assert "2 steps in a row" in reason and "3 of 4" in reason
    assert "OSError: y" in reason and "2 times" in reason and "'b'" in reason


# -- episodes ------------------------------------------------------------------


def test_a_reset_that_raises_fails_its_episode_with_no_tokens(tiny):
    _, tokenizer = tiny
    envs = [make_env(ENV, fails="reset") for _ in range(2)]
    trajs = collect(envs, [TaskSpec(seed=3)], 2, FixedPolicy(tokenizer), tokenizer,
                    SamplingParams(max_new_tokens=4))  # fmt: skip
    assert [t.scorable for t in trajs] == [False, False]
    assert trajs[0].error.startswith("OSError: the task store is unreachable")
    assert trajs[0].tokens == () and trajs[0].task_id == "seed=3"


def test_a_step_past_the_timeout_fails_its_episode_and_the_batch_goes_on(tiny):
    _, tokenizer = tiny
    envs = [make_env(ENV, fails="hang", hang_s=15.0), make_env(ENV, fails="none")]
    hung = envs[0]
    started = time.monotonic()
    trajs = collect(envs, [TaskSpec(seed=1)], 2, FixedPolicy(tokenizer), tokenizer,
                    SamplingParams(max_new_tokens=4), env_timeout_s=0.5)  # fmt: skip
    assert time.monotonic() - started < 10
    assert (
        trajs[0].error == "EnvTimeoutError: env.step did not return within 0.5 s "
        "(run.env_step_timeout_s)"
    )
    assert trajs[1].scorable and trajs[1].reward == 1.0
    # the env still running the abandoned step is not played again: a fresh one replaces it
    assert envs[0] is not hung and envs[0].spec.id == "broken_envs/Broken-v0"
    assert envs[0].unwrapped.fails == "hang"


def test_evaluation_reports_unscorable_episodes_apart_from_wrong_answers(tiny):
    model, tokenizer = tiny
    held = HeldOut(ENV, {"fails": "odd"}, ["broken/test/0", "broken/test/1"], tokenizer,
                   max_new_tokens=4)  # fmt: skip
    try:
        results = held.run(FixedPolicy(tokenizer))
    finally:
        held.close()
    figures = summarize(results).greedy
    assert [r.greedy.unscorable for r in results] == [False, True]
    assert figures.unscorable == 0.5
    # task 0's answer "12" is all digits, not a boxed answer: its correctness part is absent,
    # so correctness is over the one scored episode, 0.0, and task 1 is not counted in it
    assert figures.reward_mean == 1.0


# -- whole runs ----------------------------------------------------------------


def test_a_run_whose_env_always_raises_stops_with_a_checkpoint_and_the_error(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--env", ENV, "--steps", "8", "--output", str(out), *SMALL,
                 "--set", "run.max_failed_steps=2", "--set", "run.save_every=100"])  # fmt: skip
    err = capsys.readouterr().err
    print(err)
    assert code == 1
    assert "2 steps in a row had more than run.max_failed_fraction=0.5" in err
    assert "RuntimeError: the tool backend is down" in err and "4 times" in err
    assert "task 'broken/train/" in err
    assert "checkpoint-000002" in err and (out / "checkpoint-000002" / "state.json").is_file()
    assert [r[records.FAILED_FRACTION] for r in _rows(out)] == [1.0, 1.0]


def test_a_run_whose_resets_raise_stops_the_same_way(tmp_path, capsys):
    from agentgym.config import load_config
    from agentgym.run.train import train
    from agentgym.types import TrainingError

    config = load_config(overrides={
        "run.env": ENV, "run.env_kwargs": {"fails": "reset"}, "model.name": "tiny-random",
        "run.steps": 8, "run.max_failed_steps": 3, "run.output": str(tmp_path / "run"),
        "grpo.group_size": 2, "grpo.tasks_per_step": 2, "sampling.max_new_tokens": 4,
        "run.report_to": [],
    })  # fmt: skip
    with pytest.raises(TrainingError, match="OSError: the task store is unreachable") as err:
        train(config)
    assert "3 steps in a row" in str(err.value) and "4 of 4" in str(err.value)
    assert (tmp_path / "run" / "checkpoint-000003").is_dir()


def test_a_run_with_some_failed_episodes_goes_on(tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--env", ENV, "--steps", "3", "--output", str(out), *SMALL,
                 "--set", "run.env_kwargs.fails=odd"])  # fmt: skip
    assert code == 0
    fractions = [r[records.FAILED_FRACTION] for r in _rows(out)]
    assert len(fractions) == 3 and max(fractions) > 0  # failures, but not 3 failed steps


# -- checkpoint-best and the start ---------------------------------------------


@pytest.mark.parametrize(("start", "best"), [(0.5, 0), (0.25, 3), (0.375, 0), (None, 3)])
def test_the_start_is_a_checkpoint_best_candidate(start, best):
    from agentgym.eval.stats import best_step
    from agentgym.run.resume import Progress

    c = records.EVAL_CORRECTNESS
    history = [{"step": 1}, {"step": 2, c: 0.25}, {"step": 3, c: 0.375}]
    selection = None if start is None else {"step": 0, c: start}
    progress = Progress(step=3, history=history, start_selection=selection)
    # ties keep the earliest: a step must score above the start to replace it
    assert best_step(progress.candidates(), c) == best
