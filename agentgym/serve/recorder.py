"""An episode recorded from the requests an agent sends: exact token ids, never re-tokenized.

An agent's episode is the requests it sends to its own path of the server. Each request is
rendered and sampled; the recorder keeps what the policy saw and sampled as one training
sample (`Sample`): the prompt as the chat template renders it, the sampled ids with their
logprobs and mask 1, the policy version that sampled them.

**One sample while the history only grows.** A request whose messages begin with the
sample's messages so far, ending with the assistant message the server returned (compared
as messages: role, content, calls' names and arguments; not the calls' ids, not text),
continues the sample: the ids sampled for that turn stay as they were, and only the new
messages are rendered, as the chat template's suffix, exactly as the in-process rollout
renders an environment's reply (`continuation_ids`).

A request that extends an earlier sample rather than the newest goes on from that one.
**A new sample when none fits**: the agent edited, summarised or cut its history, or
changed the tools. The episode then has several samples, which share its advantage;
`agentgym.learn.advantages.split_weights` says how much each counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from agentgym.policy.base import Generation
from agentgym.policy.turn_end import TurnEnd, find_turn_end
from agentgym.rollout.episodes import closing_text, continuation_ids, prompt_ids, sampled_text
from agentgym.serve.requests import ChatMessage, FunctionTool, template_messages
from agentgym.tools import ToolCallFormat


@dataclass
class Sample:
    """One training sample of an episode: a prompt, then sampled turns and the messages
    between them, as token ids with their mask, logprobs and versions."""

    tokens: list[int]
    prompt_length: int
    template: list[dict[str, Any]]
    """The conversation as the chat template renders it (assistant turns as sampled)."""
    seen: list[tuple[Any, ...]]
    """The conversation as the agent sees it (`ChatMessage.key`), ending with the assistant
    message returned last."""
    tools: tuple[FunctionTool, ...]
    native_tools: list[dict[str, Any]] | None
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    closing: str | None = None
    """The text the last sampled turn closed with (its turn end, or eos); None if cut."""
    marks: list[tuple[int, int, str | None]] = field(default_factory=list)
    """(tokens, template messages, closing) after each sampled turn: where a fork may start."""
    sampled: list[tuple[int, ...]] = field(default_factory=list)
    """Each sampled turn's ids as the engine returned them (`spans` says where they sit)."""
    opened_by: str | None = None
    """Why the episode has this sample (None for its first)."""

    def continued_by(
        self, keys: Sequence[tuple[Any, ...]], tools: tuple[FunctionTool, ...]
    ) -> bool:
        """Whether a request of these messages (`ChatMessage.key`) and tools goes on from
        this sample: same tools, and its messages begin with the sample's and add more."""
        seen = len(self.seen)
        return self.tools == tools and len(keys) > seen and list(keys[:seen]) == self.seen

    def fork(self, length: int) -> Sample:
        """A copy of this sample as it stood when it held `length` tokens (after a turn)."""
        _, messages, closing = next(m for m in self.marks if m[0] == length)
        fork = Sample(
            self.tokens[:length],
            self.prompt_length,
            self.template[:messages],
            [],
            self.tools,
            self.native_tools,
            self.loss_mask[:length],
            self.logprobs[:length],
            self.versions[:length],
            [s for s in self.spans if s[1] <= length],
            closing,
        )
        fork.marks = [m for m in self.marks if m[0] <= length]
        fork.sampled = self.sampled[: len(fork.spans)]
        return fork

    def extend(
        self, ids: Sequence[int], sampled: Generation | None = None, version: int = -1
    ) -> None:
        self.tokens.extend(ids)
        if sampled is None:
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.versions.extend([-1] * len(ids))
        else:
            self.spans.append((len(self.tokens) - len(ids), len(self.tokens)))
            self.sampled.append(tuple(sampled.ids))
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(sampled.logprobs)
            self.versions.extend([version] * len(ids))


