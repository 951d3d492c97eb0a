"""ToolCallEnv: reference solutions, matchers, bad calls, sandboxed tools, seeds and splits."""

import gymnasium as gym
import pytest
from episodes import play

import agentgym  # noqa: F401  (registers agentgym/ToolCall-v0)
from agentgym.env.core import resolve_env_id
from agentgym.envs.tool_call import store as store_module
from agentgym.envs.tool_call.calculator import calculate
from agentgym.envs.tool_call.env import ToolCallEnv
from agentgym.envs.tool_call.store import ReadOnlyStore
from agentgym.envs.tool_call.tasks import FAMILIES
from agentgym.tools import HERMES, REACT
from agentgym.types import ToolCall

FORMATS = {"hermes": HERMES, "react": REACT}
BEST_PARTS = {"correctness": 1.0, "tool": 1.0, "format": 0.3}
BEST = 1.0 + 0.5 * 1.0 + 0.1 * 0.3


def _final(fmt, answer):
    return f"So \\boxed{{{answer}}}" if fmt is HERMES else f"Thought: done.\nFinal Answer: {answer}"


def _calls(fmt, calls):
    return [fmt.render_call(c) for c in calls]


@pytest.mark.parametrize("fmt_name", sorted(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_the_reference_solution_scores_the_maximum(family, fmt_name, split):
    fmt = FORMATS[fmt_name]
    env = gym.make("agentgym/ToolCall-v0", tool_format=fmt_name)
    for index in range(3):
        task_id = f"{family}/{split}/{index}"
        env.reset(options={"task_id": task_id})
        calls, answer = env.unwrapped.reference_solution(task_id)
        turns = [*_calls(fmt, calls), _final(fmt, answer)]
        total, parts, (obs, _, terminated, truncated, info) = play(env, turns)
        assert terminated and not truncated and info["correct"], (task_id, info)
        assert parts == pytest.approx(BEST_PARTS) and info["episode_parts"] == BEST_PARTS
        assert total == pytest.approx(BEST)


def test_a_chain_task_expects_sql_then_the_calculator():
    env = ToolCallEnv()
    calls, answer = env.reference_solution("chain/train/0")
    assert [c.name for c in calls] == ["sql", "calculator"]
    assert answer.count(".") == 1 and len(answer.split(".")[1]) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_a_wrong_final_answer_scores_less(family):
    env = ToolCallEnv(families=[family])
    task_id = f"{family}/train/1"
    env.reset(options={"task_id": task_id})
    calls, answer = env.reference_solution(task_id)
    total, parts, (*_, info) = play(env, [*_calls(HERMES, calls), f"\\boxed{{{answer}1}}"])
    assert not info["correct"] and info["final_answer"] == f"{answer}1"
    assert parts == pytest.approx({"correctness": 0.0, "tool": 1.0, "format": 0.3})
    assert total == pytest.approx(0.53) and total < BEST


def test_answering_without_any_tool_call_gives_the_tool_part_minus_one():
    env = ToolCallEnv()
    env.reset(options={"task_id": "calculator/train/0"})
    _, parts, (*_, info) = play(env, [f"\\boxed{{{env.task.answer}}}"])
    assert info["correct"] and parts["tool"] == -1.0


def test_arguments_match_by_value_and_by_result_not_by_spelling():
    env = ToolCallEnv()
    env.reset(options={"task_id": "sql/train/0"})
    (call,), _ = env.reference_solution("sql/train/0")
    respelled = call.arguments["query"].replace("SELECT COUNT(", "select count(", 1)
    _, _, _, _, info = env.step(HERMES.render_call(ToolCall("sql", {"query": respelled})))
    assert info["episode_parts"]["tool"] == 1.0
    env.reset(options={"task_id": "calculator/train/0"})
    expression = env.task.prompt.removeprefix("What is ").rstrip("?")
    _, _, _, _, info = env.step(
        HERMES.render_call(ToolCall("calculator", {"expression": f"0 + ({expression})"}))
    )
    assert info["episode_parts"]["tool"] == 1.0
    env.reset(options={"task_id": "calculator/train/0"})
    _, _, _, _, info = env.step(HERMES.render_call(ToolCall("calculator", {"expression": "1 + 1"})))
    assert info["episode_parts"]["tool"] == 0.5


def test_bad_calls_are_error_observations_and_counts_never_exceptions():
    env = ToolCallEnv()
    env.reset(options={"task_id": "chain/train/0"})
    turn = "\n".join(
        [
            "<tool_call>{'name': 'sql'}</tool_call>",  # invalid JSON
            '<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>',
            '<tool_call>{"name": "calculator", "arguments": {"expression": 12}}</tool_call>',
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}}</tool_call>',
        ]
    )
    obs, reward, terminated, _, info = env.step(turn)
    assert not terminated and info["tool_calls"] == 5
    assert info["tool_errors"] == {
        "invalid_json": 1,
        "unknown_tool": 1,
        "invalid_arguments": 1,
        "tool_raised": 1,
        "too_many_calls": 1,
    }
    assert len(obs) == 5 and all(m["content"].startswith("Error: ") for m in obs)
    assert "division by zero" in obs[3]["content"]


