"""agentgym/Tasks-v0: tasks from data files (every kind), judges, row checks, splits, tools.

Files are written by the tests; nothing downloads. Tools and a judge the env imports by
"module:name" live here (pytest puts tests/ on sys.path, as for `reward_fns_fixture`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers agentgym/Tasks-v0)
from agentgym.env.checker import check_agent_env
from agentgym.env.core import resolve_env_id
from agentgym.envs.tasks.env import TasksEnv, ToolTasksEnv
from agentgym.envs.tasks.judges import make_judge
from agentgym.tools import tool

ROWS = [
    {"prompt": "What is 2 + 2?", "answer": 4, "split": "train"},
    {"prompt": "What is 3 * 5?", "answer": "15", "split": "train"},
    {"prompt": "Half of 1?", "answer": "0.5", "split": "train"},
    {"prompt": "What is 10 - 3?", "answer": 7, "split": "test"},
]
RIGHT, WRONG = 1.0 + 0.1 * 0.3, 0.0 + 0.1 * 0.3  # correctness + 0.1 x format, boxed replies
NO_BOX = -1.0 + 0.1 * -0.2


@tool
def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@tool
def shout(text: str) -> str:
    """Upper-cases text.

    Args:
        text: What to shout.
    """
    return text.upper()


def upper_equal(predicted: str, expected: str) -> bool:
    """A user's judge: equal ignoring case."""
    return predicted.strip().lower() == expected.strip().lower()


def not_a_verdict(predicted: str, expected: str) -> str:
    return "yes"


def _write(path, kind, rows):
    if kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "json":
        path.write_text(json.dumps(rows))
    elif kind == "csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(
            pa.Table.from_pylist([{**r, "answer": str(r["answer"])} for r in rows]), path
        )
    elif kind == "folder":
        import datasets

        datasets.Dataset.from_list([{**r, "answer": str(r["answer"])} for r in rows]).save_to_disk(
            str(path)
        )
    return str(path)


def _make(data, **kwargs):
    return gym.make("agentgym/Tasks-v0", data=data, **kwargs)


def _play(env, task_id, reply):
    env.reset(options={"task_id": task_id})
    return env.step(reply)


# -- each kind of data file -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "folder"])
def test_tasks_come_from_each_kind_of_file(tmp_path, kind):
    name = "data" if kind == "folder" else f"data.{kind}"
    env = _make(_write(tmp_path / name, kind, ROWS), split_column="split")
    assert (env.unwrapped.num_tasks("train"), env.unwrapped.num_tasks("test")) == (3, 1)
    obs, info = env.reset(options={"task_id": "test/3"})
    assert obs[-1] == {"role": "user", "content": "What is 10 - 3?"}
    assert (info["task_id"], info["split"]) == ("test/3", "test")
    _, reward, terminated, _, info = env.step("10 - 3 = 7, so \\boxed{7}")
    assert terminated and info["correct"] and reward == pytest.approx(RIGHT)
    _, reward, _, _, _ = _play(env, "train/2", "\\boxed{\\frac{1}{2}}")
    assert reward == pytest.approx(RIGHT)


def test_json_lines_in_a_json_file_and_blank_lines_are_read(tmp_path):
    path = tmp_path / "d.json"
    path.write_text("\n".join(json.dumps(r) for r in ROWS[:2]) + "\n\n")
    env = _make(str(path))
    assert env.unwrapped.num_tasks("train") + env.unwrapped.num_tasks("test") == 2


def test_a_dataset_dict_folder_gives_its_splits(tmp_path):
    import datasets

    train = datasets.Dataset.from_list([{"prompt": f"q{i}", "answer": str(i)} for i in range(3)])
    test = datasets.Dataset.from_list([{"prompt": "held out", "answer": "9"}])
    datasets.DatasetDict(train=train, test=test).save_to_disk(str(tmp_path / "dd"))
    env = _make(str(tmp_path / "dd"))
    assert env.unwrapped.table.ids == {
        "train": ("train/0", "train/1", "train/2"),
        "test": ("test/0",),
    }
    assert env.unwrapped.load_task("test/0").prompt == "held out"


