"""The benchmark harness (`agentgym eval --benchmark`, `eval.benchmarks`): names parsed or
refused, seeded subsets, figures, the report's record of what scored it, and benchmarks in
the training loop choosing checkpoint-best. The environments here are the tests' own
(`cli_envs.BenchDigitsEnv`); BFCL's, ToolTalk's and τ²'s have their own tests."""

from __future__ import annotations

import json

import cli_envs  # noqa: F401  (registers cli_envs/BenchDigits-v0)
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym.cli import main
from agentgym.eval import benchmarks
from agentgym.eval.benchmarks import (
    BENCHMARKS,
    Benchmark,
    BenchmarkChoice,
    figures,
    parse_benchmark,
    subset,
)
from agentgym.eval.heldout import EpisodeScore, TaskResult

DIGITS = Benchmark(
    "digits",
    "gymnasium",
    {"short": "cli_envs/BenchDigits-v0", "long": "cli_envs/BenchDigits-v0"},
    defaults=("short", "long"),
)


@pytest.fixture
def digits(monkeypatch):
    monkeypatch.setitem(BENCHMARKS, "digits", DIGITS)
    return DIGITS


def test_names_parse_into_benchmark_categories_and_n():
    bfcl = parse_benchmark("bfcl:multi_turn_base@20")
    assert (bfcl.benchmark.name, bfcl.categories, bfcl.n) == ("bfcl", ("multi_turn_base",), 20)
    assert parse_benchmark("tooltalk").categories == ("easy", "tooltalk")
    assert parse_benchmark("tooltalk").n is None
    two = parse_benchmark("bfcl:simple_python,multiple@5")
    assert (
        two.categories == ("simple_python", "multiple")
        and two.label == "bfcl:simple_python,multiple@5"
    )
    assert BENCHMARKS["bfcl"].envs["multi_turn_base"] == "agentgym/BFCLMultiTurn-v0"
    assert BENCHMARKS["bfcl"].envs["simple_python"] == "agentgym/BFCL-v0"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("mmlu", "unknown 'mmlu'; valid: bfcl, tooltalk, tau2"),
        ("bfcl:simple_cobol", "simple_cobol; bfcl's categories: simple_python"),
        ("bfcl:multiple,multiple", "a category named twice"),
        ("tau2@0", "@0 plays nothing"),
        ("tau2@-3", "write NAME[:CATEGORY,...][@N]"),
        ("", "write NAME[:CATEGORY,...][@N]"),
    ],
)
def test_a_bad_name_is_refused_saying_what_is_valid(spec, says):
    with pytest.raises(ValueError, match="benchmark") as err:
        parse_benchmark(spec)
    assert says in str(err.value)


@given(st.text(max_size=40))
def test_any_text_parses_or_is_refused_with_a_value_error(spec):
    try:
        choice = parse_benchmark(spec)
    except ValueError as err:
        assert str(err).startswith(f"benchmark {spec!r}: ")  # names what was written
    else:
        assert isinstance(choice, BenchmarkChoice) and choice.benchmark.name in BENCHMARKS


def test_a_subset_is_seeded_sized_and_in_published_order():
    ids = [f"t{i}" for i in range(30)]
    chosen = subset(ids, 7, "bfcl/simple_python")
    assert len(chosen) == 7 and chosen == sorted(chosen, key=ids.index)
    assert chosen == subset(ids, 7, "bfcl/simple_python")  # the same tasks every time
    assert chosen != subset(ids, 7, "bfcl/multiple")  # each category draws its own
    assert subset(ids, 30, "x") == ids and subset(ids, None, "x") == ids
    assert subset(ids, 99, "x") == ids
    assert len(set(subset(ids, 3, "x"))) == 3  # distinct tasks, none drawn twice


def _result(task, category, correct):
    score = EpisodeScore(1.0, {}, correct, correct, True, None, 1, 0.0, 0.0, 3, False)
    return TaskResult(task, "", score, category=category)


def test_figures_are_per_category_and_the_mean_of_a_benchmarks_categories():
    results = [
        *(_result(f"a{i}", "bfcl/simple_python", c) for i, c in enumerate([1, 0, 1, 1])),
        *(_result(f"b{i}", "bfcl/multiple", c) for i, c in enumerate([0, 1])),
        _result("t0", "tooltalk/easy", 0),
    ]
    assert figures(results) == {
        "bench/bfcl/simple_python/correctness": 0.75,
        "bench/bfcl/multiple/correctness": 0.5,
        "bench/bfcl/correctness": 0.625,  # (0.75 + 0.5) / 2: categories weigh alike
        "bench/tooltalk/easy/correctness": 0.0,
        "bench/tooltalk/correctness": 0.0,
    }