WRITES = [
    "INSERT INTO customers VALUES (999, 'Mallory', 'Nowhere')",
    "UPDATE products SET price = 0",
    "DELETE FROM orders",
    "DROP TABLE orders",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t (x)",
    "ATTACH DATABASE ':memory:' AS other",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "SELECT 1; DELETE FROM orders",
    "BEGIN",
]


def _dump(store):
    return [
        store.rows(f"SELECT * FROM {t}", limit=1000) for t in ("customers", "products", "orders")
    ]


@pytest.mark.parametrize("statement", WRITES)
def test_the_sql_tool_refuses_writes_and_leaves_the_store_unchanged(statement):
    env = ToolCallEnv()
    env.reset(options={"task_id": "sql/train/0"})
    before = _dump(env.store)
    obs, _, _, _, info = env.step(HERMES.render_call(ToolCall("sql", {"query": statement})))
    assert info["tool_errors"] == {"tool_raised": 1}, obs
    assert obs[0]["content"].startswith("Error: ")
    assert _dump(env.store) == before == _dump(ReadOnlyStore(env.seed))


def test_the_sql_tool_stops_a_runaway_query(monkeypatch):
    monkeypatch.setattr(store_module, "TIME_LIMIT_S", 0.05)
    forever = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
    )
    with pytest.raises(ValueError, match="longer than"):
        ReadOnlyStore(0).run(forever)


def test_the_sql_tool_shows_a_compact_table_and_caps_the_rows():
    store = ReadOnlyStore(0)
    assert store.run("SELECT COUNT(*) AS n FROM orders") == "n\n400"
    lines = store.run("SELECT id FROM orders").splitlines()
    assert len(lines) == 1 + store_module.MAX_ROWS + 1 and "more than" in lines[-1]
    assert store.run("SELECT id FROM orders WHERE id < 0") == "id\n(no rows)"


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "x + 1",
        "(1).real",
        "abs(-1)",
        "9 ** 9 ** 9",
        "10 ** 1000",
        "2 ** 0.5",
        "[1][0]",
        "'a' * 3",
    ],
)
def test_the_calculator_refuses_everything_but_arithmetic(expression):
    with pytest.raises(ValueError):
        calculate(expression)


def test_the_calculator_is_exact():
    assert calculate("48213 * 9127 - 3381") == str(48213 * 9127 - 3381)
    assert calculate("1234.56 * 1.085") == "1339.4976"
    assert calculate("-(7 // 2) + 7 % 3 + 2 ** -1") == "-1.5"
    assert calculate("1 / 3") == "0.333333333333"