def test_in_memory_rows_and_a_datasets_dataset_are_data_too():
    import datasets

    for data in (
        ROWS,
        datasets.Dataset.from_list([{**r, "answer": str(r["answer"])} for r in ROWS]),
    ):
        env = _make(data, split_column="split")
        assert env.unwrapped.load_task("train/1").answer == "15"


def test_an_unchanged_file_is_read_once_and_a_changed_one_again(tmp_path):
    path = _write(tmp_path / "d.jsonl", "jsonl", ROWS)
    first, second = _make(path, split_column="split"), _make(path, split_column="split")
    assert first.unwrapped.table is second.unwrapped.table
    _write(tmp_path / "d.jsonl", "jsonl", [{**ROWS[0], "prompt": "What is 1 + 3?"}, *ROWS[1:]])
    os.utime(path, ns=(10**18, 10**18))
    assert (
        _make(path, split_column="split").unwrapped.load_task("train/0").prompt == "What is 1 + 3?"
    )


# -- judges --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("judge", "answer", "right", "wrong"),
    [
        ("math", "0.5", "\\boxed{\\frac{1}{2}}", "\\boxed{0.6}"),
        ("exact", "Paris", "\\boxed{ Paris }", "\\boxed{paris}"),
        ("contains", "Paris", "\\boxed{Paris, France}", "\\boxed{Lyon}"),
        ("regex", "4\\d", "\\boxed{42}", "\\boxed{420}"),
        ("test_tasks_env:upper_equal", "Paris", "\\boxed{PARIS}", "\\boxed{Lyon}"),
    ],
)
def test_each_judge_scores_the_boxed_answer(judge, answer, right, wrong):
    rows = [{"prompt": "the question", "answer": answer}, {"prompt": "another", "answer": answer}]
    env = _make(rows, judge=judge)
    task_id = env.unwrapped.task_id("train", 0)
    for reply, expected_reward, correct in [(right, RIGHT, True), (wrong, WRONG, False)]:
        _, reward, _, _, info = _play(env, task_id, reply)
        assert (reward, info["correct"]) == (pytest.approx(expected_reward), correct), reply
    _, reward, _, _, info = _play(env, task_id, f"the answer is {answer}")
    assert info["reward_parts"] == {"correctness": -1.0, "format": -0.2}
    assert reward == pytest.approx(NO_BOX)


def test_any_of_a_rows_answers_counts():
    rows = [
        {"prompt": "Biggest US city?", "answer": ["New York", "NYC"], "split": "train"},
        {"prompt": "b", "answer": 1, "split": "test"},
    ]
    env = _make(rows, judge="exact", split_column="split")
    _, reward, _, _, info = _play(env, "train/0", "\\boxed{NYC}")
    assert info["correct"] and info["expected_answer"] == "New York"
    assert reward == pytest.approx(RIGHT)


def test_a_judge_that_cannot_be_imported_fails_at_construction():
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        _make(ROWS, judge="no_such_module_xyz:judge")
    with pytest.raises(ValueError, match="has no 'missing'"):
        _make(ROWS, judge="test_tasks_env:missing")
    with pytest.raises(ValueError, match="valid: math, exact, contains, regex"):
        _make(ROWS, judge="fuzzy")


def test_a_judge_that_returns_no_bool_is_an_error_not_a_zero():
    env = _make(ROWS, judge="test_tasks_env:not_a_verdict", split_column="split")
    env.reset(options={"task_id": "test/3"})
    with pytest.raises(TypeError, match="returned 'yes'"):
        env.step("\\boxed{7}")


TEXT = st.text(st.characters(codec="utf-8"), max_size=60)
ANSWER = TEXT.filter(lambda s: s.strip())


@settings(max_examples=200, deadline=None)
@given(predicted=TEXT, expected=ANSWER)
def test_the_text_judges_never_raise_and_accept_their_own_answer(predicted, expected):
    exact, contains, regex = (make_judge(n) for n in ("exact", "contains", "regex"))
    for judge, pattern in [
        (exact, expected),
        (contains, expected),
        (regex, re.escape(expected.strip())),
    ]:
        assert isinstance(judge(predicted, [pattern]), bool)
        assert judge(f"  {expected}\n", [pattern]) is True
    assert contains(f"{predicted}{expected}{predicted}", [expected]) is True


