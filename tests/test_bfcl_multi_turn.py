"""agentgym/BFCLMultiTurn-v0: BFCL v4's multi-turn entries, run by BFCL's executor, scored by
BFCL's multi-turn checker.

What is compared with the wheel's own code, imported here (its loader `bfcl_eval.utils`
with BFCL_PROJECT_ROOT in a temporary folder, as it makes folders at import; its handler
utilities with the tree-sitter parsers of Java and JavaScript stubbed, here only): the
function docs and their schemas, and BFCL's verdict on perturbed trajectories, decoded as
BFCL's evaluation decodes a function-calling model's output.
"""

from __future__ import annotations

import importlib
import json
import random
import sys
from collections import Counter
from unittest import mock

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the env)
from agentgym.cli import main
from agentgym.env.checker import check_agent_env
from agentgym.types import ToolCall

pytest.importorskip("bfcl_eval", reason="the bfcl extra: make setup installs bfcl-eval")

from agentgym.envs.bfcl_multi import data  # noqa: E402
from agentgym.envs.bfcl_multi.execute import ground_truth_calls  # noqa: E402

ENV_ID = "agentgym/BFCLMultiTurn-v0"
CATEGORIES = (
    "multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context",
)  # fmt: skip
UNSOLVABLE = {
    # The ground truth calls `tail` at turn 1; the entry withholds `tail` until turn 3, so
    # no call of it can run then here. BFCL's executor runs any method of the instances.
    "multi_turn_miss_func_49": "tail",
}
PER_CATEGORY = 10  # ground-truth episodes played per category


@pytest.fixture(scope="module")
def bench():
    return gym.make(ENV_ID, benchmark=True).unwrapped


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel's loader and handler utilities (see the module docstring)."""
    root = tmp_path_factory.mktemp("bfcl_root")
    parsers = ("tree_sitter", "tree_sitter_java", "tree_sitter_javascript")
    stubs = {name: mock.MagicMock() for name in parsers}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BFCL_PROJECT_ROOT", str(root))
        for name, stub in stubs.items():
            patch.setitem(sys.modules, name, stub)
        utils = importlib.import_module("bfcl_eval.utils")
        handler = importlib.import_module("bfcl_eval.model_handler.utils")
        yield utils, handler


def play(env, task_id: str, texts: list[str]) -> tuple[dict, float]:
    """Plays `texts` as the assistant's turns; the last step's info and the summed reward."""
    env.reset(options={"task_id": task_id})
    total, info = 0.0, {}
    for text in texts:
        _, reward, terminated, truncated, info = env.step(text)
        total += reward
        if terminated or truncated:
            break
    return info, total


def hermes(*calls: ToolCall) -> str:
    return "\n".join(
        f"<tool_call>{json.dumps({'name': c.name, 'arguments': dict(c.arguments)})}</tool_call>"
        for c in calls
    )


# --- the published data --------------------------------------------------------------------


def test_every_published_entry_loads_in_order(bench):
    counts = Counter(bench.entry(t).category for t in bench.splits.test)
    assert counts == dict.fromkeys(CATEGORIES, 200)
    assert bench.splits.test[:2] == ("multi_turn_base_0", "multi_turn_base_1")
    assert bench.splits.test[-1] == "multi_turn_long_context_199"
    assert bench.num_tasks("train") == 0
    with pytest.raises(ValueError, match="no train split"):
        bench.reset(seed=0)
    obs, info = bench.reset(seed=3, options={"split": "test"})
    assert info["split"] == "test" and info["category"] in CATEGORIES
    assert obs[-1]["role"] == "user"


def test_functions_and_schemas_are_those_of_bfcl(wheel):
    utils, handler = wheel
    mapping = importlib.import_module("bfcl_eval.constants.type_mappings").GORILLA_TO_OPENAPI
    style = importlib.import_module("bfcl_eval.constants.enums").ModelStyle.OSSMODEL
    docs = {}  # every distinct doc offered, hinted or not, once
    for category in CATEGORIES:
        theirs = utils.load_dataset_entry(category)
        mine = data.load_category(category)
        assert [e["id"] for e in theirs] == [e.task_id for e in mine]
        for their, my in zip(theirs, mine, strict=True):
            assert their["function"] == list(my.functions)
            missed = {int(k): v for k, v in their.get("missed_function", {}).items()}
            assert missed == {k: list(v) for k, v in my.missed.items()}
            for doc in [*my.functions, *(d for added in my.missed.values() for d in added)]:
                docs[json.dumps(doc, sort_keys=True)] = doc
    assert len(docs) > 100
    converted = handler.convert_to_tool(list(docs.values()), mapping, style)
    assert converted == [data.openai_tool(d)["function"] for d in docs.values()]


