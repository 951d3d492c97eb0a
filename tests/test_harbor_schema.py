"""Harbor task folders read by agentgym itself (harbor needs Python 3.12): task.toml against
harbor 0.25.0's published models, the reward files, the splits, the Dockerfile's base
images. No Docker here; tests/test_harbor.py plays the tasks in containers."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym.envs.harbor.container import base_images, environment_hash
from agentgym.envs.harbor.reward import REWARD_JSON, REWARD_TXT, read_reward
from agentgym.envs.harbor.schema import (
    AGENT,
    ENVIRONMENT,
    MCP_SERVER,
    PACKAGE,
    STEP,
    TASK_TOML,
    VERIFIER,
    HarborTaskError,
    ListOf,
    Table,
    check_task_toml,
)
from agentgym.envs.harbor.tasks import read_task, read_tasks, split_tasks

HERE = Path(__file__).parent
TASKS = HERE / "harbor_tasks"
PUBLISHED = json.loads((HERE / "fixtures" / "harbor_task_schema.json").read_text())
LEGACY = {"TaskConfig": {"version"}, "EnvironmentConfig": {"memory", "storage"}}
"""Keys harbor's models take before validation and rename (its `mode="before"` hooks)."""

OURS = {
    "TaskConfig": TASK_TOML,
    "EnvironmentConfig": ENVIRONMENT,
    "AgentConfig": AGENT,
    "VerifierConfig": VERIFIER,
    "PackageInfo": PACKAGE,
    "StepConfig": STEP,
    "MCPServerConfig": MCP_SERVER,
    "HealthcheckConfig": ENVIRONMENT.fields["healthcheck"],
    "TpuSpec": ENVIRONMENT.fields["tpu"],
    "SolutionConfig": TASK_TOML.fields["solution"],
    "ArtifactConfig": STEP.fields["artifacts"].item,  # type: ignore[union-attr]
    "VerifierCollectConfig": VERIFIER.fields["collect"].item,  # type: ignore[union-attr]
    "Author": PACKAGE.fields["authors"].item,  # type: ignore[union-attr]
}
# How harbor's annotations read in our kinds (Optional left out: a TOML key is present or not).
KINDS = {
    "str": "str",
    "float": "number",
    "int | float": "number",
    "int": "int",
    "bool": "bool",
    "str | int": "str|int",
    "list[str]": "list[str]",
    "dict[str, str]": "table[str]",
    "float | dict[str, float]": "number|table[number]",
}


def test_the_published_schema_is_harbor_0_25_0s():
    assert PUBLISHED["source"] == "harbor-0.25.0-py3-none-any.whl:harbor/models/task/config.py"
    assert set(OURS) <= set(PUBLISHED["models"])


@pytest.mark.parametrize("model", sorted(OURS))
def test_each_table_has_exactly_harbors_fields(model):
    table = OURS[model]
    assert isinstance(table, Table)
    published = PUBLISHED["models"][model]
    assert set(table.fields) - LEGACY.get(model, set()) == set(published)


@pytest.mark.parametrize("model", sorted(OURS))
def test_each_field_takes_the_kind_harbor_annotates(model):
    table = OURS[model]
    assert isinstance(table, Table)
    enums = PUBLISHED["enums"]
    for name, annotation in PUBLISHED["models"][model].items():
        kind, bare = table.fields[name], annotation.removesuffix(" | None")
        if bare in enums:
            assert kind == tuple(enums[bare]), (model, name)
        elif bare.startswith("list[") and bare != "list[str]":
            assert isinstance(kind, ListOf), (model, name)
            assert kind.strings == bare.startswith("list[str |"), (model, name)
        elif bare in KINDS:
            assert kind == KINDS[bare], (model, name, annotation)
        elif bare == "MCPTransport":
            assert set(kind) >= {"stdio", "sse", "streamable-http"}
        else:  # a nested model, or metadata's dict[str, Any]
            assert isinstance(kind, Table), (model, name, annotation)