@settings(max_examples=50, deadline=None)
@given(reply=TEXT)
def test_a_reply_of_any_text_is_scored_never_raised_on(reply):
    for judge, answer in [("math", "12"), ("exact", "x"), ("contains", "x"), ("regex", "a+b")]:
        env = _make(
            [{"prompt": "p", "answer": answer}, {"prompt": "q", "answer": answer}], judge=judge
        )
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(reply)
        assert terminated and reward in (
            pytest.approx(RIGHT),
            pytest.approx(WRONG),
            pytest.approx(NO_BOX),
        )


# -- rows that are not tasks -------------------------------------------------------------------


def test_every_malformed_row_is_reported_at_once_by_its_line_and_column(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"prompt": "What is 2 + 2?", "answer": 4}\n'
        "\n"
        '{"prompt": "What is 3 + 3?"\n'
        '{"prompt": "What is 5 + 5?"}\n'
        '["not", "an", "object"]\n'
        '{"prompt": "", "answer": true}\n'
        '{"prompt": [{"role": "assistant", "content": "hi"}], "answer": "x"}\n'
    )
    with pytest.raises(ValueError) as caught:
        _make(str(path))
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{path}: 6 problems:"
    assert lines[1].startswith("  line 3: not JSON")
    assert lines[2] == "  line 4, column 'answer': missing"
    assert lines[3] == "  line 5: a JSON list; valid: an object"
    assert lines[4].startswith("  line 6, column 'prompt': an empty string; valid:")
    assert lines[5].startswith("  line 6, column 'answer': a bool; valid: a string or a number")
    assert lines[6].startswith("  line 7, column 'prompt': the last message is not")


