"""Held-out evaluation: answers, figures by hand, greedy decoding, reports, the eval command."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentgym.cli import main
from agentgym.config import load_config
from agentgym.eval.heldout import EpisodeScore, HeldOut, TaskResult, final_answer, held_out_ids
from agentgym.eval.report import compare, summarize
from agentgym.policy.base import Generation, SamplingParams, context_tokens
from agentgym.policy.hf import HFPolicy

TINY_EVAL = ["--model", "tiny-random", "--tasks", "3", "--n", "2", "--k", "2",
             "--set", "sampling.max_new_tokens=8"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so it is \\boxed{42}.", "42"),
        ("Thought: done\nFinal Answer: 3.5", "3.5"),
        ("The total is 1,234 and then 5,678.", "5678"),
        ("no number here", None),
        ("\\boxed{1/2} or 7", "1/2"),
    ],
)
def test_final_answer_takes_the_boxed_then_stated_then_last_number(text, answer):
    assert final_answer(text) == answer


def _score(strict: bool, lenient: bool, answer: str | None, **kw) -> EpisodeScore:
    base = dict(reward=1.0 if strict else 0.0, parts={"correctness": float(strict),
                "format": 0.3 if strict else -0.2}, format_ok=strict, turns=2,
                tool_calls=1.0, tool_errors=0.0, completion_length=10, truncated=False)  # fmt: skip
    base.update(kw)
    return EpisodeScore(strict=strict, lenient=lenient, answer=answer, **base)


def test_summarize_matches_hand_computed_figures():
    right, wrong = _score(True, True, "7"), _score(False, False, "8", tool_errors=1.0)
    lenient_only = _score(False, True, "7.0", turns=1, completion_length=40)
    results = [
        TaskResult("a", "7", right, [right, wrong, wrong, right]),  # c = 2 of n = 4
        TaskResult("b", "7", wrong, [wrong, wrong, wrong, wrong]),  # c = 0
        TaskResult("c", "7", lenient_only, [lenient_only, lenient_only, wrong, right]),  # c = 1
    ]
    report = summarize(results, k=2)
    greedy = report["greedy"]
    assert greedy["correctness_strict"] == pytest.approx(1 / 3)
    assert greedy["correctness_lenient"] == pytest.approx(2 / 3)
    assert greedy["format_accuracy"] == pytest.approx(1 / 3)
    assert greedy["turns"] == pytest.approx(5 / 3)
    assert greedy["completion_length"] == pytest.approx(20.0)
    assert greedy["tool_error_rate"] == pytest.approx(1 / 3)  # 1 error in 3 calls
    assert greedy["reward_parts"]["format"] == pytest.approx((0.3 - 0.2 - 0.2) / 3)
    sampled = report["sampled"]
    assert report["n"] == 4 and report["k"] == 2
    # pass@1 = mean(c / n) = (2/4 + 0 + 1/4) / 3
    assert sampled["pass@1"] == pytest.approx(0.25)
    # pass@2 = 1 - C(n-c, 2) / C(4, 2): task a 1 - 1/6, task b 0, task c 1 - 3/6
    assert sampled["pass@2"] == pytest.approx((5 / 6 + 0 + 0.5) / 3)
    # maj@2 over the first two answers: a: "7" vs "8" tie -> first ("7", right);
    # b: "8","8" wrong; c: "7.0","7.0" are equivalent to 7 -> right
    assert sampled["maj@2"] == pytest.approx(2 / 3)


def test_summarize_without_samples_reports_greedy_only_and_checks_k():
    results = [TaskResult("a", "1", _score(True, True, "1"))]
    assert set(summarize(results)) == {"tasks", "greedy"}
    with pytest.raises(ValueError, match="k=3"):
        summarize([TaskResult("a", "1", _score(True, True, "1"), [_score(True, True, "1")])], k=3)


def test_compare_pairs_tasks_and_refuses_different_ones():
    good = [TaskResult(str(i), "1", _score(True, True, "1")) for i in range(10)]
    bad = [TaskResult(str(i), "1", _score(i < 5, i < 5, "1")) for i in range(10)]
    c = compare(good, bad)
    assert c["correctness_strict"]["diff"] == pytest.approx(0.5)
    assert c["correctness_strict"]["low"] > 0.1
    with pytest.raises(ValueError, match="same tasks"):
        compare(good, list(reversed(bad)))


def test_temperature_zero_decodes_the_argmax_every_time(tiny):
    model, tokenizer = tiny
    policy = HFPolicy(model, tokenizer)
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    params = SamplingParams(max_new_tokens=6, temperature=0.0, seed=1)
    first = policy.generate([prompt], params)[0]
    again = policy.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0, seed=2))
    assert first.ids == again[0].ids
    ids = list(prompt)
    with torch.no_grad():
        for token, logp in zip(first.ids, first.logprobs, strict=True):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            assert token == int(logits.argmax())
            assert logp == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)
            ids.append(token)


def test_sampled_episodes_do_not_depend_on_how_the_tasks_are_batched(tiny):
    """Each held-out episode draws from its own stream (seed, task, member, turn), so two
    models compared on a task see the same random numbers, chunked however."""
    model, tokenizer = tiny
    kwargs = {"families": ["calculator"], "max_turns": 2}
    ids = held_out_ids("tool_call", kwargs, 3)
    runs = []
    for batch in (2, 32):
        held = HeldOut("tool_call", kwargs, ids, tokenizer, max_new_tokens=6, n=2, batch=batch)
        try:
            runs.append(held.run(HFPolicy(model, tokenizer), seed=4))
        finally:
            held.close()
    small, large = ([[s.answer, s.completion_length] for r in run for s in r.samples]
                    for run in runs)  # fmt: skip
    assert small == large
    assert len({tuple(x) for x in small}) > 1  # and the samples do differ


def test_an_episode_never_runs_past_the_models_context(tiny, monkeypatch):
    """The budget is `max_episode_tokens` capped at the model's positions; an opening the
    model cannot hold is played and failed (truncated, no token sampled), not unscorable."""
    model, tokenizer = tiny
    policy, context = HFPolicy(model, tokenizer), model.config.max_position_embeddings
    assert context_tokens(policy) == context == 2048
    assert context_tokens(type("Engine", (), {"max_model_len": 300})()) == 300
    assert context_tokens(type("Plain", (), {"generate": None})()) is None
    kwargs = {"families": ["calculator"], "max_turns": 2}
    ids = held_out_ids("tool_call", kwargs, 2)
    for budget, expected in ((None, 2048), (4096, 2048), (64, 64)):
        held = HeldOut("tool_call", kwargs, ids, tokenizer, max_new_tokens=6,
                       max_episode_tokens=budget)  # fmt: skip
        try:
            assert held.budget(policy) == expected
        finally:
            held.close()
    monkeypatch.setattr(model.config, "max_position_embeddings", 50)
    held = HeldOut("tool_call", kwargs, ids, tokenizer, max_new_tokens=6, max_episode_tokens=4096)
    try:
        results = held.run(HFPolicy(model, tokenizer))
    finally:
        held.close()
    scores = [r.greedy for r in results]
    assert [(s.truncated, s.unscorable, s.completion_length, s.strict) for s in scores] == [
        (True, False, 0, False)
    ] * 2


def test_eval_on_tiny_random_writes_the_three_report_files_with_the_documented_keys(
    tmp_path, capsys
):
    out = tmp_path / "report"
    argv = ["eval", "--env", "tool_call", *TINY_EVAL, "--baseline", "tiny-random"]
    assert main([*argv, "--output", str(out)]) == 0
    report_files = {"report.json", "report.md", "report.png"}
    episodes = {"episodes-model.npz", "episodes-baseline.npz"}  # eval.save_episodes: all
    assert {p.name for p in out.iterdir()} == report_files | episodes
    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"meta", "models", "comparisons", "tasks"}
    assert set(report["models"]) == {"model", "baseline"}
    model = report["models"]["model"]
    assert model["tasks"] == 3 and model["n"] == 2 and model["k"] == 2
    assert set(model["greedy"]) >= {
        "correctness_strict", "correctness_lenient", "format_accuracy", "reward_mean",
        "reward_parts", "turns", "tool_calls", "tool_error_rate", "completion_length",
    }  # fmt: skip
    assert set(model["sampled"]) >= {"pass@1", "pass@2", "maj@2", "correctness_strict"}
    same = report["comparisons"]["model - baseline"]["correctness_strict"]
    assert same == {"diff": 0.0, "low": 0.0, "high": 0.0}  # the same greedy model twice
    tasks = report["tasks"]["model"]
    assert [t["task_id"] for t in tasks] == [t["task_id"] for t in report["tasks"]["baseline"]]
    assert all(len(t["samples"]) == 2 for t in tasks)
    assert all(math.isfinite(t["greedy"]["reward"]) for t in tasks)
    md = (out / "report.md").read_text()
    assert "| model |" in md and "model - baseline" in md
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "held-out evaluation" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--n", "2", "--k", "3"], "1 <= k <= n"),
        (["--set", "eval.tasks=0"], "eval.tasks"),
        (["--env", "nope"], "nope"),
    ],
)
def test_eval_refuses_bad_input_before_loading_a_model(tmp_path, capsys, extra, needle):
    argv = ["eval", "--env", "math", "--model", "tiny-random", "--output", str(tmp_path / "r")]
    assert main([*argv, *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_compare_adds_sampled_pass_at_1_when_both_models_sampled():
    right, wrong = _score(True, True, "1"), _score(False, False, "2")
    model = [TaskResult(str(i), "1", right, [right, right, wrong, right]) for i in range(6)]
    base = [TaskResult(str(i), "1", right, [wrong, wrong, wrong, right]) for i in range(6)]
    c = compare(model, base)
    assert c["pass@1"]["diff"] == pytest.approx(0.75 - 0.25)
    assert c["pass@1"]["low"] == pytest.approx(0.5) and c["pass@1"]["high"] == pytest.approx(0.5)
    assert c["correctness_strict"]["diff"] == 0.0
    assert "pass@1" not in compare([TaskResult("0", "1", right)], [TaskResult("0", "1", right)])


class RecordingFakePolicy:
    """A fake policy: answers every turn with `\\boxed{0}` and the stop token, and records
    the SamplingParams of each call."""

    def __init__(self, tokenizer):
        answer = tokenizer.encode("\\boxed{0}", add_special_tokens=False)
        self.ids = (*answer, tokenizer.eos_token_id)
        self.params: list[SamplingParams] = []

    def generate(self, prompts, params, streams=None):
        self.params.append(params)
        return [Generation(self.ids, (-0.5,) * len(self.ids), "stop") for _ in prompts]


def test_sampled_episodes_take_the_runs_top_p_and_the_greedy_one_does_not(tiny):
    _, tokenizer = tiny
    overrides = {
        "run.env": "math",
        "eval.max_new_tokens": 5,
        "sampling.temperature": 0.9,
        "sampling.top_p": 0.7,
    }
    config = load_config(overrides=overrides)
    held = HeldOut.from_config(config, held_out_ids("math", {}, 2), tokenizer, n=3)
    policy = RecordingFakePolicy(tokenizer)
    try:
        results = held.run(policy, seed=4)
    finally:
        held.close()
    assert [len(r.samples) for r in results] == [3, 3]
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=5, temperature=0.9, top_p=0.7, seed=4)
    assert set(policy.params) == {greedy, sampled}
    assert policy.params[0] == greedy  # the greedy pass first, at top_p 1.0


def test_the_tables_title_names_its_split_and_its_samples():
    from types import SimpleNamespace

    from agentgym.eval.console import table_title

    test = SimpleNamespace(meta={"split": "test", "n": 4})
    assert table_title(test, sampled=True) == (
        "held-out evaluation (test split): greedy, then pass@k and maj@k of 4 samples a task"
    )
    train = SimpleNamespace(meta={"split": "train", "n": 0})
    assert table_title(train, sampled=False) == "evaluation (train split): greedy"


def test_lenient_is_strict_for_a_task_its_calls_alone_judge():
    from types import SimpleNamespace

    from agentgym.eval.heldout import EpisodeScore

    def episode(correct: float, text: str):
        return SimpleNamespace(turns=[SimpleNamespace(action=text)], reward=correct,
                               reward_parts={"correctness": correct}, counts={},
                               completion_length=3, truncated=False, scorable=True)  # fmt: skip

    # an irrelevance row: nothing called is right, and no answer is there to find
    assert EpisodeScore.of(episode(1.0, "I cannot help with that."), None).lenient is True
    assert EpisodeScore.of(episode(0.0, "<tool_call>{}</tool_call>"), None).lenient is False
    # a task with an answer: lenient finds it in the wrong format
    assert EpisodeScore.of(episode(0.0, "it is 42"), "42").lenient is True