def test_the_test_tasks_read_and_validate():
    tasks = read_tasks(TASKS)
    assert [t.task_id for t in tasks] == ["fix-sum", "hello-file"]
    hello = tasks[1]
    assert hello.instruction.startswith("Write the single word `hello`")  # canary dropped
    assert (hello.verifier_timeout_s, hello.agent_timeout_s, hello.memory_mb) == (60, 120, 512)
    assert read_tasks(TASKS / "hello-file")[0].task_id == "hello-file"  # one task folder


def copy_task(tmp_path: Path, toml: str) -> Path:
    folder = tmp_path / "tasks" / "bad"
    shutil.copytree(TASKS / "hello-file", folder)
    (folder / "task.toml").write_text(toml)
    return folder


NOT_A_FIELD = "is not a harbor task.toml field; valid here"
BAD_FIELDS = [
    (
        "[verifier]\ntimeout_secs = 5\n",
        rf"verifier.timeout_secs: {NOT_A_FIELD}: allowed_hosts, coll",
    ),
    ("[verifier]\ntimeout_sec = 'soon'\n", "verifier.timeout_sec: is 'soon'; valid: a finite num"),
    (
        "[environment]\nnetwork_mode = 'open'\n",
        "network_mode: is 'open'; valid: 'no-network', 'pub",
    ),
    ("[task]\ndescription = 'x'\n", r"task.name: is required and missing"),
    ("[environment]\nmemory_mb = true\n", r"environment.memory_mb: is True; valid: an integer"),
    ("[[steps]]\nname = 'a'\nbogus = 1\n", rf"steps\[0\].bogus: {NOT_A_FIELD}"),
    ("timeout = 3\n", rf"timeout: {NOT_A_FIELD}: agent, artifacts,"),
]


@pytest.mark.parametrize(("toml", "message"), BAD_FIELDS)
def test_a_bad_field_is_named_with_its_file_and_what_is_valid(tmp_path, toml, message):
    folder = copy_task(tmp_path, toml)
    with pytest.raises(HarborTaskError, match=message) as err:
        read_tasks(folder.parent)
    assert str(folder / "task.toml") in str(err.value)


def test_every_bad_field_is_named_at_once():
    data = {"verifier": {"timeout_secs": 1}, "agent": {"user": 1.5}, "metadata": {"any": [1]}}
    with pytest.raises(HarborTaskError) as err:
        check_task_toml(data, "t/task.toml")
    assert "verifier.timeout_secs" in str(err.value) and "agent.user: is 1.5" in str(err.value)
    assert "metadata" not in str(err.value)  # free-form, as in harbor


def test_legacy_spellings_harbor_still_reads_are_accepted(tmp_path):
    folder = copy_task(tmp_path, "version = '1.0'\n[environment]\nmemory = '1G'\n")
    assert read_task(folder).memory_mb == 1024


@pytest.mark.parametrize(
    ("toml", "what"),
    [
        ("[[steps]]\nname = 'one'\n", "multi-step tasks"),
        ("[environment]\nos = 'windows'\n", "Windows containers"),
        ("[verifier]\nenvironment_mode = 'separate'\n", "a separate verifier container"),
    ],
)
def test_what_agentgym_cannot_play_is_refused_by_name(tmp_path, toml, what):
    with pytest.raises(HarborTaskError, match=rf"task 'bad' .* does not support: .*{what}"):
        read_task(copy_task(tmp_path, toml))


def test_missing_files_and_empty_folders_are_named(tmp_path):
    folder = copy_task(tmp_path, "")
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match=r"task 'bad': missing .*tests/test.sh"):
        read_task(folder)
    with pytest.raises(HarborTaskError, match="holds no Harbor task"):
        read_tasks(tmp_path)
    with pytest.raises(HarborTaskError, match="is not a directory"):
        read_tasks(tmp_path / "nowhere")


# --- the reward files ---------------------------------------------------------------------


def test_reward_txt_is_the_reward():
    verdict = read_reward(None, "0.75\n")
    assert (verdict.reward, dict(verdict.parts), verdict.reason) == (0.75, {"reward": 0.75}, None)


