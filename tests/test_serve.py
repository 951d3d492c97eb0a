"""`agentgym serve`'s endpoint through the real `openai` client, on loopback: replies in
OpenAI's shape, tool calls read by the rollout's parsers, OpenAI-shaped 400s naming the
field, requests that arrive together batched, and episodes recorded as the exact ids the
policy saw and sampled.

`ScriptedTurns` (a named stand-in for a model) writes given texts, so that the tests of
how a reply is read can say what the model wrote; everything about sampling, batching and
recorded ids runs the real tiny-random model."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator

import openai
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym.policy.base import Generation, PolicyBase, SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.policy.turn_end import find_turn_end
from agentgym.rollout.episodes import continuation_ids, prompt_ids
from agentgym.serve.app import Server, create_app
from agentgym.serve.engine import Engine
from agentgym.serve.requests import BadRequest, read_request
from agentgym.serve.service import ChatService

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
MODEL = "tiny-random"  # the served id: a request naming another is a 404
HI = [{"role": "user", "content": "What is 2 + 3?"}]


class ScriptedTurns(PolicyBase):
    """A stand-in for a model: each prompt it is given gets the next of `turns`, ended with
    the template's turn end; every prompt it saw is kept."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns = tokenizer, list(turns)
        self.end = list(find_turn_end(tokenizer).ids)
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params: SamplingParams, streams=None) -> list[Generation]:
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False) + self.end
            out.append(Generation(tuple(ids), tuple(-0.5 for _ in ids), "stop"))
        return out

    def load_weights(self, named_tensors) -> None:
        raise NotImplementedError


class Recording(PolicyBase):
    """The real policy, with every prompt and generation it made kept, in order."""

    def __init__(self, inner: HFPolicy):
        self.inner, self.model = inner, inner.model
        self.calls: list[tuple[list[int], Generation]] = []

    def generate(self, prompts, params, streams=None):
        gens = self.inner.generate(prompts, params, streams)
        self.calls += [(list(p), g) for p, g in zip(prompts, gens, strict=True)]
        return gens

    def load_weights(self, named_tensors) -> None:
        self.inner.load_weights(named_tensors)

    def cancelling(self, cancelled):
        return self.inner.cancelling(cancelled)


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-random")


def _listening(port: int) -> bool:
    return any(
        c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
        for c in psutil.Process().net_connections(kind="tcp")
    )


@pytest.fixture
def serve(tiny) -> Iterator:
    """serve(policy, **service options) -> (server, service); all closed after the test,
    and no listener left."""
    opened = []

    def start(policy, **options):
        engine = Engine(policy)
        api_key = options.pop("api_key", None)
        service = ChatService(engine, tiny[1], "tiny-random", **options)
        server = Server(create_app(service, api_key)).start()
        opened.append((server, engine))
        return server, service

    yield start
    for server, engine in opened:
        server.close()
        engine.close()
        assert not _listening(server.port)


def _client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


def test_models_and_a_plain_reply_through_the_openai_client(serve, tiny):
    server, _ = serve(ScriptedTurns(tiny[1], ["The answer is 5."]))
    client = _client(server.url)
    assert [m.id for m in client.models.list()] == ["tiny-random"]
    reply = client.chat.completions.create(model=MODEL, messages=HI, logprobs=True)
    choice = reply.choices[0]
    assert choice.message.content == "The answer is 5."
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert [t.logprob for t in choice.logprobs.content] == [-0.5] * reply.usage.completion_tokens


