"""The HTTP side: FastAPI routes over a `ChatService`, and uvicorn run in a thread.

Routes: `GET /v1/models`, `POST /v1/chat/completions`, and the same under
`/episodes/<id>/v1/` for an episode being recorded (its requests are attributed by the path
and must bear the episode's key as their API key, which only its agent's client has: a
request on another episode's path is 403 and recorded nowhere; `--api-key` does not apply
there). A client that goes away has its sampling cancelled; a batch whose memory cannot be
allocated is 503 with Retry-After. Errors have OpenAI's shape, status 400
for a bad request (not FastAPI's 422), 401 for a wrong API key, 429 with Retry-After past
`max_waiting` requests at once (an episode's not counted), 404 for an episode path
not recording and for a model id the server does not serve (an episode's path takes any
name). A streamed reply (`stream: true`) is sent as server-sent events once the
completion is sampled: the content and the calls as one delta each, then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentgym.serve.pending import OutOfMemory
from agentgym.serve.requests import BadRequest, read_body, too_large
from agentgym.serve.service import ChatService, UnknownEpisode, UnknownModel, WrongEpisodeKey


def _error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    retry_after: bool = False,
) -> JSONResponse:
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    headers = {"Retry-After": "1"} if retry_after else None
    return JSONResponse({"error": body}, status_code=status, headers=headers)


class ClientGone(Exception):
    """The client closed its connection before its reply was ready."""


async def _unless_gone(request: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """`work`'s result; cancelled (and ClientGone raised) once the client disconnects: its
    sampling stops within a decode step (`agentgym.serve.engine`). The body has been read,
    so the next message the server receives for the request is its disconnect."""

    async def disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnect())
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        gone.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


def create_app(service: ChatService, api_key: str | None = None) -> FastAPI:
    """The OpenAI-compatible app over `service`; with `api_key`, every request must bear it
    (`Authorization: Bearer <key>`, as the `openai` client sends it)."""
    app = FastAPI(title="agentgym", docs_url=None, redoc_url=None, openapi_url=None)

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Response:
        on_episode = request.url.path.startswith("/episodes/")  # the episode's key is checked
        wrong = request.headers.get("authorization") != f"Bearer {api_key}"
        if api_key is not None and wrong and not on_episode:
            return _error(401, "wrong or missing API key", code="invalid_api_key")
        response: Response = await call_next(request)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _error(400, str(err))

    @app.get("/v1/models")
    @app.get("/episodes/{episode}/v1/models")
    async def models(episode: str | None = None) -> dict[str, Any]:
        return service.models()

    waiting = [0]  # requests off an episode's path, waiting or computing (one event loop)

    async def chat(request: Request, episode: str | None) -> Response:
        if episode is not None:  # an episode's requests: as many as its run plays at once
            return await _answer(service, request, episode)
        if waiting[0] >= service.limits.max_waiting:
            return _busy(service.limits.max_waiting)
        waiting[0] += 1
        try:
            return await _answer(service, request, None)
        finally:
            waiting[0] -= 1

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Response:
        return await chat(request, None)

    @app.post("/episodes/{episode}/v1/chat/completions")
    async def episode_completions(episode: str, request: Request) -> Response:
        return await chat(request, episode)

    return app


async def _answer(service: ChatService, request: Request, episode: str | None) -> Response:
    """The reply to a chat-completion request (on `episode`'s path, where given)."""
    limits = service.limits
    try:
        declared = request.headers.get("content-length") or "0"
        if declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise too_large(int(declared), limits)  # refused before it is read
        body = read_body(await request.body(), limits)
        bearer = request.headers.get("authorization", "")
        key = bearer.removeprefix("Bearer ") if bearer.startswith("Bearer ") else None
        reply = await _unless_gone(request, service.complete(body, episode, key))
    except ClientGone:  # none reads it
        return Response(status_code=499)
    except (BadRequest, UnknownEpisode, WrongEpisodeKey, UnknownModel, OutOfMemory) as err:
        return _refused(err, service.model_name, episode)
    if isinstance(body, dict) and body.get("stream"):
        return StreamingResponse(_events(reply), media_type="text/event-stream")
    return JSONResponse(reply)


def _refused(err: Exception, served: str, episode: str | None) -> JSONResponse:
    """The OpenAI-shaped answer to a request the service refused with `err`."""
    if isinstance(err, BadRequest):
        return JSONResponse(err.body(), status_code=400)
    if isinstance(err, UnknownEpisode):
        return _error(404, f"no episode {episode!r} is being recorded", code="unknown_episode")
    if isinstance(err, WrongEpisodeKey):
        why = f"the request does not bear episode {err.args[0]!r}'s key (its API key)"
        return _error(403, f"{why}; an agent calls its own episode only", code="wrong_episode")
    if isinstance(err, UnknownModel):
        why = f"The model {err.args[0]!r} does not exist; this server serves {served!r}"
        return _error(404, f"{why} (GET /v1/models)", param="model", code="model_not_found")
    # out of memory: this request fails; the server goes on
    return _error(503, str(err), code="out_of_memory", retry_after=True)


def _busy(most: int) -> JSONResponse:
    """OpenAI's 429: the server holds `most` requests already; the client retries later."""
    message = (
        f"the server is busy: {most} requests are waiting or computing (--max-waiting); "
        "retry after the Retry-After seconds"
    )
    body = {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    return JSONResponse({"error": body}, status_code=429, headers={"Retry-After": "1"})


async def _events(reply: dict[str, Any]) -> AsyncIterator[str]:
    """A completed reply as OpenAI's stream of chunks: per choice the role, the content,
    the calls, and the finish reason; then `[DONE]`."""
    head = {k: reply[k] for k in ("id", "created", "model")}
    for choice in reply["choices"]:
        message, index = choice["message"], choice["index"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if message.get("content"):
            deltas.append({"content": message["content"]})
        if message.get("tool_calls"):
            calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
            deltas.append({"tool_calls": calls})
        for delta in deltas:
            chunk = {"index": index, "delta": delta, "finish_reason": None, "logprobs": None}
            yield _event({**head, "object": "chat.completion.chunk", "choices": [chunk]})
        last = {"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}
        last["logprobs"] = choice.get("logprobs")
        yield _event({**head, "object": "chat.completion.chunk", "choices": [last]})
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Server:
    """uvicorn serving `app` on a thread; `port` 0 takes a free one. A context manager:
    the listener is closed when the block ends, however it ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="agentgym-serve", daemon=True)
        self.host = host
        self.port = port

    def start(self) -> Server:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise OSError(
                    f"cannot listen on {self.host}:{self.port}: the port is taken, or the "
                    "address is not this machine's"
                )
            self._thread.join(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        """The base URL an `openai` client takes: `http://host:port/v1`."""
        return f"http://{self.host}:{self.port}/v1"

    def episode_url(self, key: str) -> str:
        return f"http://{self.host}:{self.port}/episodes/{key}/v1"

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