def test_csv_rows_are_reported_by_line_and_other_sources_by_row(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('prompt,answer\n"two\nlines",1\nq,\n')
    with pytest.raises(ValueError, match=r"line 4, column 'answer': empty"):
        _make(str(path))
    with pytest.raises(ValueError, match=r"row 1, column 'split': 'dev'; valid: train, test"):
        _make([ROWS[0], {**ROWS[1], "split": "dev"}], split_column="split")


def test_a_bad_regex_is_reported_with_its_row():
    with pytest.raises(ValueError, match=r"row 1, column 'answer': '\(' is not a valid regular"):
        _make([{"prompt": "a", "answer": "x"}, {"prompt": "b", "answer": "("}], judge="regex")


def test_a_missing_file_an_empty_one_and_an_unknown_kind_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="data file .*nope.jsonl' does not exist"):
        _make(str(tmp_path / "nope.jsonl"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl holds no rows"):
        _make(str(tmp_path / "empty.jsonl"))
    (tmp_path / "d.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"unknown kind of data file '.txt'; valid: .jsonl"):
        _make(str(tmp_path / "d.txt"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="not one saved by datasets' save_to_disk"):
        _make(str(tmp_path / "folder"))


def test_an_unknown_column_lists_the_files_columns_and_any_unreadable_line(tmp_path):
    path = _write(tmp_path / "d.jsonl", "jsonl", ROWS)
    with open(path, "a") as f:
        f.write("not json\n")
    with pytest.raises(ValueError) as caught:
        _make(path, prompt_column="question")
    assert str(caught.value).splitlines() == [
        f"{path}: 2 problems:",
        "  no column prompt_column='question'; its columns: prompt, answer, split",
        "  line 5: not JSON (Expecting value, column 1)",
    ]


def test_options_that_need_tools_are_refused_without_them():
    with pytest.raises(ValueError, match="max_turns=3 apply with tools"):
        _make(ROWS, max_turns=3)
    with pytest.raises(ValueError, match="tools_column='tools' apply with tools"):
        _make(ROWS, tools_column="tools")
    with pytest.raises(ValueError, match="test_fraction=1.5; valid"):
        _make(ROWS, test_fraction=1.5)


# -- splits and task ids -----------------------------------------------------------------------


def _expected_split(prompt, seed=0, fraction=0.1):
    """The documented rule, restated: sha256 of f"{seed}\\n{prompt}", 8 bytes, over 2**64."""
    digest = hashlib.sha256(f"{seed}\n{prompt}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < fraction else "train"


def _splits(env):
    table = env.unwrapped.table
    return {t.prompt: t.metadata["split"] for t in table.tasks.values()}


def test_the_hash_split_follows_the_documented_rule_and_survives_new_and_reordered_rows():
    rows = [{"prompt": f"question {i}", "answer": i} for i in range(300)]
    splits = _splits(_make(rows))
    assert splits == {r["prompt"]: _expected_split(r["prompt"]) for r in rows}
    assert 15 <= list(splits.values()).count("test") <= 45  # ~10% of 300
    more = [{"prompt": f"new question {i}", "answer": i} for i in range(100)]
    reordered = _splits(_make(more[:50] + rows[::-1] + more[50:]))
    assert {p: reordered[p] for p in splits} == splits
    assert _splits(_make(rows, seed=1)) != splits


def test_a_small_file_still_has_a_test_row_and_a_train_row():
    # hashes (seed 0): red 0.473, green 0.758, blue 0.290; none below 0.1, all below 0.9
    rows = [{"prompt": p, "answer": 1} for p in ("red", "green", "blue")]
    assert [_expected_split(p) for p in ("red", "green", "blue")] == ["train"] * 3
    assert _splits(_make(rows)) == {"red": "train", "green": "train", "blue": "test"}
    assert [_expected_split(p, fraction=0.9) for p in ("red", "green", "blue")] == ["test"] * 3
    assert _splits(_make(rows, test_fraction=0.9)) == {
        "red": "test",
        "green": "train",
        "blue": "test",
    }
    with pytest.raises(ValueError, match="1 distinct prompt"):
        _make([{"prompt": "same", "answer": 1}, {"prompt": "same", "answer": 2}])


def test_given_splits_that_share_a_prompt_are_refused():
    rows = [
        {"prompt": "q", "answer": 1, "split": "train"},
        {"prompt": "q", "answer": 1, "split": "test"},
    ]
    with pytest.raises(ValueError, match=r"row 1 \(test\) has the prompt of row 0 \(train\)"):
        _make(rows, split_column="split")


def test_task_ids_name_rows_and_seeds_and_options_pick_tasks():
    env = _make(ROWS, split_column="split")
    assert env.unwrapped.table.ids == {
        "train": ("train/0", "train/1", "train/2"),
        "test": ("test/3",),
    }
    a, b = _make(ROWS, split_column="split"), _make(ROWS, split_column="split")
    assert a.reset(seed=5) == b.reset(seed=5)
    obs, info = a.reset(seed=1, options={"split": "test"})
    assert info["task_id"] == "test/3" and obs[-1]["content"] == "What is 10 - 3?"
    with pytest.raises(KeyError, match="no task 'train/3'"):
        a.reset(options={"task_id": "train/3"})


@pytest.mark.parametrize("with_tools", [False, True], ids=["one_turn", "tools"])
def test_it_passes_gymnasiums_checker_and_ours(tmp_path, with_tools):
    rows = [{"prompt": f"What is {i} + {i}?", "answer": 2 * i} for i in range(30)]
    kwargs = {"tools": ["test_tasks_env:add"], "tool_format": "hermes"} if with_tools else {}
    env = _make(_write(tmp_path / "d.jsonl", "jsonl", rows), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*is different from the unwrapped version.*")
        check_env(env.unwrapped)
        check_env(env)
        check_agent_env(env)
        check_agent_env(_make(rows, render_mode="ansi", **kwargs))


def test_the_short_name_is_tasks_and_the_default_is_the_sample():
    assert resolve_env_id("tasks") == "agentgym/Tasks-v0"
    env = gym.make("agentgym/Tasks-v0")
    assert isinstance(env.unwrapped, TasksEnv)
    assert env.unwrapped.num_tasks("train") + env.unwrapped.num_tasks("test") == 24


# -- prompts as messages, demonstrations -------------------------------------------------------


def test_a_message_prompt_opens_the_episode_after_the_system_prompt():
    shot = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}]
    rows = [
        {"prompt": [*shot, {"role": "user", "content": "2+2?"}], "answer": 4, "split": "train"},
        {
            "prompt": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "3+3?"},
            ],
            "answer": 6,
            "split": "test",
        },
    ]
    env = _make(rows, split_column="split", system_prompt="Box it.")
    obs, _ = env.reset(options={"task_id": "train/0"})
    assert obs == [
        {"role": "system", "content": "Box it."},
        *shot,
        {"role": "user", "content": "2+2?"},
    ]
    obs, _ = env.reset(options={"task_id": "test/1"})
    assert obs == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "3+3?"}]
    assert env.unwrapped.load_task("test/1").prompt == "3+3?"