def test_a_call_in_the_models_native_format_comes_back_as_tool_calls(serve, tiny):
    written = (
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    server, service = serve(ScriptedTurns(tiny[1], [written]))
    assert service.native  # tiny-random's template renders tools=: its own format
    reply = _client(server.url).chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    assert call.id.startswith("call_")


def test_the_tools_are_rendered_by_the_template_as_the_rollout_renders_them(serve, tiny):
    policy = ScriptedTurns(tiny[1], ["ok"])
    server, _ = serve(policy)
    _client(server.url).chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    assert policy.prompts == [prompt_ids(tiny[1], HI, [ADD])]


def test_a_text_format_lists_the_tools_in_the_system_message(serve, tiny):
    policy = ScriptedTurns(tiny[1], ['Action: add\nAction Input: {"a": 1, "b": 2}'])
    server, service = serve(policy, tool_format="react")
    reply = _client(server.url).chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    assert reply.choices[0].message.tool_calls[0].function.name == "add"
    text = tiny[1].decode(policy.prompts[0])
    assert (
        "Action Input" in text
        and '"name": "add"' in text
        and text.index("add") < text.index(HI[0]["content"])
    )


@pytest.mark.parametrize(
    "written",
    [
        '<tool_call>\n{"name": "add", "arguments": {"a": 2,',  # cut off
        "<tool_call>\nnot json\n</tool_call>",
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>',
    ],
)
def test_a_malformed_call_comes_back_as_content_never_an_error(serve, tiny, written):
    server, _ = serve(ScriptedTurns(tiny[1], [written]))
    reply = _client(server.url).chat.completions.create(model=MODEL, messages=HI, tools=[ADD])
    assert reply.choices[0].message.content == written
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


def test_tool_choice_none_shows_no_tools_and_reads_no_calls(serve, tiny):
    written = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    policy = ScriptedTurns(tiny[1], [written])
    server, _ = serve(policy)
    reply = _client(server.url).chat.completions.create(
        model=MODEL, messages=HI, tools=[ADD], tool_choice="none"
    )
    assert (
        reply.choices[0].message.content == written and reply.choices[0].message.tool_calls is None
    )
    assert policy.prompts == [prompt_ids(tiny[1], HI)]


@pytest.mark.parametrize(
    ("choice", "opening"),
    [
        ("required", '<tool_call>\n{"name": "'),
        (
            {"type": "function", "function": {"name": "add"}},
            '<tool_call>\n{"name": "add", "arguments": ',
        ),
    ],
)
def test_a_required_or_named_call_is_begun_for_the_model(serve, tiny, choice, opening):
    rest = {"required": 'add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'}.get(
        choice if isinstance(choice, str) else "", '{"a": 1, "b": 1}}\n</tool_call>'
    )
    policy = ScriptedTurns(tiny[1], [rest])
    server, _ = serve(policy)
    reply = _client(server.url).chat.completions.create(
        model=MODEL, messages=HI, tools=[ADD], tool_choice=choice
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 1}
    opened = prompt_ids(tiny[1], HI, [ADD]) + tiny[1].encode(opening, add_special_tokens=False)
    assert policy.prompts == [opened]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "5"}]}, "messages[0].tool_call_id"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_a_bad_request_is_a_400_in_openais_shape_naming_the_field(serve, tiny, change, param):
    server, _ = serve(ScriptedTurns(tiny[1], []))
    body = {"model": MODEL, "messages": HI, "tools": [ADD], **change}
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server.url).chat.completions.create(**body)
    assert caught.value.status_code == 400
    assert (
        caught.value.body["param"] == param and caught.value.body["type"] == "invalid_request_error"
    )
    assert param.split("[")[0].split(".")[0] in caught.value.body["message"]


def test_a_wrong_api_key_is_refused_and_the_right_one_served(serve, tiny):
    server, _ = serve(ScriptedTurns(tiny[1], ["fine"]), api_key="s3cret")
    with pytest.raises(openai.AuthenticationError):
        _client(server.url, "wrong").chat.completions.create(model=MODEL, messages=HI)
    reply = _client(server.url, "s3cret").chat.completions.create(model=MODEL, messages=HI)
    assert reply.choices[0].message.content == "fine"


def test_streaming_gives_the_same_reply_in_chunks(serve, tiny):
    written = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    server, _ = serve(ScriptedTurns(tiny[1], [written]))
    chunks = list(
        _client(server.url).chat.completions.create(
            model=MODEL, messages=HI, tools=[ADD], stream=True
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert content == "Sure."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("add", {"a": 2, "b": 3})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_n_samples_n_choices_each_with_its_own_stream(serve, tiny):
    server, _ = serve(HFPolicy(*tiny))
    reply = _client(server.url).chat.completions.create(
        model=MODEL, messages=HI, n=3, seed=7, max_tokens=12, temperature=1.0
    )
    texts = [c.message.content for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2] and len(set(texts)) == 3
    again = _client(server.url).chat.completions.create(
        model=MODEL, messages=HI, n=3, seed=7, max_tokens=12, temperature=1.0
    )
    assert [c.message.content for c in again.choices] == texts  # the seed names the streams


def test_requests_that_arrive_together_decode_in_one_batch(serve, tiny):
    model, tokenizer = tiny
    sizes: list[int] = []

    def count(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] == 1:  # a decode step: one new token per row
            sizes.append(ids.shape[0])

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        server, service = serve(HFPolicy(model, tokenizer))
        service.engine.gather_s = 1.0  # "together": within a second, on a busy machine too
        barrier = threading.Barrier(16)

        def agent(i: int) -> None:
            client = _client(server.url)
            barrier.wait()
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"count to {i}"}],
                max_tokens=8,
            )

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        handle.remove()
    assert sizes and sum(sizes) / len(sizes) >= 8, sizes
    assert sum(service.engine.batches) == 16


