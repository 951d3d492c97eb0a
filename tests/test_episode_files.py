"""Episodes kept for reading later (`agentgym.eval.episode_files`): each training step's in
`episodes/step-NNNNNN.npz`, an evaluation's beside its report; tokens, mask, logprobs,
versions and advantages as flat arrays, the messages and figures as one JSON document."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agentgym.cli import main
from agentgym.eval.episode_files import (
    BYTES_PER_TOKEN,
    read_episodes,
    token_advantages,
    write_episodes,
)
from agentgym.types import Message, Trajectory, Turn

RUN = [
    "train", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random",
    "--set", "grpo.group_size=2", "--set", "grpo.tasks_per_step=2",
    "--set", "sampling.max_new_tokens=8", "--set", "run.report_to=[]",
]  # fmt: skip


def _episode(task: str, tokens: tuple[int, ...], mask: tuple[int, ...], reward: float):
    return Trajectory(
        task_id=task, group=0, tokens=tokens, loss_mask=mask,
        logprobs=tuple(-0.25 * m for m in mask), prompt_length=2, reward=reward,
        reward_parts={"correctness": reward, "format": float("nan")},
        turns=(Turn("<tool_call>x</tool_call>", (Message("tool", "7", name="calc"),), 0.0, {}),),
        finish_reason="stop", truncated=False,
        prompt_messages=(Message("user", "add"),), turn_spans=((2, 4),),
        token_versions=tuple(3 if m else -1 for m in mask),
    )  # fmt: skip


def test_a_file_holds_each_episodes_tokens_mask_and_figures_by_hand(tmp_path):
    a = _episode("t/1", (10, 11, 12, 13, 14), (0, 0, 1, 1, 0), 1.0)
    b = _episode("t/2", (20, 21, 22), (0, 0, 1), 0.0)
    # the learner's per-target rows: position j is the advantage of token j + 1
    per_token = [token_advantages([0.0, 0.5, 0.5, 0.0], 5), token_advantages([0.0, -1.0], 3)]
    assert per_token == [[0.0, 0.0, 0.5, 0.5, 0.0], [0.0, 0.0, -1.0]]
    path = write_episodes(tmp_path / "s.npz", [a, b], per_token, extra={"step": 4})
    meta, arrays = read_episodes(path)
    assert meta["step"] == 4
    first, second = meta["episodes"]
    assert first["span"] == [0, 5] and second["span"] == [5, 8]
    assert arrays["tokens"].tolist() == [10, 11, 12, 13, 14, 20, 21, 22]
    assert arrays["loss_mask"].tolist() == [0, 0, 1, 1, 0, 0, 0, 1]
    assert arrays["logprobs"].tolist() == [0, 0, -0.25, -0.25, 0, 0, 0, -0.25]
    assert arrays["versions"].tolist() == [-1, -1, 3, 3, -1, -1, -1, 3]
    assert arrays["advantages"].tolist() == [0, 0, 0.5, 0.5, 0, 0, 0, -1.0]
    assert arrays["tokens"].dtype == np.int32 and arrays["loss_mask"].dtype == np.uint8
    assert first["advantage"] == 0.5 and second["advantage"] == -1.0  # mean over sampled
    assert first["reward_parts"] == {"correctness": 1.0, "format": None}  # NaN: null
    assert first["prompt"] == [{"role": "user", "content": "add"}]
    assert first["turns"][0]["observation"] == [{"role": "tool", "content": "7", "name": "calc"}]
    assert first["turn_spans"] == [[2, 4]] and first["prompt_length"] == 2


def split_episode() -> Trajectory:
    """An episode whose chat template rewrote its history after turn 0: two samples."""
    first = _episode("t/1", (10, 11, 12, 13), (0, 0, 1, 1), 1.0)
    turns = (*first.turns, Turn("done", (), 1.0, {}))
    note = "turn 1: the template re-rendered the conversation from character 9: 'a' became 'b'"
    return replace(
        first, tokens=(20, 21, 22, 23, 24), loss_mask=(0, 0, 0, 1, 1), prompt_length=3,
        logprobs=(0, 0, 0, -0.5, -0.5), turn_spans=((3, 5),), token_versions=(), turns=turns,
        split_samples=(replace(first, turns=()),), opened_by=note,
    )  # fmt: skip


def test_an_episode_split_into_samples_keeps_each_samples_tokens_and_where_it_split(tmp_path):
    from agentgym.view.data import episode_view

    t = split_episode()
    path = write_episodes(tmp_path / "s.npz", [t], [[0.0, 0.0, 0.0, 2.0, 2.0]])
    meta, arrays = read_episodes(path)
    (episode,) = meta["episodes"]
    assert episode["span"] == [0, 5] and episode["opened_by"] == t.opened_by
    (earlier,) = episode["samples"]
    assert earlier == {"span": [5, 9], "prompt_length": 2, "turn_spans": [[2, 4]]}
    assert arrays["tokens"].tolist() == [20, 21, 22, 23, 24, 10, 11, 12, 13]
    assert arrays["loss_mask"].tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1]
    view = episode_view(episode, arrays)
    assert view["t"] == [20, 21, 22, 23, 24] and view["turns_in"] == [1, 2]
    (sample,) = view["samples"]
    assert sample["t"] == [10, 11, 12, 13] and sample["m"] == "0011" and sample["p"] == 2
    assert sample["turns_in"] == [0, 1] and sample["opened_by"] is None


def test_the_share_and_the_cap_keep_tokens_for_the_first_episodes_only(tmp_path):
    episodes = [_episode(f"t/{i}", (1, 2, 3, 4), (0, 0, 1, 1), 1.0) for i in range(4)]
    meta, arrays = read_episodes(write_episodes(tmp_path / "a.npz", episodes, token_share=0.5))
    assert [e["span"] for e in meta["episodes"]] == [[0, 4], [4, 8], None, None]
    assert len(arrays["tokens"]) == 8 and "advantages" not in arrays  # not trained on
    three = 3 * 4 * BYTES_PER_TOKEN  # room for three episodes' tokens
    meta, _ = read_episodes(write_episodes(tmp_path / "b.npz", episodes, max_bytes=three))
    assert [e["span"] is not None for e in meta["episodes"]] == [True, True, True, False]
    assert all(e["turns"] for e in meta["episodes"])  # messages kept by all
    with pytest.raises(ValueError, match="token_share must be between 0 and 1, got 1.5"):
        write_episodes(tmp_path / "c.npz", episodes, token_share=1.5)


def test_a_training_run_writes_each_steps_episodes_as_it_trained_them(tmp_path):
    run = tmp_path / "run"
    assert main([*RUN, "--steps", "2", "--output", str(run)]) == 0
    files = sorted((run / "episodes").glob("*.npz"))
    assert [f.name for f in files] == ["step-000001.npz", "step-000002.npz"]
    meta, arrays = read_episodes(files[1])
    assert meta["step"] == 2 and len(meta["episodes"]) == 4  # 2 tasks x 2
    assert set(map(int, meta["vocab"])) == set(arrays["tokens"].tolist())  # each id's text
    completions = [json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in meta["episodes"]] == [
        c["task_id"] for c in completions if c["step"] == 2
    ]
    for e in meta["episodes"]:
        start, end = e["span"]
        mask = arrays["loss_mask"][start:end]
        assert mask[: e["prompt_length"]].sum() == 0  # the prompt is never trained on
        advantages = arrays["advantages"][start:end]
        assert (advantages[mask == 0] == 0).all()
        assert advantages[mask == 1] == pytest.approx(e["advantage"])  # GRPO: one a episode
        assert (arrays["versions"][start:end][mask == 1] == 1).all()  # step 2: version 1


def test_a_resumed_run_rewrites_the_episode_files_past_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    assert main([*RUN, "--steps", "3", "--set", "run.save_every=1", "--output", str(run)]) == 0
    third = read_episodes(run / "episodes" / "step-000003.npz")
    (run / "checkpoint-000003").rename(tmp_path / "gone")  # as if killed before saving 3
    assert main(["train", "--resume", str(run / "checkpoint-000002")]) == 0
    assert sorted(p.name for p in (run / "episodes").iterdir()) == [
        "step-000001.npz", "step-000002.npz", "step-000003.npz"
    ]  # fmt: skip
    meta, arrays = read_episodes(run / "episodes" / "step-000003.npz")
    assert meta == third[0]  # a resumed run is bitwise the same
    assert (
        all(np.array_equal(arrays[k], third[1][k]) for k in third[1])
        and arrays.keys() == third[1].keys()
    )


def test_no_episode_files_when_switched_off(tmp_path):
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "1", "--set", "run.log_episodes=false", "--output", str(run)]
    assert main(argv) == 0
    assert not (run / "episodes").exists()


@pytest.mark.parametrize("which", ["all", "failures", "none"])
def test_eval_keeps_the_episodes_it_played_beside_its_report(tmp_path, which):
    out = tmp_path / "report"
    argv = ["eval", "--env", "cli_envs:cli_envs/Digits-v0", "--model", "tiny-random"]
    argv += ["--tasks", "3", "--n", "2", "--save-episodes", which, "--output", str(out)]
    assert main([*argv, "--set", "sampling.max_new_tokens=8"]) == 0
    report = json.loads((out / "report.json").read_text())
    path = out / "episodes-model.npz"
    if which == "none":
        assert not path.exists()
        return
    meta, arrays = read_episodes(path)
    played = 3 * (1 + 2)  # each task's greedy episode and 2 sampled
    correct = sum(
        r["greedy"]["strict"] + sum(s["strict"] for s in r["samples"])
        for r in report["tasks"]["model"]
    )
    assert len(meta["episodes"]) == (played if which == "all" else played - correct)
    assert all(e["span"] is not None for e in meta["episodes"])
    assert "advantages" not in arrays and meta["model"] == "tiny-random"
    if which == "all":
        ids = [r["task_id"] for r in report["tasks"]["model"]]
        assert [e["task_id"] for e in meta["episodes"][:3]] == ids  # greedy first
        assert [e["greedy"] for e in meta["episodes"]] == [True] * 3 + [False] * 6
        assert [e["sample"] for e in meta["episodes"][3:]] == [0, 1] * 3  # then each task's