def test_bad_kwargs_name_what_is_valid():
    with pytest.raises(ValueError, match="valid: distinct names among multi_turn_base"):
        gym.make(ENV_ID, categories=["multi_turn_composite"])
    with pytest.raises(ValueError, match="valid: a non-empty proper subset of"):
        gym.make(ENV_ID, held_out_classes=["NoSuchAPI"])
    with pytest.raises(ValueError, match="max_steps_per_turn"):
        gym.make(ENV_ID, max_steps_per_turn=0)
    env = gym.make(ENV_ID, categories=["multi_turn_base"]).unwrapped
    with pytest.raises(KeyError, match="unknown task id 'multi_turn_miss_func_0'"):
        env.reset(options={"task_id": "multi_turn_miss_func_0"})


def test_splits_are_disjoint_by_api_class():
    env = gym.make(ENV_ID).unwrapped
    held = set(data.DEFAULT_HELD_OUT)
    train = [env.entry(t) for t in env.splits.train]
    test = [env.entry(t) for t in env.splits.test]
    assert (len(train), len(test)) == (4 * 144, 4 * 56)
    assert all(not set(e.classes) & held for e in train)
    assert all(set(e.classes) & held for e in test)
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    trained_tools = {f["name"] for e in train for f in e.functions}
    assert not trained_tools & {f["name"] for c in held for f in data.class_docs(c)}
    _, info = env.reset(seed=0)
    assert info["split"] == "train" and env.task.metadata["category"] in CATEGORIES
    mine = gym.make(ENV_ID, held_out_classes=["TradingBot"]).unwrapped
    assert all("TradingBot" in mine.entry(t).classes for t in mine.splits.test)


def test_scoring_records_the_checker_and_the_package_version():
    env = gym.make(ENV_ID, categories=["multi_turn_base"], benchmark=True).unwrapped
    scoring = json.loads(json.dumps(env.scoring))
    assert scoring["version"] == "2026.3.23"
    assert scoring["checker"].endswith("multi_turn_checker.multi_turn_checker")
    assert scoring["categories"] == ["multi_turn_base"]
    assert scoring["max_steps_per_turn"] == 20 and scoring["split"].startswith("published")


# --- playing ------------------------------------------------------------------------------


def test_the_ground_truth_scores_correctness_1_on_a_seeded_sample(bench):
    rng = random.Random(0)
    for category in CATEGORIES:
        ids = [e.task_id for e in data.load_category(category) if e.task_id not in UNSOLVABLE]
        for task_id in rng.sample(ids, PER_CATEGORY):
            info, total = play(bench, task_id, bench.demonstration(bench.load_task(task_id)))
            assert info["correct"] is True, (task_id, info["bfcl_error_message"])
            assert info["episode_parts"] == {"correctness": 1.0, "tool": 1.0, "format": 0.3}
            assert total == pytest.approx(1.0 + 0.5 + 0.03)


def test_the_one_unsolvable_entry_fails_for_the_stated_reason(bench, wheel):
    ((task_id, function),) = UNSOLVABLE.items()
    info, _ = play(bench, task_id, bench.demonstration(bench.load_task(task_id)))
    assert info["correct"] is False
    entry = bench.entry(task_id)
    assert any(function in call for call in entry.ground_truth[1])
    assert function in [f["name"] for f in entry.missed[3]]


def test_a_wrong_call_sequence_scores_0(bench):
    task_id = "multi_turn_base_0"
    truth = ground_truth_calls(bench.entry(task_id))
    first = truth[0][0]
    wrong = ToolCall(first.name, {k: f"{v}_x" for k, v in first.arguments.items()})
    texts = [hermes(wrong, *truth[0][1:]), "Done."]
    for calls in truth[1:]:
        texts += [hermes(*calls), "Done."] if calls else ["Done."]
    info, _ = play(bench, task_id, texts)
    assert info["correct"] is False
    assert info["bfcl_error_type"] == "multi_turn:instance_state_mismatch"
    info, _ = play(bench, task_id, ["Done."] * len(truth))  # no calls at all
    assert (info["correct"], info["bfcl_error_type"]) == (
        False, "multi_turn:empty_turn_model_response",
    )  # fmt: skip