def test_an_episodes_requests_are_one_sample_of_exactly_the_ids_sampled(serve, tiny):
    model, tokenizer = tiny
    policy = Recording(HFPolicy(model, tokenizer))
    server, service = serve(policy)
    key = service.open_episode()
    client = _client(server.episode_url(key), service.episodes[key].token)
    messages = list(HI)
    for turn in range(3):
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, tools=[ADD], max_tokens=10
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"and then? ({turn})"})
    (sample,) = service.close_episode(key).recorder.samples
    assert len(policy.calls) == 3 and len(sample.spans) == 3
    for (prompt, gen), (start, end) in zip(policy.calls, sample.spans, strict=True):
        assert sample.tokens[:start] == prompt  # what the policy saw, token for token
        assert tuple(sample.tokens[start:end]) == gen.ids  # what it sampled, never re-tokenized
        assert tuple(sample.logprobs[start:end]) == gen.logprobs
    sampled = {i for s, e in sample.spans for i in range(s, e)}
    assert [i for i, m in enumerate(sample.loss_mask) if m] == sorted(sampled)
    assert all(v == (0 if i in sampled else -1) for i, v in enumerate(sample.versions))
    assert sample.prompt_length == len(prompt_ids(tokenizer, HI, [ADD]))
    # counted as the rollout counts (tokens/checked, tokens/resampled), an error where any differ
    from agentgym.serve.agents import _check_sampled

    assert sample.sampled == [gen.ids for _, gen in policy.calls]
    assert _check_sampled([sample], "t", 0) == (sum(len(g.ids) for _, g in policy.calls), 0)
    start, _ = sample.spans[1]
    sample.tokens[start] += 1
    with pytest.raises(AssertionError, match="episode 't' .*sample 0, turn 1: 1 of the ids"):
        _check_sampled([sample], "t", 0)


def test_between_turns_only_the_new_messages_are_rendered_as_the_rollout_renders_them(serve, tiny):
    tokenizer = tiny[1]
    written = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    policy = ScriptedTurns(tokenizer, [written, "It is \\boxed{5}."])
    server, service = serve(policy)
    key = service.open_episode()
    client = _client(server.episode_url(key), service.episodes[key].token)
    first = client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD]).choices[0].message
    call = first.tool_calls[0]
    history = [
        *HI,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    client.chat.completions.create(model=MODEL, messages=history, tools=[ADD])
    (sample,) = service.close_episode(key).recorder.samples
    # the rollout's continuation of the same conversation: a tool message named by its call
    template = [*HI, {"role": "assistant", "content": written}]
    glue = continuation_ids(
        tokenizer, template, [{"role": "tool", "content": "5", "name": "add"}], True, [ADD]
    )
    assert (
        policy.prompts[1]
        == policy.prompts[0] + sample.tokens[sample.spans[0][0] : sample.spans[0][1]] + glue
    )


def test_an_edited_history_starts_a_new_sample(serve, tiny):
    policy = ScriptedTurns(tiny[1], ["one", "two", "three"])
    server, service = serve(policy)
    key = service.open_episode()
    client = _client(server.episode_url(key), service.episodes[key].token)
    first = client.chat.completions.create(model=MODEL, messages=HI).choices[0].message
    grown = [*HI, first.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    client.chat.completions.create(model=MODEL, messages=grown)
    summarised = [{"role": "user", "content": "Summary: 2 + 3, said one and two. Go on."}]
    client.chat.completions.create(model=MODEL, messages=summarised)
    recorder = service.close_episode(key).recorder
    assert [len(s.spans) for s in recorder.samples] == [2, 1] and recorder.split_samples == 1
    assert recorder.samples[1].tokens[: recorder.samples[1].prompt_length] == prompt_ids(
        tiny[1], summarised
    )


def test_an_unknown_episode_path_is_a_404(serve, tiny):
    server, _ = serve(ScriptedTurns(tiny[1], []))
    with pytest.raises(openai.NotFoundError):
        _client(server.url.replace("/v1", "/episodes/nope/v1")).chat.completions.create(
            model=MODEL, messages=HI
        )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_agentgym_serve_answers_the_client_and_sigterm_closes_its_port(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "agentgym",
        "serve",
        "--model",
        "tiny-random",
        "--port",
        str(port),
        "--threads",
        "1",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = _client(f"http://127.0.0.1:{port}/v1")
        deadline = time.monotonic() + 120
        while True:
            try:
                assert [m.id for m in client.models.list()] == ["tiny-random-v1"]
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.5)
        reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4)
        assert reply.usage.completion_tokens <= 4
        assert psutil.Process(proc.pid).net_connections(kind="tcp")  # it listens
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert f"127.0.0.1:{port}/v1 (native tool calls; decode threads: 1)" in proc.stdout.read()
        assert not any(
            c.laddr.port == port and c.status == psutil.CONN_LISTEN
            for c in psutil.net_connections("tcp")
        )
    finally:
        proc.kill()


def test_agentgym_serve_refuses_a_bad_port_before_loading_a_model():
    from agentgym.cli import main

    assert main(["serve", "--model", "tiny-random", "--port", "70000"]) == 2
    assert main(["serve", "--model", "tiny-random", "--threads", "0"]) == 2


def test_serve_decodes_on_all_cores_but_one_unless_told(monkeypatch):
    """One core is left to the HTTP server and tokenizer (torch's OpenMP threads stall
    when one of them is preempted); --threads, then OMP_NUM_THREADS, say otherwise."""
    from agentgym.serve.endpoint import decode_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores, threads in ((1, 1), (2, 1), (16, 15)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _, n=cores: set(range(n)))
        assert decode_threads(None) == threads
    assert decode_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert decode_threads(None) == 4
    assert decode_threads(2) == 2


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = [
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "stream",
    "model",
]
message_like = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]),
        "content": json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
    messages=st.none() | st.lists(message_like, max_size=4),
)
def test_any_request_body_is_read_or_refused_as_a_bad_request(body, messages):
    if messages is not None:
        body = {**body, "messages": messages}
    try:
        request = read_request(body, 16)
    except BadRequest as err:
        assert err.param is None or err.param.split("[")[0].split(".")[0] in FIELDS
        return
    assert request.messages and request.params.max_new_tokens >= 1