def test_a_plan_plays_n_of_each_category_with_the_benchmarks_own_kwargs(digits):
    (part,) = benchmarks.plan(parse_benchmark("digits@3"))
    assert part.env_id == "cli_envs/BenchDigits-v0"
    assert part.env_kwargs == {"categories": ["short", "long"], "benchmark": True}
    assert [part.categories[t] for t in part.task_ids] == ["short"] * 3 + ["long"] * 3
    assert part.task_ids[:3] == subset([f"short_{i}" for i in range(5)], 3, "digits/short")
    assert part.scoring == {"checker": "digits only", "benchmark": True}
    assert 0 < part.opening_chars < 200 and part.batch == 32  # short openings: 32 at once


@pytest.mark.parametrize(
    ("chars", "batch"), [(0, 32), (3_000, 32), (25_000, 4), (58_000, 2), (500_000, 1)]
)
def test_long_openings_are_played_fewer_at_once(chars, batch):
    """120k characters of openings at once: BFCL multi-turn's (~58k) two, not twenty (17 GB)."""
    part = benchmarks.BenchmarkPart(parse_benchmark("tooltalk"), "x", {}, ["t"], {}, {}, chars)
    assert part.batch == batch


def test_eval_benchmark_reports_each_category_and_what_scored_it(digits, tmp_path):
    out = tmp_path / "report"
    argv = ["eval", "--benchmark", "digits:long@4", "--benchmark", "digits:short"]
    argv += ["--model", "tiny-random", "--output", str(out), "--set=sampling.max_new_tokens=4"]
    argv += ["--set=run.env_kwargs.reward_weights={correctness: 9}"]  # the run's: not read
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    meta = report["meta"]
    assert set(meta["benchmarks"]) == {"digits:long@4", "digits:short"}
    long = meta["benchmarks"]["digits:long@4"]
    assert long["package"] == "gymnasium" and long["n"] == 4 and long["subset_seed"] == 0
    assert long["version"] == __import__("gymnasium").__version__
    env = long["envs"]["cli_envs/BenchDigits-v0"]
    assert env["env_kwargs"] == {"categories": ["long"], "benchmark": True}
    assert env["tasks"] == 4 and env["scoring"]["checker"] == "digits only"
    tasks = report["tasks"]["model"]
    assert [t["category"] for t in tasks] == ["digits/long"] * 4 + ["digits/short"] * 5
    assert {"model / digits/long", "model / digits/short"} <= set(report["models"])
    assert report["models"]["model / digits/long"]["tasks"] == 4
    assert "reward_weights" not in json.dumps(meta)
    # a benchmark's budget, not the run's 4096: ToolTalk's prompt alone is ~7k tokens
    assert meta["max_episode_tokens"] == {"digits:long@4": 16384, "digits:short": 16384}


def test_a_missing_benchmark_or_category_is_refused_before_a_model_loads(tmp_path, capsys):
    argv = ["eval", "--benchmark", "bfcl:simple_cobol", "--model", "tiny-random"]
    assert main([*argv, "--output", str(tmp_path / "r")]) == 2
    message = capsys.readouterr().err
    assert "eval.benchmarks: benchmark 'bfcl:simple_cobol': simple_cobol;" in message
    assert not (tmp_path / "r").exists()


def test_benchmarks_in_the_loop_are_logged_and_choose_checkpoint_best(digits, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--env", "cli_envs:cli_envs/TaughtDigits-v0", "--model", "tiny-random"]
    argv += ["--steps", "2", "--output", str(run)]
    sets = ["grpo.tasks_per_step=2", "grpo.group_size=2", "sampling.max_new_tokens=4"]
    sets += ["run.report_to=[]", "eval.every=1", "eval.tasks=2", "eval.benchmarks=[digits@2]"]
    sets += ["eval.select_by=bench/digits/short/correctness"]
    assert main([*argv, *(f"--set={s}" for s in sets)]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    keys = ("bench/digits/correctness", "bench/digits/short/correctness")
    assert all(k in r for r in rows for k in keys)
    best = max(rows, key=lambda r: (r[keys[1]], -r["step"]))
    state = json.loads((run / "checkpoint-000002" / "state.json").read_text())
    assert state["best_step"] in (0, best["step"])  # the start (step 0) until a step beats it


def test_select_by_must_name_a_figure_the_run_logs(digits, tmp_path, capsys):
    argv = ["train", "--env", "cli_envs:cli_envs/TaughtDigits-v0", "--model", "tiny-random"]
    sets = ["eval.every=1", "eval.tasks=2", "eval.benchmarks=[digits]"]
    sets += ["eval.select_by=bench/digits/huge/correctness"]
    assert main([*argv, "--output", str(tmp_path / "run"), *(f"--set={s}" for s in sets)]) == 2
    message = capsys.readouterr().err
    assert "eval.select_by: 'bench/digits/huge/correctness' is not a held-out figure" in message
    assert "bench/digits/short/correctness" in message
