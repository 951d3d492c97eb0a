"""agentgym/ToolTalk-v0: ToolTalk's dialogues replayed and scored as ToolTalk's own code scores
them (the wheel's `ToolExecutor.run_conversation` and `evaluate_predictions`, called here on
the same predictions)."""

from __future__ import annotations

import copy
import json
import random

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentgym  # noqa: F401  (registers the env)
from agentgym.env.checker import check_agent_env

replay = pytest.importorskip("agentgym.envs.tooltalk.replay")
tool_executor = pytest.importorskip("tooltalk.evaluation.tool_executor")

from agentgym.envs.tooltalk.env import ToolTalkEnv  # noqa: E402

ID = "agentgym/ToolTalk-v0"
METRIC_KEYS = (
    "predictions",
    "ground_truths",
    "matches",
    "actions",
    "valid_actions",
    "bad_actions",
    "precision",
    "recall",
    "action_precision",
    "bad_action_rate",
    "success",
    "soft_success",
)


@pytest.fixture(scope="module")
def bench() -> ToolTalkEnv:
    env = gym.make(ID, benchmark=True).unwrapped
    assert isinstance(env, ToolTalkEnv)
    return env


def play(env: ToolTalkEnv, task_id: str, actions: list[str]) -> tuple[float, dict]:
    """Steps `actions` (then empty replies until the end); the summed reward, last info."""
    env.reset(options={"task_id": task_id, "split": "test"})
    total, queue = 0.0, list(actions)
    while True:
        _, reward, terminated, truncated, info = env.step(queue.pop(0) if queue else "ok")
        total += reward
        if terminated or truncated:
            return total, info


def test_counts_splits_and_ids():
    env = gym.make(ID).unwrapped
    counts = {
        (c, s): sum(env.load_task(t).metadata["category"] == c for t in ids)
        for s in ("train", "test")
        for ids in [[env.task_id(s, i) for i in range(env.num_tasks(s))]]
        for c in ("easy", "tooltalk")
    }
    assert counts == {
        ("easy", "train"): 21,
        ("easy", "test"): 7,
        ("tooltalk", "train"): 38,
        ("tooltalk", "test"): 12,
    }
    assert env.task_id("test", 0) == "CompleteReminder-easy"  # 4th easy file, sorted
    easy = gym.make(ID, categories=["easy"], benchmark=True).unwrapped
    assert easy.num_tasks("test") == 28 and easy.task_id("test", 0) == "AddAlarm-easy"
    with pytest.raises(ValueError, match="no train split"):
        easy.reset(seed=0)
    with pytest.raises(ValueError, match="easy, tooltalk"):
        gym.make(ID, categories=["hard"])
    with pytest.raises(KeyError, match="no ToolTalk dialogue 'nope'"):
        easy.load_task("nope")


def test_scoring_names_the_package_and_the_offline_fallback(bench):
    scoring = bench.scoring
    json.dumps(scoring)
    assert scoring["package_version"] == "26.3"
    assert scoring["semantic_match"] == "normalized"
    assert "offline fallback" in scoring["semantic_str_compare"]


def test_every_ground_truth_dialogue_succeeds(bench):
    per_dialogue = []
    for index in range(bench.num_tasks("test")):
        task_id = bench.task_id("test", index)
        bench.reset(options={"task_id": task_id, "split": "test"})
        total, info = play(bench, task_id, bench.demonstration(bench.task))
        assert info["correct"], (task_id, info["tooltalk_metrics"])
        assert total == pytest.approx(1.0 + 0.1 + 0.2)
        per_dialogue.append(info["tooltalk_metrics"])
    aggregate = replay.aggregate(per_dialogue)
    assert aggregate["num_conversations"] == 78
    assert aggregate["success_rate"] == 1.0 and aggregate["precision"] == 1.0


def test_wrong_and_extra_calls_by_hand(bench):
    render = bench.format.render_call
    wrong = render(agentgym.ToolCall("AddAlarm", {"time": "19:00:00"}))
    right = render(agentgym.ToolCall("AddAlarm", {"time": "18:30:00"}))
    find = render(agentgym.ToolCall("FindAlarms", {}))
    # one wrong action that succeeds: nothing matched, a bad action
    total, info = play(bench, "AddAlarm-easy", [wrong, "done"])
    first = m = info["tooltalk_metrics"]
    assert (m["precision"], m["recall"], m["bad_action_rate"], m["success"]) == (0, 0, 1, False)
    assert total == pytest.approx(-0.2)
    # wrong action, right action, a lookup: 1 match of 3 predictions, 1 bad of 2 actions
    total, info = play(bench, "AddAlarm-easy", [wrong, right, find, "done"])
    m = info["tooltalk_metrics"]
    assert (m["predictions"], m["matches"], m["actions"], m["bad_actions"]) == (3, 1, 2, 1)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == 1.0
    assert m["bad_action_rate"] == 0.5 and info["correct"] is False
    assert total == pytest.approx(0.1 / 3 + 0.2 - 0.2 * 0.5)
    # ToolTalk's totals pool the calls: 1 match of 4 predictions, 2 bad of 3 actions
    pooled = replay.aggregate([first, m])
    assert (pooled["precision"], pooled["recall"]) == (0.25, 0.5)
    assert pooled["bad_action_rate"] == pytest.approx(2 / 3) and pooled["success_rate"] == 0
    # an argument named self: ToolTalk's executor raises; here it is the call's exception
    _, info = play(bench, "AddAlarm-easy", [render(agentgym.ToolCall("AddAlarm", {"self": 1}))])
    assert info["tooltalk_metrics"]["predictions"] == 1 and not info["correct"]
    # the lookup only: no action, so not a bad one; recall 0
    _, info = play(bench, "AddAlarm-easy", [find, "done"])
    assert info["tooltalk_metrics"]["bad_action_rate"] == 0 and not info["correct"]