def test_the_server_listens_on_loopback_only(serve, tiny):
    server, _ = serve(ScriptedTurns(tiny[1], []))
    (listener,) = [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == server.port
    ]
    assert listener.laddr.ip == "127.0.0.1"


def _serving(port: int, grace_s: float):
    """`agentgym serve --model tiny-random` in a process, once it answers /v1/models."""
    import subprocess
    import sys
    import time

    env = {**os.environ, "AGENTGYM_SERVE_GRACE_S": str(grace_s)}
    command = [sys.executable, "-m", "agentgym", "serve", "--model", "tiny-random",
               "--port", str(port)]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    client, deadline = _client(f"http://127.0.0.1:{port}/v1"), time.monotonic() + 120
    while True:
        try:
            client.models.list()
            return proc, client
        except openai.APIConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.5)


def _computing(client) -> None:
    """Work that outlasts any grace in these tests, in threads: four greedy requests of
    8 x 2000 tokens (greedy, so none ends early on a sampled end-of-text; one alone
    takes about 4 s on tiny-random, and they queue behind each other)."""
    import threading

    def ask() -> None:
        with contextlib.suppress(openai.APIError):
            client.chat.completions.create(
                model=MODEL, messages=HI, n=8, max_tokens=2000, temperature=0.0
            )

    for _ in range(4):
        threading.Thread(target=ask, daemon=True).start()


@pytest.mark.parametrize("second", [None, "SIGINT"])
def test_sigterm_while_a_request_computes_stops_in_bounded_time_a_second_signal_at_once(second):
    import signal
    import time

    proc, client = _serving(_free_port(), grace_s=3)
    try:
        _computing(client)
        time.sleep(1)  # the engine is decoding them
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        if second is None:
            assert proc.wait(timeout=60) == 0
            took = time.monotonic() - stopped
            said = proc.stdout.read()
            assert "requests still computing 3 s after the stop; exiting without them" in said
            assert took < 3 + 10, took
        else:
            time.sleep(0.5)
            proc.send_signal(getattr(signal, second))
            assert proc.wait(timeout=10) == 128 + getattr(signal, second)
            assert time.monotonic() - stopped < 3, "the second signal waited for the grace"
            assert "SIGINT again: exiting now" in proc.stdout.read()
    finally:
        proc.kill()