def test_a_demonstration_is_the_boxed_answer_when_the_judge_takes_it():
    env = _make(ROWS, split_column="split").unwrapped
    assert env.demonstration(env.load_task("train/1")) == ["The answer is \\boxed{15}."]
    regex = _make(
        [{"prompt": "a", "answer": "4\\d"}, {"prompt": "b", "answer": "x"}], judge="regex"
    )
    (task,) = [t for t in regex.unwrapped.table.tasks.values() if t.prompt == "a"]
    with pytest.raises(NotImplementedError, match="judge 'regex' does not accept"):
        regex.unwrapped.demonstration(task)


# -- tools -------------------------------------------------------------------------------------

CALL_ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
CALL_SHOUT = '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
TOOL_ROWS = [
    {
        "prompt": "Add 2 and 3.",
        "answer": 5,
        "tools": ["add"],
        "split": "train",
        "calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}],
    },
    {"prompt": "Shout hi.", "answer": "HI", "tools": None, "split": "test", "calls": None},
]
SCHEMA = {
    "type": "function",
    "fn": "test_tasks_env:upper_equal",
    "function": {
        "name": "same",
        "description": "Compares two strings.",
        "parameters": {
            "type": "object",
            "required": ["predicted", "expected"],
            "properties": {"predicted": {"type": "string"}, "expected": {"type": "string"}},
        },
    },
}


def _tool_env(**kwargs):
    return _make(
        TOOL_ROWS,
        split_column="split",
        tools_column="tools",
        expected_calls_column="calls",
        tool_format="hermes",
        tools=["test_tasks_env:add", shout, SCHEMA],
        **kwargs,
    )


