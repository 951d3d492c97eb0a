"""Chat completions answered by the policy: requests rendered, sampled by the engine, replies
in OpenAI's shape, and, on an episode's path, every turn recorded as exact token ids.

`ChatService` holds no HTTP: `complete(body, episode)` takes the request body and returns
the response body (`app.py` puts it behind FastAPI). Tool calls in a reply are read by the
same parsers as the rollout's (`agentgym.tools`): the model's native format where its
template renders `tools=`, else the text format asked for. A turn whose calls cannot be
read comes back as content with `finish_reason` "stop", never as an error.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from agentgym.env.templates import TemplateFormat
from agentgym.policy.base import Generation, SamplingParams, context_tokens
from agentgym.policy.turn_end import find_turn_end
from agentgym.serve.engine import Engine
from agentgym.serve.recorder import EpisodeRecorder, Prepared
from agentgym.serve.requests import (
    BadRequest,
    Call,
    ChatMessage,
    ChatRequest,
    ServeLimits,
    call_opening,
    offered_tools,
    read_request,
)
from agentgym.tools import ToolCallFormat
from agentgym.tools.native import NativeFormat

EPISODE_LIMITS = ServeLimits(max_tokens=1 << 20, max_n=1 << 20)
"""What an episode's request may ask (the run's sampling caps it: `_episode_params`)."""


class UnknownEpisode(KeyError):
    """A request on the path of an episode the service is not recording."""


class WrongEpisodeKey(KeyError):
    """A request on an episode's path without that episode's key: another episode's agent."""


class UnknownModel(KeyError):
    """A request, not on an episode's path, for a model this service does not serve."""


