"""Attacks on `agentgym serve` (issue 53, item 1, the request checks): each request is held
to the model's context and to the server's limits (`ServeLimits`: --max-tokens, --max-n,
--max-body-bytes, --max-json-depth) with OpenAI-shaped 400s before any work; types are
strict. Before: a prompt past the context was computed (1 MB: busy past 490 s); max_tokens
up to 2^20 and n up to 128 were accepted; deeply nested JSON was a 500 text/plain
RecursionError; "logprobs": "false" turned logprobs on."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_serve import HI, Recording, _client, serve  # noqa: F401  (a fixture)

from agentgym.policy.hf import HFPolicy
from agentgym.serve.requests import ServeLimits


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, dict, float]:
    """POSTs raw bytes to the chat endpoint: status, JSON body, seconds (and, given a dict
    `headers`, the reply's headers put in it)."""
    request = urllib.request.Request(
        f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            (headers if headers is not None else {}).update(response.headers)
            return response.status, json.loads(response.read()), time.monotonic() - started
    except urllib.error.HTTPError as err:
        (headers if headers is not None else {}).update(err.headers)
        return err.code, json.loads(err.read()), time.monotonic() - started


def _ask(**fields) -> bytes:
    return json.dumps({"model": "tiny-random", "messages": HI, **fields}).encode()


@pytest.fixture
def server(serve, tiny):  # noqa: F811
    policy = Recording(HFPolicy(*tiny))
    server, _ = serve(policy, limits=ServeLimits(max_tokens=64, max_n=2, max_body_bytes=1 << 16))
    return server, policy


def _refused(status: int, reply: dict, param, words: str) -> None:
    assert status == 400, reply
    error = reply["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"], error["message"]


def test_a_prompt_past_the_models_context_is_refused_naming_both_numbers(server, tiny):
    url, policy = server[0].url, server[1]
    context = tiny[0].config.max_position_embeddings
    long = [{"role": "user", "content": "hi " * context}]
    status, reply, seconds = _post(url, _ask(messages=long))
    _refused(status, reply, "messages", f"maximum context length is {context} tokens")
    assert reply["error"]["code"] == "context_length_exceeded" and policy.calls == []
    # a short prompt asking for more than the context leaves: refused too, both numbers named
    status, reply, _ = _post(
        url, _ask(max_tokens=64, messages=[{"role": "user", "content": "hi " * (context - 40)}])
    )
    _refused(status, reply, "messages", "asks for 64 more")
    assert policy.calls == []


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"max_tokens": 1 << 20}, "max_tokens", "from 1 to 64"),
        ({"max_completion_tokens": 65}, "max_completion_tokens", "from 1 to 64"),
        ({"n": 128}, "n", "from 1 to 2"),
        ({"logprobs": "false"}, "logprobs", "must be true or false, got 'false'"),
        ({"stream": 1}, "stream", "must be true or false, got 1"),
    ],
)
def test_what_a_request_asks_is_held_to_the_servers_limits(server, fields, param, words):
    status, reply, _ = _post(server[0].url, _ask(**fields))
    _refused(status, reply, param, words)
    assert server[1].calls == []


