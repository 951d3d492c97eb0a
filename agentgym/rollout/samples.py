"""An episode as several samples, where its chat template rewrote the history (it dropped
earlier thinking, re-rendered earlier calls): the rollout cannot append the next turn's
ids to what the policy saw, so it closes the sample there and opens the next, whose prompt
is the whole conversation as the template renders it at that turn. Each sample trains on
the ids the policy sampled in it, and nothing else (`check_sampled`, every episode); the
samples are the trajectory's `split_samples`, weighted as
`agentgym.learn.advantages.split_weights` says (the rule the agent endpoint's follow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentgym.types import Trajectory


@dataclass(frozen=True)
class Sample:
    """A sample a rewritten history closed: its ids, mask, logprobs, prompt length, and
    its turns' spans and versions."""

    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_length: int
    spans: tuple[tuple[int, int], ...]
    span_versions: tuple[int, ...]
    opened_by: str | None = None
    """Why it began where it did (None for the episode's first sample)."""


def close_sample(ep: Any, prompt: list[int], note: str) -> None:
    """Closes the live episode `ep`'s sample and opens the next with `prompt` (the whole
    conversation as the template renders it now, with the generation prompt); `note` says
    where the rendering stopped extending the closed one (with the turn the new sample
    begins at, its `opened_by`)."""
    ep.samples.append(
        Sample(
            tuple(ep.tokens),
            tuple(ep.loss_mask),
            tuple(ep.logprobs),
            ep.prompt_length,
            tuple(ep.spans),
            tuple(ep.span_versions),
            ep.opened_by,
        )
    )
    ep.opened_by = f"turn {len(ep.turns)}: {note}"
    ep.counts["split_samples"] += 1
    ep.tokens, ep.prompt_length = list(prompt), len(prompt)
    ep.loss_mask, ep.logprobs = [0] * len(prompt), [0.0] * len(prompt)
    ep.spans, ep.span_versions = [], []


def resampled(
    tokens: Sequence[int], spans: Sequence[tuple[int, int]], sampled: Sequence[Sequence[int]]
) -> list[int]:
    """Per sampled turn, how many of the ids a sample trains on there (`tokens` over its
    span) differ from the ids the policy sampled (`sampled`); a length difference counts
    each missing or extra id. One rule for the rollout's samples and the agent endpoint's."""
    out = []
    for (start, end), ids in zip(spans, sampled, strict=True):
        trained = tokens[start:end]
        same = sum(a == b for a, b in zip(trained, ids, strict=False))
        out.append(max(len(trained), len(ids)) - same)
    return out


def check_sampled(ep: Any) -> None:
    """AssertionError, naming the episode and the turn, unless the ids each sample trains
    on (its turns' spans) are the ids the policy sampled at those turns (`ep.sampled`).
    Counts what it compared: `ep.counts["tokens_checked"]` and `["tokens_resampled"]` (the
    ids that differ, so 0 for an episode that passes)."""
    tokens = [s.tokens for s in ep.samples for _ in s.spans] + [ep.tokens] * len(ep.spans)
    spans = [span for s in ep.samples for span in s.spans] + list(ep.spans)
    if len(spans) != len(ep.sampled):
        raise AssertionError(
            f"episode {ep.task_id!r} (group {ep.group}, member {ep.member}): "
            f"{len(spans)} trained turns for {len(ep.sampled)} sampled ones"
        )
    differ = [
        resampled(t, [span], [ids])[0]
        for t, span, ids in zip(tokens, spans, ep.sampled, strict=True)
    ]
    ep.counts["tokens_checked"] = float(sum(map(len, ep.sampled)))
    ep.counts["tokens_resampled"] = float(sum(differ))
    for turn, n in enumerate(differ):
        if n:
            raise AssertionError(
                f"episode {ep.task_id!r} (group {ep.group}, member {ep.member}), turn {turn}: "
                f"{n} of the ids in its sample are not the ids the policy sampled"
            )


def versions(sample: Any) -> tuple[int, ...]:
    """Each token's policy version: its turn's on the sampled ones, -1 elsewhere."""
    out = [-1] * len(sample.tokens)
    for (start, stop), version in zip(sample.spans, sample.span_versions, strict=True):
        out[start:stop] = [version] * (stop - start)
    return tuple(out)


def with_samples(ep: Any, main: Trajectory) -> Trajectory:
    """`main` (the episode's last sample) with the samples `ep` closed as `split_samples`:
    each with the episode's reward and no turns of its own."""
    if not ep.samples:
        return main
    rows = [
        replace(
            main,
            tokens=s.tokens,
            loss_mask=s.loss_mask,
            logprobs=s.logprobs,
            prompt_length=s.prompt_length,
            turn_spans=s.spans,
            turns=(),
            token_versions=versions(s) if s.span_versions else (),
            opened_by=s.opened_by,
        )
        for s in ep.samples
    ]
    return replace(main, split_samples=tuple(rows))