def test_missed_functions_join_at_their_turn_and_not_before():
    env = gym.make(ENV_ID, categories=["multi_turn_miss_func"], benchmark=True).unwrapped
    task_id = "multi_turn_miss_func_0"
    entry = env.entry(task_id)
    assert {k: [f["name"] for f in v] for k, v in entry.missed.items()} == {3: ["sort"]}
    _, info = env.reset(options={"task_id": task_id})
    assert "sort" not in [t["function"]["name"] for t in info["tools"]]
    _, _, _, _, step = env.step(hermes(ToolCall("sort", {"file_name": "final_report.pdf"})))
    assert step["tool_errors"] == {"unknown_tool": 1}
    for _ in range(3):
        obs, _, _, _, _ = env.step("Done.")
    assert '"name": "sort"' in obs[-1]["content"]
    assert obs[-1]["content"].endswith("What about now?")
    assert "sort" in [t["function"]["name"] for t in env.tools()]


def test_bfcl_s_step_limit_force_quits_the_episode(bench):
    task_id = "multi_turn_base_0"  # GorillaFileSystem and TwitterAPI: `pwd` takes nothing
    bench.reset(options={"task_id": task_id})
    for step in range(21):
        _, _, terminated, _, info = bench.step(hermes(ToolCall("pwd", {})))
        assert terminated is (step == 20)
    assert info["force_quit"] is True and info["correct"] is False
    assert info["bfcl_error_type"] == "multi_turn:force_terminated"


def test_max_turns_cuts_the_episode_uncorrected():
    env = gym.make(ENV_ID, categories=["multi_turn_base"], benchmark=True, max_turns=2)
    env.reset(options={"task_id": "multi_turn_base_0"})  # four user turns
    assert env.step("Done.")[2:4] == (False, False)
    _, _, terminated, truncated, info = env.step("Done.")
    assert (terminated, truncated, info["correct"]) == (False, True, False)


def test_an_episode_s_instances_are_dropped_from_bfcl_s_executor_when_it_ends():
    utils = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils")
    env = gym.make(ENV_ID, categories=["multi_turn_base"], benchmark=True).unwrapped
    env.reset(options={"task_id": "multi_turn_base_0"})
    env.step(hermes(ToolCall("pwd", {})))
    name = env.session.name

    def kept():
        return [k for k in vars(utils) if k.startswith(f"{name}_")]

    assert len(kept()) == 2  # GorillaFileSystem and TwitterAPI
    env.reset(options={"task_id": "multi_turn_base_1"})
    assert kept() == []
    env.close()
    assert env.session is None


def test_argument_names_that_are_code_never_run(bench, tmp_path):
    marker = tmp_path / "ran"
    sneaky = f"folder=__import__('pathlib').Path({str(marker)!r}).touch(),x"
    bench.reset(options={"task_id": "multi_turn_base_0"})
    calls = [ToolCall("cd", {sneaky: 1}), ToolCall("__import__", {"name": "os"})]
    _, _, _, _, info = bench.step(hermes(*calls))
    assert info["tool_errors"] == {"invalid_arguments": 1, "unknown_tool": 1}
    assert not marker.exists()


def test_the_react_format_plays_the_ground_truth():
    env = gym.make(ENV_ID, categories=["multi_turn_miss_param"], benchmark=True,
                   tool_format="react").unwrapped  # fmt: skip
    task_id = "multi_turn_miss_param_7"
    info, _ = play(env, task_id, env.demonstration(env.load_task(task_id)))
    assert info["correct"] is True


# --- agreement with BFCL's own evaluation on perturbed trajectories ------------------------


def perturbations(truth, rng: random.Random) -> dict[str, list[list[ToolCall]]]:
    """The ground truth and kinds of mistakes made of it, per turn."""
    turns = [list(t) for t in truth]
    full = [i for i, t in enumerate(turns) if t]
    out = {"ground_truth": [list(t) for t in turns]}
    drop = [list(t) for t in turns]
    i = rng.choice(full)
    drop[i].pop(rng.randrange(len(drop[i])))
    out["drop"] = drop
    swap = [list(t) for t in turns]
    i = rng.choice(full)
    j = rng.randrange(len(swap[i]))
    args = dict(swap[i][j].arguments)
    keys = list(args)
    if len(keys) >= 2:
        args[keys[0]], args[keys[1]] = args[keys[1]], args[keys[0]]
    elif keys:
        args[keys[0]] = f"{args[keys[0]]}!"
    swap[i][j] = ToolCall(swap[i][j].name, args)
    out["swap_arguments"] = swap
    extra = [list(t) for t in turns]
    i = rng.choice(full)
    extra[i].insert(rng.randrange(len(extra[i]) + 1), rng.choice(extra[i]))
    out["extra_call"] = extra
    late = [list(t) for t in turns]
    i = rng.choice(full[:-1] or full)
    if i + 1 < len(late):
        late[i + 1] = late[i] + late[i + 1]
        late[i] = []
    out["a_turn_late"] = late
    return out