def test_a_body_past_the_size_limit_is_refused_before_it_is_parsed(server):
    big = _ask(messages=[{"role": "user", "content": "x" * (1 << 17)}])
    status, reply, _ = _post(server[0].url, big)
    _refused(status, reply, None, "takes at most 65536 (--max-body-bytes)")
    assert reply["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("depth", [100, 30_000])
def test_deeply_nested_json_is_a_400_not_a_500(server, depth):
    body = b'{"model": "tiny-random", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    status, reply, _ = _post(server[0].url, body)
    assert status == 400 and "nests" in reply["error"]["message"]


def test_after_the_attacks_the_server_still_answers(server):
    client = _client(server[0].url)
    for body in (_ask(n=128), b"[" * 60_000, _ask(logprobs="false")):
        _post(server[0].url, body)
    reply = client.chat.completions.create(model="tiny-random", messages=HI, max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_an_unknown_model_id_is_a_404_as_openai_answers_it(server):
    status, reply, _ = _post(server[0].url, _ask(model="gpt-4o"))
    assert status == 404, reply
    error = reply["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "model_not_found",
        "model",
        "invalid_request_error",
    )
    assert "'gpt-4o' does not exist; this server serves 'tiny-random'" in error["message"]
    assert _post(server[0].url, _ask())[0] == 200  # the served id, as /v1/models lists it
    assert _post(server[0].url, _ask(model=""))[0] == 200  # none named: the served one


class Held(Recording):
    """The real policy, whose `generate` waits until `release` is set."""

    def __init__(self, inner: HFPolicy, release: threading.Event):
        super().__init__(inner)
        self.release = release

    def generate(self, prompts, params, streams=None):
        assert self.release.wait(60)
        return super().generate(prompts, params, streams)


def test_past_max_waiting_a_request_is_a_429_with_retry_after_and_the_next_is_served(serve, tiny):  # noqa: F811
    release = threading.Event()
    server, _ = serve(Held(HFPolicy(*tiny), release), limits=ServeLimits(max_waiting=1))
    first: list = []
    holder = threading.Thread(target=lambda: first.append(_post(server.url, _ask(max_tokens=2))))
    holder.start()
    time.sleep(1.0)  # the first request holds the only place, its generate waiting
    headers: dict = {}
    status, reply, took = _post(server.url, _ask(max_tokens=2), headers)
    assert status == 429 and took < 5, reply
    assert (
        reply["error"]["code"] == "rate_limit_exceeded"
        and "--max-waiting" in reply["error"]["message"]
    )
    assert headers.get("retry-after") == "1"
    release.set()
    holder.join(60)
    assert first[0][0] == 200
    assert _post(server.url, _ask(max_tokens=2))[0] == 200  # its place is free again


def test_a_client_that_goes_away_has_its_sampling_cancelled_within_a_step(serve, tiny):  # noqa: F811
    """Before: 20 dropped requests were all computed, and the next waited 213 s. Greedy
    8 x 2000 tokens take about 4 s on tiny-random; the client leaves after 1 s."""
    import httpx

    policy = Recording(HFPolicy(*tiny))
    server, _ = serve(policy)
    body = _ask(n=8, max_tokens=2000, temperature=0.0)
    left = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/chat/completions", content=body, timeout=1.0)
    while len(policy.calls) < 8 and time.monotonic() - left < 30:
        time.sleep(0.05)
    lengths = [len(g.ids) for _, g in policy.calls]
    assert len(lengths) == 8 and 0 < max(lengths) < 2000, lengths
    assert {g.finish_reason for _, g in policy.calls} == {"length"}
    assert _post(server.url, _ask(max_tokens=2))[0] == 200


def test_a_requests_cache_grows_with_what_it_generates_and_samples_the_same(tiny, monkeypatch):
    """Before: the cache reserved prompt + max_tokens up front (n = 4, max_tokens 2^20:
    +2.1 GB before the first token). Now 512 ahead, doubling as it fills; greedy ids and
    logprobs past that are bit for bit those of a cache that reserved everything."""
    from agentgym.policy import kv_cache
    from agentgym.policy.base import SamplingParams

    policy = HFPolicy(*tiny)
    cache, *_ = policy.prefill([[5, 6, 7]], 1 << 20)
    assert {layer._keys.shape[-2] for layer in cache.layers} == {3 + 512}
    params = SamplingParams(max_new_tokens=1300, temperature=0.0)
    grown = policy.generate([HI_IDS, HI_IDS[:5]], params)
    monkeypatch.setattr(kv_cache, "RESERVED_AHEAD", 1 << 20)
    reserved = policy.generate([HI_IDS, HI_IDS[:5]], params)
    assert [len(g.ids) for g in grown] == [1300, 1300]  # greedy tiny-random runs to the cap
    assert grown == reserved


HI_IDS = [11, 42, 7, 99, 3, 250, 17, 64]


class Unallocatable(Recording):
    """The real policy, except that a request for more than 1000 tokens makes a real
    allocation that fails (32 TiB), as a batch past the machine's memory does."""

    def generate(self, prompts, params, streams=None):
        if params.max_new_tokens > 1000:
            import torch

            torch.empty(1 << 45, dtype=torch.uint8)
        return super().generate(prompts, params, streams)


def test_an_allocation_that_fails_is_a_503_for_that_request_and_the_server_goes_on(serve, tiny):  # noqa: F811
    server, _ = serve(Unallocatable(HFPolicy(*tiny)))
    headers: dict = {}
    status, reply, _ = _post(server.url, _ask(max_tokens=1500), headers)
    assert status == 503 and reply["error"]["code"] == "out_of_memory", reply
    assert "failed to allocate memory" in reply["error"]["message"]
    assert headers.get("retry-after") == "1"
    assert _post(server.url, _ask(max_tokens=2))[0] == 200


def test_text_past_what_the_context_can_hold_is_refused_before_it_is_tokenized(serve, tiny):  # noqa: F811
    """tiny-random: 2048 tokens of context, at most 16 characters a token."""
    server, _ = serve(Recording(HFPolicy(*tiny)))
    big = json.dumps(
        {"model": "tiny-random", "messages": [{"role": "user", "content": "x" * 40_000}]}
    )
    status, reply, _ = _post(server.url, big.encode())
    _refused(status, reply, "messages", "messages have 40000 characters, at least 2500 tokens")
    assert reply["error"]["code"] == "context_length_exceeded"


def test_of_requests_taken_together_the_shorter_are_sampled_first(tiny):
    from agentgym.policy.base import SamplingParams
    from agentgym.serve.engine import Engine

    policy = Recording(HFPolicy(*tiny))
    engine = Engine(policy, gather_s=0.5, gather_max_s=1.0)
    try:
        long = engine.submit(HI_IDS, SamplingParams(max_new_tokens=300, temperature=0.0), 1)
        short = engine.submit(HI_IDS[:4], SamplingParams(max_new_tokens=3, temperature=0.0), 2)
        assert len(short.result(60)[0].ids) == 3 and len(long.result(60)[0].ids) == 300
    finally:
        engine.close()
    assert [len(p) for p, _ in policy.calls] == [4, 8]  # the short prompt's call came first


def test_served_continuously_a_short_request_does_not_wait_for_a_long_one(tiny):
    """`agentgym serve`'s engine (continuous): a short request submitted while a long one
    decodes ends long before it, and both sample what `generate` samples for their streams
    (greedy, so the ids are exact)."""
    from agentgym.policy.base import SamplingParams
    from agentgym.serve.engine import Engine

    policy = HFPolicy(*tiny)
    engine = Engine(policy, continuous=True)
    assert engine.continuous
    long_params = SamplingParams(max_new_tokens=1500, temperature=0.0)
    short_params = SamplingParams(max_new_tokens=5, temperature=0.0)
    try:
        long = engine.submit(HI_IDS, long_params, 1)
        time.sleep(0.5)  # it decodes
        short = engine.submit(HI_IDS[:4], short_params, 2)
        (gen, _) = short.result(60)
        assert not long.done(), "the short request waited for the long one"
        (long_gen, _) = long.result(120)
        dropped = engine.submit(HI_IDS, long_params, 3)
        time.sleep(0.3)
        dropped.cancel()
        assert engine.submit(HI_IDS[:4], short_params, 4).result(60)[0] == gen
    finally:
        engine.close()
    assert gen == policy.generate([HI_IDS[:4]], short_params)[0]
    assert long_gen == policy.generate([HI_IDS], long_params)[0]