def test_free_text_uses_the_stated_offline_comparison():
    assert replay.normalized_compare("Client  meeting.", "client meeting") == 1.0
    assert replay.normalized_compare("client meetings", "client meeting") == 0.0
    assert replay.normalized_compare(None, "x") == 0.0 and replay.normalized_compare(3, "3") == 0.0
    import tooltalk.apis.calendar as calendar

    assert calendar.semantic_str_compare is replay._dispatch  # the published name, dispatched


# -- agreement with ToolTalk's own replay and evaluation ------------------------------------


def perturb(kind: str, calls: list[dict], rng: random.Random) -> list[dict]:
    """Predicted calls ({"api_name", "parameters"}) for one point from its ground truth."""
    out = [copy.deepcopy(c) for c in calls]
    if kind == "drop" and out:
        out.pop(rng.randrange(len(out)))
    elif kind == "case" and out:
        params = out[0]["parameters"]
        for key, value in params.items():
            if isinstance(value, str) and key != "session_token":
                params[key] = value.upper() if rng.random() < 0.5 else f" {value.lower()}. "
    elif kind == "value" and out:
        params = out[-1]["parameters"]
        keys = [k for k in params if k != "session_token"]
        if keys:
            params[rng.choice(keys)] = "2023-01-01 00:00:00"
    elif kind == "extra":
        out.insert(0, {"api_name": rng.choice(["GetReminders", "AddAlarm"]), "parameters": {}})
        out.append({"api_name": "DeleteAlarm", "parameters": {"alarm_id": "5bff-dd80"}})
    elif kind == "order":
        out.reverse()
    elif kind == "names":
        out.append({"api_name": "NoSuchApi", "parameters": {"x": 1}})
        out.append({"api_name": "QueryUser", "parameters": {"username": 1, "extra": 2}})
        out.append({"api_name": None, "parameters": None})  # a call that cannot be read
    return out


def toolktalk_metrics(dialogue: dict, plan: list[list[dict]]) -> dict:
    """ToolTalk's own run_conversation + evaluate_predictions with a scripted predictor."""
    executor = tool_executor.ToolExecutor(init_database_dir=str(replay.database_dir()))
    points = iter(plan)
    queue: list[dict] = []
    started = [False]

    def predict(metadata: dict, history: list) -> dict:
        if not started[0]:
            queue[:] = next(points)
            started[0] = True
        if not queue:
            started[0] = False
            return {"role": "assistant", "text": "ok"}
        call = queue.pop(0)
        return {"role": "api", "request": {**call, "parameters": copy.deepcopy(call["parameters"])}}

    conversation = executor.run_conversation(copy.deepcopy(dialogue), predict)
    with replay.semantic_mode("normalized"):
        metrics: dict = executor.evaluate_predictions(conversation)["metrics"]
    return metrics


def env_metrics(env: ToolTalkEnv, task_id: str, plan: list[list[dict]]) -> dict:
    env.reset(options={"task_id": task_id, "split": "test"})
    for calls in plan:
        for call in calls:
            if call["parameters"] is None:
                text = "<tool_call>\n{not json</tool_call>"
            else:
                text = env.format.render_call(
                    agentgym.ToolCall(call["api_name"], call["parameters"])
                )
            env.step(text)
        _, _, terminated, _, info = env.step("ok")
    assert terminated
    metrics: dict = info["tooltalk_metrics"]
    return metrics


KINDS = ("none", "drop", "case", "value", "extra", "order", "names")


@pytest.fixture(scope="module")
def roomy() -> ToolTalkEnv:
    """Room for every planned call at a point (the env's own limit is not ToolTalk's)."""
    env = gym.make(ID, benchmark=True, max_steps_per_turn=20).unwrapped
    assert isinstance(env, ToolTalkEnv)
    return env


