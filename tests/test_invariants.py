"""Checks where data crosses stages: the sampler's group layout, a trajectory's per-token
fields, a batch's tensor shapes. Each refuses the broken record with the error naming it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentgym.learn.grpo import check_groups
from agentgym.types import Batch, TrainingError, Trajectory

# --- the group layout group_advantages reads -------------------------------------------


@pytest.mark.parametrize(
    ("task_ids", "groups"),
    [
        (["a", "a", "b", "b"], [0, 0, 1, 1]),
        # two groups may draw one task: the group index tells them apart
        (["a", "a", "b", "b", "a", "a"], [0, 0, 1, 1, 2, 2]),
        # a group numbering that does not start at 0 or count up (a sampler's shares)
        (["c", "c", "a", "a"], [5, 5, 2, 2]),
    ],
)
def test_contiguous_groups_pass(task_ids, groups):
    check_groups(task_ids, groups, 2)


@pytest.mark.parametrize(
    ("task_ids", "groups", "message"),
    [
        # interleaved: the first block already mixes the two tasks
        (
            ["a", "b", "a", "b"],
            [0, 1, 0, 1],
            r"^block 0 \(samples 0-1\) is not one group: task ids \['a', 'b'\], "
            r"group indices \[0, 1\]; each group's 2 samples must be contiguous$",
        ),
        # two samples swapped across a block edge: block 0 is fine, block 1 is not
        (
            ["a", "a", "b", "c", "b", "c"],
            [0, 0, 1, 2, 1, 2],
            r"^block 1 \(samples 2-3\) is not one group: task ids \['b', 'c'\], "
            r"group indices \[1, 2\];",
        ),
        # two groups of one task mixed: one id, but two group indices
        (
            ["a", "a", "a", "a"],
            [0, 1, 0, 1],
            r"^block 0 \(samples 0-1\) is not one group: task ids \['a'\], group indices \[0, 1\];",
        ),
        # a group split in two blocks: each block looks whole, the index repeats
        (
            ["a", "a", "b", "b", "a", "a"],
            [0, 0, 1, 1, 0, 0],
            r"^block 2 \(samples 4-5\) is not one group: task ids \['a'\], group indices \[0\] "
            r"\(block 0 has it too\);",
        ),
    ],
    ids=["interleaved", "swapped across blocks", "one task two groups", "a group split"],
)
def test_a_shuffled_batch_is_a_training_error_naming_the_first_bad_block(task_ids, groups, message):
    with pytest.raises(TrainingError, match=message):
        check_groups(task_ids, groups, 2)


@pytest.mark.parametrize(
    ("task_ids", "groups", "size"),
    [(["a"] * 3, [0] * 3, 2), (["a"] * 4, [0] * 3, 2), (["a"] * 2, [0] * 2, 0)],
    ids=["not a multiple of G", "lengths differ", "G of 0"],
)
def test_samples_that_cannot_be_blocks_of_g_are_a_training_error(task_ids, groups, size):
    with pytest.raises(TrainingError, match=f"cannot be split into groups of {size}"):
        check_groups(task_ids, groups, size)


# --- a trajectory's per-token fields ---------------------------------------------------


def _trajectory(**fields) -> Trajectory:
    base = dict(task_id="t/1", group=3, tokens=(1, 2, 3), loss_mask=(0, 1, 1),
                logprobs=(0.0, -0.5, -0.5), prompt_length=1, reward=1.0, reward_parts={},
                turns=(), finish_reason="stop", truncated=False)  # fmt: skip
    return Trajectory(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "got"),
    [
        ({"loss_mask": (0, 1)}, "'loss_mask': 2"),
        ({"logprobs": (0.0, -0.5, -0.5, -0.5)}, "'logprobs': 4"),
        ({"token_versions": (-1, 0)}, "'token_versions': 2"),
        ({"prompt_length": 4}, "prompt_length 4"),
        ({"prompt_length": -1}, "prompt_length -1"),
    ],
    ids=["short mask", "long logprobs", "short versions", "prompt past the end", "negative"],
)
def test_a_trajectory_with_misaligned_token_fields_is_refused_naming_it(fields, got):
    with pytest.raises(ValueError, match=r"^trajectory of task 't/1' \(group 3\)") as err:
        _trajectory(**fields)
    assert got in str(err.value)


def test_aligned_trajectories_are_accepted_even_without_tokens():
    assert _trajectory(token_versions=(-1, 0, 0)).token_versions == (-1, 0, 0)
    # a reset that failed leaves an episode with no tokens at all
    empty = _trajectory(tokens=(), loss_mask=(), logprobs=(), prompt_length=0)
    assert empty.completion_length == 0


def test_a_replace_that_misaligns_a_trajectory_is_refused_too():
    # a stage after the rollout (a sampler's version stamp, a reward function) uses replace
    with pytest.raises(ValueError, match="'token_versions': 4"):
        dataclasses.replace(_trajectory(), token_versions=(-1, 0, 0, 0))


# --- a batch's tensor shapes -----------------------------------------------------------


def _batch(**tensors) -> Batch:
    n, length = 2, 5
    base = dict(input_ids=torch.ones(n, length, dtype=torch.long),
                attention_mask=torch.ones(n, length, dtype=torch.long),
                loss_mask=torch.ones(n, length - 1), old_logprobs=torch.zeros(n, length - 1),
                advantages=torch.zeros(n))  # fmt: skip
    return Batch(**{**base, **tensors})


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        # the mask of the tokens, not of the targets: one position too many
        ({"loss_mask": torch.ones(2, 5)}, r"loss_mask is \(2, 5\), not \(2, 4\)$"),
        ({"old_logprobs": torch.zeros(3, 4)}, r"old_logprobs is \(3, 4\), not \(2, 4\)$"),
        ({"attention_mask": torch.ones(2, 4)}, r"attention_mask is \(2, 4\), not \(2, 5\)$"),
        ({"advantages": torch.zeros(2, 1)}, r"advantages is \(2, 1\), not \(2, 4\)$"),
        ({"is_weights": torch.ones(2, 5)}, r"is_weights is \(2, 5\), not \(2, 4\)$"),
        ({"input_ids": torch.ones(10, dtype=torch.long)}, r"^Batch: input_ids must be \[N, L\]"),
    ],
    ids=["loss_mask", "old_logprobs", "attention_mask", "advantages", "is_weights", "1-D ids"],
)
def test_a_batch_of_mismatched_shapes_is_refused_naming_the_tensor(tensors, message):
    with pytest.raises(ValueError, match=message):
        _batch(**tensors)


def test_a_batch_lists_every_mismatched_tensor_at_once():
    with pytest.raises(ValueError, match=r"loss_mask is \(2, 5\), not \(2, 4\); advantages is"):
        _batch(loss_mask=torch.ones(2, 5), advantages=torch.zeros(3))


def test_a_batch_built_from_trajectories_and_cut_into_micro_batches_stays_aligned():
    rows = [_trajectory(), _trajectory(tokens=(1, 2, 3, 4, 5), loss_mask=(0, 1, 1, 0, 1),
                                       logprobs=(0.0, -0.1, -0.2, 0.0, -0.3))]  # fmt: skip
    batch = Batch.from_trajectories(rows, torch.tensor([1.0, -1.0]), pad_id=0)
    weighted = dataclasses.replace(batch, is_weights=torch.ones(2, 4))
    micros = weighted.split(1)
    assert [tuple(m.loss_mask.shape) for m in micros] == [(1, 2), (1, 4)]
    assert micros[1].old_logprobs.tolist() == [pytest.approx([-0.1, -0.2, 0.0, -0.3])]