def test_reward_json_wins_and_its_reward_key_is_the_reward():
    verdict = read_reward('{"reward": 1, "cases": 0.5}', "0")
    assert (verdict.reward, dict(verdict.parts)) == (1.0, {"reward": 1.0, "cases": 0.5})
    assert read_reward('{"passed": 0.25}', None).reward == 0.25  # the only key


@pytest.mark.parametrize(
    ("json_text", "txt", "reason"),
    [
        (None, None, f"neither {REWARD_TXT} nor {REWARD_JSON}"),
        (None, "", f"{REWARD_TXT} is empty"),
        (None, "yes", "not a number"),
        (None, "nan", "not a number"),
        ("{", None, "not JSON"),
        ("[1]", None, "valid: an object of numbers"),
        ('{"reward": "1"}', None, "reward not finite numbers"),
        ('{"a": 1, "b": 0}', None, "no 'reward' key"),
    ],
)
def test_a_missing_or_garbled_reward_is_0_with_the_reason(json_text, txt, reason):
    verdict = read_reward(json_text, txt)
    assert verdict.reward == 0.0 and reason in (verdict.reason or "")


@given(st.one_of(st.none(), st.text(max_size=40)), st.one_of(st.none(), st.text(max_size=40)))
def test_any_reward_file_text_gives_a_finite_reward(json_text, txt):
    verdict = read_reward(json_text, txt)
    assert math.isfinite(verdict.reward)
    assert all(math.isfinite(v) for v in verdict.parts.values())
    if verdict.reason is not None:
        assert verdict.reward == 0.0
    else:
        assert verdict.reward in verdict.parts.values()


@given(
    st.dictionaries(
        st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False), min_size=1
    )
)
def test_a_json_object_of_numbers_pays_harbors_primary_reward(rewards):
    verdict = read_reward(json.dumps(rewards), None)
    assert dict(verdict.parts) == rewards
    primary = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
    assert verdict.reward == (primary if primary is not None else 0.0)
    assert (verdict.reason is None) == (primary is not None)


# --- splits and images ------------------------------------------------------------------------


def test_splits_are_disjoint_stable_and_never_empty():
    ids = [f"task-{i}" for i in range(10)]
    splits = split_tasks(ids, 0.2, None)
    assert len(splits["test"]) == 2 and not set(splits["train"]) & set(splits["test"])
    assert split_tasks(ids[::-1], 0.2, None)["test"] == splits["test"]
    assert (
        split_tasks(["a", "b"], 0.01, None)["test"] and split_tasks(["a", "b"], 0.99, None)["train"]
    )
    assert split_tasks(["a"], 0.2, None) == {"train": ["a"], "test": ["a"]}
    assert split_tasks(ids, 0.2, ["task-3"])["test"] == ["task-3"]
    with pytest.raises(HarborTaskError, match=r"test_tasks names \['nope'\]"):
        split_tasks(ids, 0.2, ["nope"])
    with pytest.raises(HarborTaskError, match="leaves a split empty"):
        split_tasks(ids, 0.2, ids)
    with pytest.raises(HarborTaskError, match="test_fraction=1.5"):
        split_tasks(ids, 1.5, None)


def test_base_images_are_the_from_lines_less_stages_and_scratch():
    dockerfile = (
        "ARG BASE=python:3.12-slim\n"
        "FROM --platform=linux/amd64 ${BASE} AS build\n"
        "RUN make\n"
        "FROM build AS test\n"
        "FROM scratch\n"
        "from debian:bookworm\n"
    )
    assert base_images(dockerfile) == ["python:3.12-slim", "debian:bookworm"]


def test_the_image_hash_follows_the_environment_folders_contents(tmp_path):
    shutil.copytree(TASKS / "fix-sum" / "environment", tmp_path / "env")
    before = environment_hash(tmp_path / "env")
    assert environment_hash(tmp_path / "env") == before
    (tmp_path / "env" / "total.py").write_text("def total(xs): return sum(xs)\n")
    assert environment_hash(tmp_path / "env") != before