def agreement(env: ToolTalkEnv, names: list[str], kinds: tuple[str, ...], seed: str) -> int:
    """How many of the dialogues `names`, perturbed point by point with a kind drawn from
    `kinds`, ToolTalk's own replay and evaluation score exactly as the env does."""
    rng = random.Random(seed)
    agree = 0
    for name in names:
        dialogue = env.dialogues[name]
        plan = [
            perturb(
                rng.choice(kinds),
                [dict(a["request"]) for a in dialogue.turns[i].get("apis", [])],
                rng,
            )
            for i in dialogue.points
        ]
        theirs = toolktalk_metrics(dict(dialogue.data), plan)
        ours = env_metrics(env, name, plan)
        same = all(ours[k] == theirs[k] for k in METRIC_KEYS)
        assert same, (name, plan, {k: (ours[k], theirs[k]) for k in METRIC_KEYS})
        agree += same
    return agree


@pytest.mark.parametrize("kind", KINDS)
def test_agreement_with_tooltalks_own_evaluation(roomy, kind):
    """Each kind of perturbation on a seeded third of the dialogues."""
    names = random.Random(kind).sample(sorted(roomy.dialogues), 26)
    assert agreement(roomy, names, (kind,), f"tooltalk-{kind}") == 26


def test_agreement_on_every_dialogue_with_mixed_perturbations(roomy):
    names = list(roomy.dialogues)
    assert agreement(roomy, names, KINDS, "tooltalk-mixed") == len(names) == 78


def test_native_and_react_formats_replay_the_ground_truth():
    for kwargs in (
        {"tool_format": "native", "tool_parser": "llama3_json"},
        {"tool_format": "react"},
    ):
        env = gym.make(ID, benchmark=True, categories=["tooltalk"], **kwargs).unwrapped
        for task_id in ("AccountTools-Alarm-Calendar-AddAlarm-0", env.task_id("test", 49)):
            env.reset(options={"task_id": task_id, "split": "test"})
            _, info = play(env, task_id, env.demonstration(env.task))
            assert info["correct"], (kwargs, task_id)


def test_check_agent_env_passes():
    check_agent_env(gym.make(ID))


TEXT = st.one_of(
    st.text(max_size=200),
    st.builds(
        lambda name, args, tail: (
            f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {args}}}</tool_call>{tail}'
        ),
        st.sampled_from(["AddAlarm", "UserLogin", "SendEmail", "CreateEvent", "x", ""]),
        st.one_of(
            st.just("{}"),
            st.dictionaries(
                st.text(max_size=8),
                st.one_of(st.none(), st.integers(), st.text(max_size=20)),
                max_size=3,
            ).map(json.dumps),
            st.text(max_size=20),
        ),
        st.text(max_size=20),
    ),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(actions=st.lists(TEXT, min_size=1, max_size=6), seed=st.integers(0, 77))
def test_arbitrary_assistant_text_never_crashes(bench, actions, seed):
    bench.reset(options={"task_id": bench.task_id("test", seed), "split": "test"})
    for action in actions:
        obs, reward, terminated, truncated, info = bench.step(action)
        assert isinstance(reward, float) and isinstance(obs, list)
        assert set(info["reward_parts"]) == {
            "correctness",
            "precision",
            "recall",
            "bad_action_rate",
        }
        if terminated:
            break


class ScriptedTurns:
    """A stand-in policy: each prompt gets the next of `turns`, ended with the turn end."""

    def __init__(self, tokenizer, turns: list[str]):
        from agentgym.policy.turn_end import find_turn_end

        self.tokenizer, self.turns = tokenizer, list(turns)
        self.end = list(find_turn_end(tokenizer).ids)

    def generate(self, prompts, params, streams=None):
        from agentgym.policy.base import Generation

        out = []
        for _ in prompts:
            ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False) + self.end
            out.append(Generation(tuple(ids), tuple(-0.5 for _ in ids), "stop"))
        return out


def test_the_rollout_plays_the_ground_truth_in_the_models_native_format(tiny):
    """Through agentgym's rollout with a chat template: native calls, the ground truth's
    assistant turns appended as environment text (loss mask 0), success paid."""
    from agentgym.env.core import make_env
    from agentgym.policy.base import SamplingParams
    from agentgym.rollout.episodes import collect, use_chat_template
    from agentgym.types import TaskSpec

    tokenizer = tiny[1]
    env = make_env(ID, benchmark=True)
    use_chat_template(env, tokenizer)
    task_id = "AccountTools-Alarm-Calendar-AddAlarm-0"
    env.reset(options={"task_id": task_id, "split": "test"})
    assert env.unwrapped.format.name == "native"
    turns = env.unwrapped.demonstration(env.unwrapped.task)
    spec = [TaskSpec(task_id=task_id, split="test")]
    (trajectory,) = collect(
        [env], spec, 1, ScriptedTurns(tokenizer, turns), tokenizer, SamplingParams()
    )
    assert trajectory.error is None and len(trajectory.turn_spans) == len(turns)
    assert trajectory.reward_parts["correctness"] == 1.0
    assert trajectory.reward == pytest.approx(1.3)
    masked = [
        i for i, m in enumerate(trajectory.loss_mask) if m == 0 and i >= trajectory.prompt_length
    ]
    assert "Thanks, I made the account" in tokenizer.decode([trajectory.tokens[i] for i in masked])