def request_stream(seed: int, index: int) -> int:
    """The random stream of choice `index` of a request with `seed`."""
    digest = hashlib.blake2b(f"serve/{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass
class Episode:
    """An episode being recorded: its recorder, and the stream of each of its turns."""

    recorder: EpisodeRecorder
    streams: Callable[[int], int] | None = None
    """The random stream of the episode's k-th request (None: the request's seed, or fresh)."""
    params: SamplingParams | None = None
    """The run's sampling (temperature, top-p, the most tokens per turn), which its requests
    sample with whatever they ask: GRPO's groups need the run's temperature, and the
    logprobs recorded must be of the distribution sampled."""
    max_tokens: int | None = None
    """The episode's token budget: a request whose prompt reaches it is refused (400,
    code context_length_exceeded) and the episode is marked truncated."""
    requests: int = 0
    truncated: bool = False
    tool_calls: int = 0
    finish_reason: str = "stop"
    conversation: list[dict[str, Any]] = field(default_factory=list)
    """The last request's messages and the reply to it, in OpenAI's shape."""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    """The episode's key: its agent's client sends it as its API key; no other has it."""
    closed: bool = False
    """Closed episodes record nothing, not even a request that was sampling as it closed."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class ChatService:
    """OpenAI chat completions from `engine`'s policy, rendered with `tokenizer`.

    Args:
        tool_format: The text format ("hermes" or "react") for a model whose template does
            not render `tools=`; "auto" speaks native where it does, as environments do.
        max_new_tokens: A request's token limit when it gives none.
        aliases: Other ids a request may name the model by (the name `--model` was given).
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        model_name: str,
        tool_format: str = "auto",
        tool_parser: str | None = None,
        max_new_tokens: int = 512,
        limits: ServeLimits | None = None,
        aliases: tuple[str, ...] = (),
    ):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.aliases = aliases
        self.limits = limits or ServeLimits()
        self.context = context_tokens(engine.policy)
        self.longest_token = max((len(t) for t in tokenizer.get_vocab()), default=1)
        """The most characters one token stands for (its vocabulary's longest entry: a
        byte-level token decodes to at most as many characters as its entry has)."""
        self.format: ToolCallFormat = TemplateFormat(tool_format, tool_parser).resolve(tokenizer)
        self.native = isinstance(self.format, NativeFormat)
        self.max_new_tokens = max_new_tokens
        self.turn_end = find_turn_end(tokenizer)
        self.episodes: dict[str, Episode] = {}
        self._opened = 0

    # -- episodes ----------------------------------------------------------------

    def open_episode(
        self,
        streams: Callable[[int], int] | None = None,
        params: SamplingParams | None = None,
        max_tokens: int | None = None,
    ) -> str:
        """A new episode's id: its requests go to `/episodes/<id>/v1/...` and bear its key
        (`self.episodes[id].token`) as their API key; ids count up, keys are secret."""
        self._opened += 1
        key = f"e{self._opened}"
        self.episodes[key] = Episode(self.recorder(), streams, params, max_tokens)
        return key

    def close_episode(self, key: str) -> Episode:
        """The episode recorded under `key`, no longer recording: its path answers 404."""
        episode = self.episodes.pop(key)
        with episode.lock:
            episode.closed = True
        return episode

    # -- requests ----------------------------------------------------------------

    def served_names(self) -> set[str]:
        """The model ids a request may name: `/v1/models`' id, the aliases, and the last
        part of each that is a path."""
        names = {self.model_name, *self.aliases}
        return names | {Path(name).name for name in names}

    def models(self) -> dict[str, Any]:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "agentgym"}
        return {"object": "list", "data": [model]}

    async def complete(
        self, body: Any, episode: str | None = None, key: str | None = None
    ) -> dict[str, Any]:
        """The response to a chat-completion request `body`; BadRequest naming the field
        when OpenAI's API would refuse it, UnknownEpisode for a path not recording, and
        WrongEpisodeKey when `key` (the request's API key) is not the episode's."""
        recording = None if episode is None else self.episodes.get(episode)
        if episode is not None and recording is None:
            raise UnknownEpisode(episode)
        if recording is not None and not secrets.compare_digest(key or "", recording.token):
            raise WrongEpisodeKey(episode)
        # an episode's requests sample within the run's limits whatever they ask
        limits = self.limits if recording is None else EPISODE_LIMITS
        request = read_request(body, self.max_new_tokens, limits)
        if recording is None and request.model and request.model not in self.served_names():
            raise UnknownModel(request.model)  # an episode's path takes any name
        if recording is not None and request.n != 1:
            raise BadRequest("n", "n must be 1 on an episode's path: an episode is one trajectory")
        self._tokenizable(request)
        recorder = recording.recorder if recording is not None else self.recorder()
        opening = self._opening(request)
        try:
            prepared = recorder.prepare(request.messages, offered_tools(request), opening)
        except Exception as err:  # the chat template refused the conversation
            raise BadRequest(
                "messages", f"the chat template cannot render messages: {err}"
            ) from None
        params = request.params
        if recording is not None:
            params = self._episode_params(recording, params, prepared)
        else:
            params = self._within_context(body, params, len(prepared.prompt))
        streams = self._streams(request, recording)
        futures = [self.engine.submit(prepared.prompt, params, s) for s in streams]
        try:
            results = [await asyncio.wrap_future(f) for f in futures]
        except BaseException:  # cancelled (the client went away) or failed: none is needed
            for future in futures:
                future.cancel()
            raise
        choices = []
        for index, (gen, version) in enumerate(results):
            text = recorder.text(prepared, gen)
            message, finish = self._reply(request, text, gen)
            if recording is not None:
                with recording.lock:
                    if recording.closed:  # its agent ran past its deadline: not recorded
                        raise UnknownEpisode(episode)
                    recorder.record(prepared, request.messages, gen, version, message)
                    self._note(recording, body, message, gen)
            choices.append(self._choice(index, message, finish, gen, request.logprobs))
        completion = sum(len(g.ids) for g, _ in results)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model or self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prepared.prompt),
                "completion_tokens": completion,
                "total_tokens": len(prepared.prompt) + completion,
            },
        }

    def _tokenizable(self, request: ChatRequest) -> None:
        """A 400 before tokenizing, for messages whose text holds more tokens than the
        context for certain: each token is at most `longest_token` characters. Tokenizing
        a megabyte takes seconds and memory the tokenizer may fail to allocate, which
        aborts the process (a Rust allocation failure cannot be caught)."""
        if self.context is None:
            return
        text = sum(len(m.content) for m in request.messages)
        if text > self.context * self.longest_token:
            raise BadRequest(
                "messages",
                f"this model's maximum context length is {self.context} tokens; the request's "
                f"messages have {text} characters, at least {-(-text // self.longest_token)} "
                f"tokens (a token is at most {self.longest_token} characters)",
                code="context_length_exceeded",
            )

    def _within_context(self, body: Any, params: SamplingParams, prompt: int) -> SamplingParams:
        """`params` with a token limit the model's context holds beside the prompt: one the
        request set must fit (else 400 naming both numbers, as OpenAI's); the default is
        cut to what is left."""
        if self.context is None:
            return params
        asked = isinstance(body, dict) and any(
            body.get(k) is not None for k in ("max_tokens", "max_completion_tokens")
        )
        room = self.context - prompt
        if room < 1 or (asked and params.max_new_tokens > room):
            raise BadRequest(
                "messages",
                f"this model's maximum context length is {self.context} tokens; the request "
                f"has {prompt} in its messages and asks for {params.max_new_tokens} more",
                code="context_length_exceeded",
            )
        return replace(params, max_new_tokens=min(params.max_new_tokens, room))

    @staticmethod
    def _episode_params(
        episode: Episode, asked: SamplingParams, prepared: Prepared
    ) -> SamplingParams:
        """The sampling of an episode's request: the run's, within the request's limits. A
        request that goes on past the episode's budget is refused, as the rollout ends an
        episode whose tokens reach `max_tokens` (its first request never is)."""
        prompt = len(prepared.prompt)
        if episode.max_tokens is not None and prepared.continued and prompt >= episode.max_tokens:
            episode.truncated = True
            raise BadRequest(
                "messages",
                f"the episode has reached its budget of {episode.max_tokens} tokens "
                f"(sampling.max_episode_tokens); this request's prompt is {prompt}",
                code="context_length_exceeded",
            )
        if episode.params is None:
            return asked
        run = episode.params
        limit = min(asked.max_new_tokens, run.max_new_tokens)
        return replace(
            asked,
            temperature=run.temperature,
            top_p=run.top_p,
            max_new_tokens=limit,
            stop=tuple(dict.fromkeys((*asked.stop, *run.stop))),
        )

    @staticmethod
    def _note(episode: Episode, body: dict[str, Any], reply: ChatMessage, gen: Generation) -> None:
        """Keeps what the episode's trajectory and judge need of a recorded turn."""
        episode.requests += 1
        episode.tool_calls += len(reply.tool_calls)
        episode.finish_reason = gen.finish_reason
        answer: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.tool_calls:
            answer["tool_calls"] = [c.openai() for c in reply.tool_calls]
        episode.conversation = [*body["messages"], answer]

    def recorder(self) -> EpisodeRecorder:
        """A new recorder of an episode's requests, in the service's tool format."""
        return EpisodeRecorder(self.tokenizer, self.format, self.native, self.turn_end)

    def _opening(self, request: ChatRequest) -> str:
        """The forced start of the reply: a call's opening under tool_choice "required"
        or a named function; "" otherwise."""
        if request.tool_choice in ("auto", "none"):
            return ""
        return call_opening(
            self.format, None if request.tool_choice == "required" else request.tool_choice
        )

    def _streams(self, request: ChatRequest, recording: Episode | None) -> list[int]:
        """The random stream of each choice: the episode's, the seed's, or fresh ones."""
        if recording is not None and recording.streams is not None:
            return [recording.streams(recording.requests)]
        if request.seed is not None:
            return [request_stream(request.seed, i) for i in range(request.n)]
        return [secrets.randbits(64) for _ in range(request.n)]

    def _reply(self, request: ChatRequest, text: str, gen: Generation) -> tuple[ChatMessage, str]:
        """The assistant message of a sampled turn and its finish reason."""
        for stop in request.params.stop:
            if gen.finish_reason == "stop" and text.endswith(stop):
                text = text[: -len(stop)]
                break
        if request.tool_choice != "none" and request.tools:
            parsed = self.format.parse(text, truncated=gen.finish_reason == "length")
            if parsed.calls and all(a.call is not None for a in parsed.calls):
                calls = tuple(
                    Call(f"call_{uuid.uuid4().hex[:24]}", a.call.name, dict(a.call.arguments))
                    for a in parsed.calls
                    if a.call is not None
                )
                return ChatMessage("assistant", self._preamble(text), calls), "tool_calls"
        finish = "length" if gen.finish_reason == "length" else "stop"
        return ChatMessage("assistant", text), finish

    def _preamble(self, text: str) -> str:
        """The text of a turn before its first call."""
        marker = call_opening(self.format, None).split("\n")[0].strip()
        at = text.find(marker) if marker else -1
        return text[:at].strip() if at > 0 else ""

    def _choice(
        self, index: int, message: ChatMessage, finish: str, gen: Generation, logprobs: bool
    ) -> dict[str, Any]:
        reply: dict[str, Any] = {"role": "assistant", "content": message.content or None}
        if message.tool_calls:
            reply["tool_calls"] = [c.openai() for c in message.tool_calls]
        choice: dict[str, Any] = {"index": index, "message": reply, "finish_reason": finish}
        choice["logprobs"] = {"content": self._logprobs(gen)} if logprobs else None
        return choice

    def _logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        out = []
        for token, logprob in zip(gen.ids, gen.logprobs, strict=True):
            text: str = self.tokenizer.decode([token])  # type: ignore[assignment]
            out.append(
                {
                    "token": text,
                    "logprob": logprob,
                    "bytes": list(text.encode()),
                    "top_logprobs": [],
                }
            )
        return out
