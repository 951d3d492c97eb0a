"""Every registered agentgym environment passes Gymnasium's checker and ours."""

import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym  # noqa: F401  (registers the built-in environments)
from agentgym.env.checker import AgentEnvCheckError, check_agent_env

# OpenEnv-v0 plays a server given by URL: tests/test_openenv.py checks it against one.
# Harbor-v0 plays a task folder in Docker: tests/test_harbor.py checks it on one.
# Verifiers-v0 needs an environment package and is played by its harness, not step():
# tests/test_verifiers.py checks its tasks and seeds against one.
SERVED = {"agentgym/OpenEnv-v0", "agentgym/Harbor-v0", "agentgym/Verifiers-v0"}
ENV_IDS = sorted(id_ for id_ in gym.registry if id_.startswith("agentgym/") and id_ not in SERVED)

# AgentEnv.metadata declares no render_fps; meaningless for text, but Gymnasium warns.
WRAPPED_WARNING = ".*is different from the unwrapped version.*"


def test_registry_holds_the_builtins():
    assert "agentgym/Math-v0" in ENV_IDS


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env_unwrapped(env_id):
    env = gym.make(env_id).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_gymnasium_check_env_wrapped(env_id):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=WRAPPED_WARNING)
        check_env(env)


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("wrapped", [False, True], ids=["unwrapped", "wrapped"])
def test_check_agent_env(env_id, wrapped):
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_agent_env(env if wrapped else env.unwrapped)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_agent_env_renders(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_agent_env(gym.make(env_id, render_mode="ansi"))


class _ToyEnv(agentgym.AgentEnv):
    """Ten tasks per split; the prompt names only the index, so the splits share prompts."""

    def num_tasks(self, split):
        return 10

    def task_id(self, split, index):
        return f"{split}/{index}"

    def load_task(self, task_id):
        return agentgym.Task(task_id, f"prompt {task_id.split('/')[1]}")

    def respond(self, action):
        return agentgym.Feedback((), 0.0, {"correctness": 0.0}, terminated=True)


class _SeedIgnoringEnv(_ToyEnv):
    """Each instance shifts the seeded task by its serial number, so fresh copies disagree."""

    instances = 0

    def __init__(self):
        super().__init__()
        type(self).instances += 1
        self.serial = type(self).instances

    def task_id(self, split, index):
        return f"{split}/{(index + self.serial) % 10}"


def test_check_agent_env_rejects_an_env_that_ignores_the_seed():
    with pytest.raises(AgentEnvCheckError, match="differs between two fresh environments"):
        check_agent_env(_SeedIgnoringEnv(), make_env=_SeedIgnoringEnv)


def test_check_agent_env_rejects_overlapping_splits():
    with pytest.raises(AgentEnvCheckError, match="train prompts are test prompts"):
        check_agent_env(_ToyEnv(), make_env=_ToyEnv)