def test_same_seed_same_task_and_env_seed_sets_the_data():
    a = gym.make("agentgym/ToolCall-v0").reset(seed=11)
    b = gym.make("agentgym/ToolCall-v0").reset(seed=11)
    assert a == b
    mine, theirs = ToolCallEnv(seed=0), ToolCallEnv(seed=1)
    assert mine.load_task("sql/train/0") != theirs.load_task("sql/train/0")
    assert _dump(mine.store) != _dump(theirs.store)


def test_train_and_test_are_disjoint():
    env = ToolCallEnv()
    for family in ("sql", "chain"):
        prompts = {
            split: {
                env.load_task(f"{family}/{split}/{i}").prompt
                for i in range(env._size(family, split))
            }
            for split in ("train", "test")
        }
        assert prompts["train"] and prompts["test"] and not prompts["train"] & prompts["test"]
    test = {env.load_task(f"calculator/test/{i}").prompt for i in range(500)}
    train = {env.load_task(f"calculator/train/{i}").prompt for i in range(5000)}
    assert not train & test


def test_task_ids_interleave_the_families_and_bad_ids_raise():
    env = ToolCallEnv()
    assert [env.task_id("train", i) for i in range(4)] == [
        "calculator/train/0",
        "sql/train/0",
        "chain/train/0",
        "calculator/train/1",
    ]
    for bad in ("calculator/train/100000", "poetry/train/0", "sql/dev/0", "sql"):
        with pytest.raises(KeyError):
            env.load_task(bad)


def test_families_are_validated_and_choose_the_tools():
    with pytest.raises(ValueError, match="calculator.*sql.*chain"):
        ToolCallEnv(families=["calculator", "poetry"])
    obs, info = ToolCallEnv(families=["calculator"]).reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator"]
    assert "orders(" not in obs[0]["content"]
    obs, info = ToolCallEnv(families=["sql"]).reset(seed=0)
    assert [t["function"]["name"] for t in info["tools"]] == ["sql"]
    assert "orders(" in obs[0]["content"] and info["task_id"].startswith("sql/")


def test_running_out_of_turns_truncates_and_keeps_the_parts():
    env = gym.make("agentgym/ToolCall-v0")
    env.reset(options={"task_id": "calculator/test/0"})
    (call,), _ = env.unwrapped.reference_solution("calculator/test/0")
    total, parts, (_, _, terminated, truncated, _) = play(env, [HERMES.render_call(call)] * 6)
    assert truncated and not terminated
    assert parts == pytest.approx({"correctness": 0.0, "tool": 1.0, "format": -0.2})
    assert total == pytest.approx(0.5 - 0.02)


def test_the_short_name_resolves():
    assert resolve_env_id("tool_call") == "agentgym/ToolCall-v0"


def test_the_python_tool_runs_in_the_sandbox(monkeypatch):
    from agentgym.sandboxes import SandboxUnavailableError

    monkeypatch.setenv("HOME_CANARY", "secret")  # must not reach the program

    env = gym.make("agentgym/ToolCall-v0", python=True)
    obs, info = env.reset(options={"task_id": "calculator/train/0"})
    assert "python" in {t["function"]["name"] for t in info["tools"]}
    program = (
        "import socket, os\nprint(6 * 7, 'HOME_CANARY' in os.environ)\n"
        "s = socket.socket()\ntry:\n    s.connect(('1.1.1.1', 53))\nexcept OSError as e:\n"
        "    print('no network')"
    )
    call = HERMES.render_call(ToolCall("python", {"code": program}))
    try:
        obs, *_ = env.step(call)
    except SandboxUnavailableError as err:  # pragma: no cover - only where no sandbox can isolate
        pytest.skip(str(err))
    finally:
        env.close()
    assert "status: ok" in obs[0]["content"]
    assert "42 False" in obs[0]["content"] and "no network" in obs[0]["content"]