def steps_of(calls: list[ToolCall], rng: random.Random) -> list[list[ToolCall]]:
    """The calls of a turn cut into steps at random points."""
    steps, current = [], []
    for call in calls:
        current.append(call)
        if rng.random() < 0.5:
            steps.append(current)
            current = []
    return [*steps, current] if current else steps


def bfcl_verdict(wheel, entry, turns: list[list[list[ToolCall]]]) -> bool:
    """BFCL's evaluation of a function-calling model that made these calls: each step decoded
    by the handler's `convert_to_function_call`, then `multi_turn_checker`."""
    _, handler = wheel
    checker = importlib.import_module("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    decoded = [
        [handler.convert_to_function_call([{c.name: json.dumps(dict(c.arguments))} for c in s])
         for s in steps]
        for steps in turns
    ]  # fmt: skip
    name = f"test_{entry.task_id}_{random.random():.12f}".replace(".", "_")
    result = checker.multi_turn_checker(
        decoded, [list(t) for t in entry.ground_truth], dict(entry.entry), entry.category, name
    )
    return bool(result["valid"])


def test_verdicts_agree_with_bfcl_s_evaluation_on_perturbed_trajectories(bench, wheel):
    rng = random.Random(7)
    tally: dict[str, Counter] = {}
    for category in CATEGORIES:
        ids = [e.task_id for e in data.load_category(category) if e.task_id not in UNSOLVABLE]
        for task_id in rng.sample(ids, 5):
            entry = bench.entry(task_id)
            for kind, turns in perturbations(ground_truth_calls(entry), rng).items():
                stepped = [steps_of(calls, rng) for calls in turns]
                texts = [hermes(*s) for steps in stepped for s in [*steps, []]]
                texts = [t or "Done." for t in texts]
                info, _ = play(bench, task_id, texts)
                theirs = bfcl_verdict(wheel, entry, stepped)
                count = tally.setdefault(kind, Counter())
                count["played"] += 1
                count["agree"] += info["correct"] is theirs
                count["valid"] += theirs
    print("\nBFCL agreement by perturbation:", {k: dict(v) for k, v in tally.items()})
    assert all(c["agree"] == c["played"] == 20 for c in tally.values())
    assert tally["ground_truth"]["valid"] == 20
    assert all(tally[k]["valid"] < 20 for k in ("drop", "swap_arguments", "a_turn_late"))


# --- the contracts -------------------------------------------------------------------------


def test_check_agent_env_passes():
    check_agent_env(gym.make(ENV_ID, categories=["multi_turn_base"]))


def call_texts():
    names = sorted({f["name"] for c in data.classes_published() for f in data.class_docs(c)})
    leaves = (
        st.none() | st.booleans() | st.integers(-1000, 1000)
        | st.floats(-1e6, 1e6, allow_nan=False) | st.text(max_size=12)
    )  # fmt: skip
    values = st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=5,
    )  # fmt: skip
    call = st.fixed_dictionaries({
        "name": st.sampled_from([*names, "__import__", "open", "exit", ""]),
        "arguments": st.dictionaries(st.text(max_size=10), values, max_size=3),
    })  # fmt: skip
    return st.lists(call, min_size=1, max_size=3).map(
        lambda cs: "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in cs)
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(st.text(max_size=80) | call_texts(), min_size=1, max_size=8))
def test_arbitrary_assistant_text_never_crashes_the_env(bench, texts):
    bench.reset(options={"task_id": "multi_turn_base_105"})
    for text in texts:
        obs, reward, terminated, truncated, info = bench.step(text)
        assert isinstance(reward, float) and isinstance(obs, list)
        if terminated:
            assert isinstance(info["correct"], bool)
            break


# --- training -----------------------------------------------------------------------------


@pytest.mark.slow
def test_train_two_steps_on_tiny_random(tmp_path):
    # one API class in train (its tools alone make a 12k-token prompt for the tiny tokenizer)
    others = [c for c in data.classes_published() if c != "TradingBot"]
    sets = [
        "grpo.tasks_per_step=1", "grpo.group_size=2", "sampling.max_new_tokens=4",
        "grpo.beta=0", "run.report_to=[]", "run.env_kwargs.categories=[multi_turn_base]",
        "run.env_kwargs.max_turns=1", f"run.env_kwargs.held_out_classes=[{','.join(others)}]",
    ]  # fmt: skip
    run = tmp_path / "run"
    argv = ["train", "--env", ENV_ID, "--model", "tiny-random", "--steps", "2"]
    assert main([*argv, "--output", str(run), *(f"--set={s}" for s in sets)]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["failures/fraction"] == 0 for r in rows)
    episodes = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert episodes and all(e["task_id"].startswith("multi_turn_base_") for e in episodes)
