"""MathEnv: rewards on real tasks, disjoint splits, validation, determinism."""

import gymnasium as gym
import pytest

import agentgym  # noqa: F401  (registers agentgym/Math-v0)
from agentgym.envs.math.env import DEFAULT_GENERATORS, GENERATORS, MathEnv


@pytest.fixture
def env():
    return MathEnv(train_size=1000, test_size=300)


def _answer_turn(env, seed, text):
    env.reset(seed=seed)
    return env.step(text.format(answer=env.task.answer))


def test_a_correct_boxed_answer_scores_one_plus_the_format_bonus(env):
    _, reward, terminated, _, info = _answer_turn(env, 0, "Reasoning.\nSo \\boxed{{{answer}}}.")
    assert terminated
    assert info["reward_parts"] == {"correctness": 1.0, "format": 0.3}
    assert reward == pytest.approx(1.0 + 0.1 * 0.3)
    assert info["correct"] and info["format_ok"]


def test_an_equivalent_form_of_the_answer_is_correct(env):
    _, reward, _, _, info = _answer_turn(env, 1, "\\boxed{{{answer}.0}}")
    assert info["correct"], info


def test_a_wrong_boxed_answer_scores_zero_plus_the_format_bonus(env):
    env.reset(seed=2)
    wrong = str(int(env.task.answer) + 1)
    _, reward, _, _, info = env.step(f"I think it is \\boxed{{{wrong}}}")
    assert info["reward_parts"] == {"correctness": 0.0, "format": 0.3}
    assert reward == pytest.approx(0.03)
    assert not info["correct"] and info["expected_answer"] == env.task.answer


def test_no_boxed_answer_scores_minus_one_and_the_format_penalty(env):
    _, reward, _, _, info = _answer_turn(env, 3, "The answer is {answer}.")
    assert info["reward_parts"] == {"correctness": -1.0, "format": -0.2}
    assert reward == pytest.approx(-1.0 - 0.02)
    assert not info["format_ok"]


def test_the_episode_has_one_step_and_no_new_messages(env):
    obs, *_ = _answer_turn(env, 4, "\\boxed{{{answer}}}")
    assert obs == []
    with pytest.raises(RuntimeError):
        env.step("again")


def test_the_prompt_asks_for_a_boxed_answer(env):
    obs, _ = env.reset(seed=5)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert "\\boxed{" in obs[0]["content"]
    assert obs[1]["content"] == env.task.prompt


def test_train_and_test_questions_are_disjoint():
    env = MathEnv(train_size=300, test_size=300)
    test = {env.load_task(env.task_id("test", i)).prompt for i in range(env.num_tasks("test"))}
    train = {env.load_task(env.task_id("train", i)).prompt for i in range(env.num_tasks("train"))}
    assert not train & test


def test_train_questions_that_repeat_a_test_question_are_redrawn():
    # chain_sum's problem space is small: with these sizes some train draws repeat test ones.
    env = MathEnv(generators=["chain_sum"], train_size=3000, test_size=300)
    test = {env.load_task(f"chain_sum/test/{i}").prompt for i in range(300)}
    train = [env.load_task(f"chain_sum/train/{i}").prompt for i in range(3000)]
    assert not set(train) & test


def test_task_ids_interleave_the_generators(env):
    ids = [env.task_id("train", i) for i in range(4)]
    assert ids == [f"{g}/train/0" for g in DEFAULT_GENERATORS] + ["gsm_symbolic/train/1"]
    assert env.num_tasks("test") == 3 * 300


def test_the_same_seed_gives_the_same_task():
    a = gym.make("agentgym/Math-v0").reset(seed=11)
    b = gym.make("agentgym/Math-v0").reset(seed=11)
    assert a == b


def test_a_task_id_gives_the_same_task_in_a_fresh_env(env):
    obs, info = env.reset(seed=12, options={"split": "test"})
    again, _ = MathEnv(train_size=1000, test_size=300).reset(options={"task_id": info["task_id"]})
    assert obs == again


def test_the_env_seed_changes_the_tasks():
    a = MathEnv(seed=0).load_task("chain_sum/train/5")
    b = MathEnv(seed=1).load_task("chain_sum/train/5")
    assert a.prompt != b.prompt


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"generators": ["gsm_symbolic", "nope"]}, "valid: a non-empty subset of .*chain_sum"),
        ({"generators": []}, "generators=\\(\\)"),
        ({"generators": ["chain_sum", "chain_sum"]}, "repeats"),
        ({"train_size": 0}, "train_size=0"),
        ({"test_size": 1.5}, "test_size=1.5"),
        ({"seed": -1}, "seed=-1"),
        ({"render_mode": "human"}, "render_mode='human'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MathEnv(**kwargs)


@pytest.mark.parametrize(
    "task_id",
    [
        "chain_sum/valid/3",
        "products/train/3",  # a generator this env does not use
        "chain_sum/train/1000",
        "chain_sum/train/-1",
        "chain_sum/train",
        "",
    ],
)
def test_unknown_task_ids_raise_key_error_naming_the_form(env, task_id):
    with pytest.raises(KeyError, match="'<generator>/<split>/<index>'") as err:
        env.load_task(task_id)
    assert repr(task_id) in str(err.value)


def test_a_bad_split_is_named(env):
    with pytest.raises(ValueError, match="'split' is 'dev'"):
        env.reset(options={"split": "dev"})


@pytest.mark.parametrize("generator", GENERATORS)
def test_every_supported_generator_judges_its_own_answers(generator):
    env = MathEnv(generators=[generator], train_size=50, test_size=20)
    for seed in range(5):
        _, reward, _, _, info = _answer_turn(env, seed, "\\boxed{{{answer}}}")
        assert info["correct"], (info["task_id"], info["expected_answer"])