@dataclass(frozen=True)
class Prepared:
    """A request made ready to sample: its prompt ids, and where its sample stands."""

    prompt: list[int]
    sample: Sample
    """The sample it continues (as it stood: `base` tokens), or a new one, not yet kept."""
    base: int
    new_ids: list[int]
    """The ids of the request's new messages, after the sample's `base` tokens."""
    new_template: list[dict[str, Any]]
    opening: str
    """Text the assistant turn starts with before sampling (a forced call's opening)."""
    opening_ids: list[int]

    @property
    def continued(self) -> bool:
        return self.base > 0


class EpisodeRecorder:
    """The samples of one episode, built from its requests in order."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        fmt: ToolCallFormat,
        native: bool,
        turn_end: TurnEnd | None = None,
    ):
        self.tokenizer, self.format, self.native = tokenizer, fmt, native
        self.turn_end: TurnEnd = turn_end or find_turn_end(tokenizer)
        self.samples: list[Sample] = []
        self.requests = 0  # recorded so far

    @property
    def split_samples(self) -> int:
        """How many times the agent's history stopped growing (samples beyond the first)."""
        return max(0, len(self.samples) - 1)

    def prepare(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], opening: str = ""
    ) -> Prepared:
        """The prompt of the request: the last sample continued, or a new sample's."""
        tools = tuple(tools)
        native_tools = [t.openai() for t in tools] if tools and self.native else None
        keys = [m.key() for m in messages]
        opening_ids = self._ids(opening)
        last = next((s for s in reversed(self.samples) if s.continued_by(keys, tools)), None)
        if last is not None:
            new = template_messages(messages, self.format, (), self.native, len(last.seen))
            ids = continuation_ids(
                self.tokenizer,
                last.template,
                new,
                last.closing is not None,
                native_tools,
                last.closing,
            )
            prompt = [*last.tokens, *ids, *opening_ids]
            return Prepared(prompt, last, len(last.tokens), ids, new, opening, opening_ids)
        template = template_messages(messages, self.format, tools, self.native)
        ids = prompt_ids(self.tokenizer, template, native_tools)
        sample = Sample([], len(ids), [], [], tools, native_tools)
        return Prepared([*ids, *opening_ids], sample, 0, ids, template, opening, opening_ids)

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        return ids

    def text(self, prepared: Prepared, gen: Generation) -> str:
        """The assistant turn's text, as the rollout reads it: the forced opening, then the
        sampled ids decoded, without the text they closed with."""
        closing = closing_text(self.tokenizer, gen.ids, self.turn_end)
        return prepared.opening + sampled_text(self.tokenizer, gen.ids, self.native, closing)

    def record(
        self,
        prepared: Prepared,
        messages: Sequence[ChatMessage],
        gen: Generation,
        version: int,
        reply: ChatMessage,
    ) -> None:
        """Adds the sampled turn to its sample: `reply` is the assistant message returned.
        A sample that another request of the episode continued meanwhile (an agent sending
        requests in parallel) is forked at the point this one continued it from."""
        sample = prepared.sample
        if not prepared.continued:
            sample.template = list(prepared.new_template)
            if self.samples:
                sample.opened_by = (
                    f"request {self.requests}: its messages and tools extend no earlier sample "
                    "(the agent edited, summarised or cut its history, or changed the tools)"
                )
            self.samples.append(sample)
        else:
            if len(sample.tokens) != prepared.base:
                earlier = next(i for i, s in enumerate(self.samples) if s is sample)
                sample = sample.fork(prepared.base)
                sample.opened_by = (
                    f"request {self.requests}: it continues sample {earlier} as it stood at "
                    f"{prepared.base} tokens, which another request continued meanwhile"
                )
                self.samples.append(sample)
            sample.template.extend(prepared.new_template)
        sample.extend(prepared.new_ids)
        sample.extend(prepared.opening_ids)
        sample.extend(gen.ids, gen, version)
        sample.closing = closing_text(self.tokenizer, gen.ids, self.turn_end)
        sample.template.append({"role": "assistant", "content": self.text(prepared, gen)})
        sample.marks.append((len(sample.tokens), len(sample.template), sample.closing))
        sample.seen = [m.key() for m in messages] + [reply.key()]
        self.requests += 1