def test_with_tools_a_row_offers_only_its_tools_and_pays_for_its_expected_calls():
    env = _tool_env()
    assert isinstance(env.unwrapped, ToolTasksEnv)
    obs, info = env.reset(options={"task_id": "train/0"})
    assert [t["function"]["name"] for t in info["tools"]] == ["add"]
    assert '"shout"' not in obs[0]["content"] and '"add"' in obs[0]["content"]
    obs, _, _, _, info = env.step(CALL_SHOUT)
    assert info["tool_errors"] == {"unknown_tool": 1}
    obs, _, _, _, _ = env.step(CALL_ADD)
    assert obs == [{"role": "tool", "content": "5", "name": "add"}]
    _, _, terminated, _, info = env.step("So \\boxed{5}")
    assert terminated and info["episode_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}
    _, info = env.reset(options={"task_id": "test/1"})
    assert [t["function"]["name"] for t in info["tools"]] == ["add", "shout", "same"]


def test_with_tools_the_judge_reads_the_final_answer():
    env = _tool_env(judge="exact")
    env.reset(options={"task_id": "test/1"})
    env.step(CALL_SHOUT)
    _, _, _, _, info = env.step("\\boxed{hi}")
    assert not info["correct"] and info["episode_parts"]["correctness"] == 0.0


def test_csv_cells_hold_tools_and_calls_as_json_text(tmp_path):
    calls = [{"name": "add", "arguments": json.dumps({"a": 2, "b": 3})}]  # arguments as text too
    rows = [
        {"prompt": "Add 2 and 3.", "answer": "5", "tools": '["add"]', "calls": json.dumps(calls)},
        {"prompt": "Shout hi.", "answer": "HI", "tools": "", "calls": ""},
    ]
    env = _make(
        _write(tmp_path / "t.csv", "csv", rows),
        tools=[add, shout],
        tools_column="tools",
        expected_calls_column="calls",
        tool_format="hermes",
    )
    (task,) = [t for t in env.unwrapped.table.tasks.values() if t.prompt == "Add 2 and 3."]
    assert task.metadata["tools"] == ("add",)
    assert [(c.name, c.arguments) for c in task.metadata["expected_calls"]] == [
        ("add", {"a": 2, "b": 3})
    ]
    (other,) = [t for t in env.unwrapped.table.tasks.values() if t.prompt == "Shout hi."]
    assert (other.metadata["tools"], other.metadata["expected_calls"]) == (None, ())


def test_rows_naming_unknown_tools_are_reported_with_their_rows():
    rows = [{**TOOL_ROWS[0], "tools": ["ad"]}, {**TOOL_ROWS[1], "calls": [{"name": "shout"}]}]
    with pytest.raises(ValueError) as caught:
        _make(
            rows,
            split_column="split",
            tools_column="tools",
            expected_calls_column="calls",
            tools=[add],
        )
    message = str(caught.value)
    assert "row 0, column 'tools': unknown tool(s) ['ad']; the env's tools: ['add']" in message
    assert "row 1, column 'calls': call(s) of ['shout'], which the row does not offer" in message


def test_a_tool_spec_that_is_not_a_tool_is_refused():
    with pytest.raises(ValueError, match=r"tools\[0\] 'test_tasks_env:ROWS' is a list"):
        _make(ROWS, tools=["test_tasks_env:ROWS"])
    with pytest.raises(ValueError, match=r"tools\[0\]: a schema needs 'fn'"):
        _make(ROWS, tools=[{k: v for k, v in SCHEMA.items() if k != "fn"}])


def test_mcp_tools_join_and_rows_are_checked_against_them_at_the_first_reset():
    pytest.importorskip("mcp", reason="the MCP SDK is not installed")
    import sys

    from test_mcp import SERVER

    spec = {"command": [sys.executable, SERVER, "stdio"], "timeout_s": 5.0}
    rows = [{**TOOL_ROWS[0], "tools": ["add"]}, {**TOOL_ROWS[1], "tools": ["whoami"]}]
    env = _make(rows, split_column="split", tools_column="tools", mcp_servers=[spec])
    try:
        _, info = env.reset(options={"task_id": "test/1"})
        assert [t["function"]["name"] for t in info["tools"]] == ["whoami"]
    finally:
        env.close()
    env = _make(
        [{**rows[0], "tools": ["nothing_here"]}, rows[1]],
        split_column="split",
        tools_column="tools",
        mcp_servers=[spec],
    )
    try:
        with pytest.raises(ValueError, match=r"rows name tools the env lacks: 'nothing_here'"):
            env.reset(seed=0)
    finally:
        env.close()


# -- before a run ------------------------------------------------------------------------------


def _config(tmp_path, data, **more):
    from agentgym.config import load_config

    base = {"model.name": "tiny-random", "run.env": "tasks", "run.output": str(tmp_path / "run")}
    return load_config(overrides={**base, "run.env_kwargs": {"data": data}, **more})


def test_the_preflight_reports_malformed_rows_before_any_model_loads(tmp_path):
    from agentgym.config import ConfigError
    from agentgym.run.preflight import check

    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "q", "answer": 1}\n{"prompt": "r"}\n')
    with pytest.raises(
        ConfigError, match=r"(?s)run.env_kwargs: .*line 2, column 'answer': missing"
    ):
        check(_config(tmp_path, str(path)), "train")


def test_a_five_row_file_passes_the_preflight_with_a_held_out_evaluation(tmp_path):
    from agentgym.run.preflight import check

    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(5)]
    data = _write(tmp_path / "five.jsonl", "jsonl", rows)
    check(_config(tmp_path, data, **{"eval.every": 1, "eval.tasks": 1}), "train")
