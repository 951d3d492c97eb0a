"""`agentgym/OpenEnv-v0`: an OpenEnv server, given by URL, played as an agentgym environment.

Each environment holds one WebSocket connection to the server's `/ws` route, opened at the
first reset and kept for its episodes: OpenEnv's HTTP `/reset` and `/step` make a fresh
environment per request, so only the socket carries an episode. G copies of the env (one
per episode of a group) hold G sessions; a server that allows fewer refuses the rest with
a `CAPACITY_REACHED` frame, which fails here naming the server and its limit (no retry).
A server that stops answering (no reply in `timeout_s`, the socket closed) fails the
episode with an `OpenEnvError`; agentgym's failure policy counts it as it counts any env
exception. The client is the `websockets` library's synchronous one: the protocol is a few
JSON frames (`frames.py`), and openenv-core's client would bring its whole dependency set
(gradio, fastmcp) and an event-loop thread per environment to every user of this env.

Tasks: the server chooses its task from the reset's seed, so a task is a seed. Task
`train/<i>` resets with seed `i`; `test/<i>` with seed `TEST_SEEDS_FROM + i`, so the two
splits are disjoint wherever the server's task is a function of its seed (and the same
seed gives the same task, as GRPO's groups need, only where the server is seeded).

The action is `{action_field: text}` (`{"message": text}` by default); the observation is
rendered as chat messages by `frames.render_observation`; each step's reward is the
server's, as the reward part `openenv`; `done` ends the episode.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from agentgym.env.core import AgentEnv, Feedback, Split, Task
from agentgym.envs.openenv.frames import OpenEnvError, Reply, read_frame, render_observation
from agentgym.envs.openenv.launch import LAUNCHER, Source, folder_app, require_image
from agentgym.extras import require
from agentgym.types import Message

require("websockets", "agentgym/OpenEnv-v0")  # before its import: the error names the extra
from websockets.exceptions import WebSocketException  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

TEST_SEEDS_FROM = 1_000_000
"""The seed of test task 0; train task i is seed i (train_tasks stays below this)."""


class OpenEnvEnv(AgentEnv):
    """Any OpenEnv server (by URL), its episode played over its WebSocket route.

    Args:
        url: The server, e.g. "http://127.0.0.1:8000" (ws:// and wss:// too).
        folder: Or an OpenEnv environment's folder (its `openenv.yaml` names the app), run
            here under uvicorn (`launch.py`).
        image: Or a Docker image on this machine serving on `image_port` (nothing pulled).
        sessions_per_server: How many episodes one started server holds at once (folder or
            image); one more starts another server.
        start_timeout_s: How long a started server may take to answer `/health`.
        action_field: The action's field that carries the agent's text.
        observation_field: The observation's field that holds the text the agent reads;
            None: `messages` where they are chat messages, else the one field, else JSON.
        train_tasks, test_tasks: How many seeds each split holds.
        solved_at: Where given, an episode whose summed reward reaches it when the server
            ends it is solved: the reward part `correctness` is 1 at that step (else 0),
            which held-out evaluation's correctness and pass@k read. None: no such part.
        timeout_s: How long a reply may take before the episode fails.
        connect_timeout_s: How long opening the socket may take.
        api_key: Sent as `Authorization: Bearer <key>` (`agentgym serve-env --api-key`).
        system_prompt, render_mode: As for `AgentEnv`.
    """

    def __init__(
        self,
        url: str | None = None,
        folder: str | None = None,
        image: str | None = None,
        image_port: int = 8000,
        sessions_per_server: int = 1,
        start_timeout_s: float = 60.0,
        action_field: str = "message",
        observation_field: str | None = None,
        train_tasks: int = 10_000,
        test_tasks: int = 1_000,
        solved_at: float | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        system_prompt: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__(system_prompt, render_mode)
        given = [
            name for name, value in [("url", url), ("folder", folder), ("image", image)] if value
        ]
        if len(given) != 1:
            raise ValueError(
                "agentgym/OpenEnv-v0 plays one server: give one of run.env_kwargs.url (a "
                "running server, --set run.env_kwargs.url=http://127.0.0.1:8000), .folder (an "
                f"OpenEnv environment's folder) or .image (a local Docker image); given: {given}"
            )
        if sessions_per_server < 1:
            raise ValueError(f"sessions_per_server={sessions_per_server}; valid: 1 or more")
        if not 0 < train_tasks <= TEST_SEEDS_FROM or test_tasks <= 0:
            raise ValueError(
                f"train_tasks={train_tasks}, test_tasks={test_tasks}: each must be positive, "
                f"train_tasks at most {TEST_SEEDS_FROM}"
            )
        self.source: Source | None = None
        if folder:
            folder_app(Path(folder))  # a folder that cannot serve fails here, not per episode
            self.source = Source(Path(folder).resolve(), None, image_port, start_timeout_s)
        elif image:
            require_image(image)  # before any model loads, not at the first episode
            self.source = Source(None, image, image_port, start_timeout_s)
        self.sessions_per_server = sessions_per_server
        self.url = (url or "").rstrip("/")
        self.action_field, self.observation_field = action_field, observation_field
        self.tasks = {"train": train_tasks, "test": test_tasks}
        self.solved_at, self._earned = solved_at, 0.0
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.api_key = api_key
        self._socket: ClientConnection | None = None
        self._opened = contextlib.ExitStack()  # websockets wants its connect() entered

    # -- tasks: seeds --------------------------------------------------------------

    def num_tasks(self, split: Split) -> int:
        return self.tasks[split]

    def task_id(self, split: Split, index: int) -> str:
        if not 0 <= index < self.tasks[split]:
            raise IndexError(f"task index {index} out of range 0..{self.tasks[split] - 1}")
        return f"{split}/{index}"

    def load_task(self, task_id: str) -> Task:
        split, _, index = task_id.partition("/")
        if split not in self.tasks or not index.isdigit() or int(index) >= self.tasks[split]:
            raise KeyError(
                f"no task {task_id!r} in agentgym/OpenEnv-v0: ids are 'train/<i>' "
                f"(i < {self.tasks['train']}) and 'test/<i>' (i < {self.tasks['test']})"
            )
        seed = int(index) + (TEST_SEEDS_FROM if split == "test" else 0)
        where = self.url or (self.source.name if self.source else "")
        prompt = f"{where} reset(seed={seed})"  # the server writes the real prompt
        return Task(task_id, prompt, metadata={"split": split, "seed": seed})

    # -- the episode, over the socket ------------------------------------------------

    def initial_messages(self, task: Task) -> list[Message]:
        """Resets the server's environment with the task's seed; its observation opens."""
        reply = self._exchange({"type": "reset", "data": {"seed": task.metadata["seed"]}})
        opening = [Message("system", self.system_prompt)] if self.system_prompt else []
        self._earned = 0.0
        return [*opening, *render_observation(reply.observation, self.observation_field)]

    def respond(self, action: str) -> Feedback:
        reply = self._exchange({"type": "step", "data": {self.action_field: str(action)}})
        messages = render_observation(reply.observation, self.observation_field)
        parts = {"openenv": reply.reward}
        if self.solved_at is not None:
            self._earned += reply.reward
            parts["correctness"] = float(reply.done and self._earned >= self.solved_at)
        return Feedback(tuple(messages), reply.reward, parts, reply.done)

    def _exchange(self, message: dict[str, Any]) -> Reply:
        """Sends one frame and reads the server's answer; any failure closes the socket (the
        next reset opens a new one) and raises OpenEnvError naming the server."""
        try:
            socket = self._connect()
            # a refusing server closes at once: its error frame may still be read
            with contextlib.suppress(WebSocketException):
                socket.send(json.dumps(message))
            return read_frame(socket.recv(timeout=self.timeout_s), self.url)
        except TimeoutError:
            self._drop()
            raise OpenEnvError(
                f"OpenEnv server {self.url} did not answer a {message['type']} in "
                f"{self.timeout_s:g} s (run.env_kwargs.timeout_s)"
            ) from None
        except (WebSocketException, OSError) as err:
            self._drop()
            raise OpenEnvError(
                f"OpenEnv server {self.url} failed during a {message['type']}: {err}"
            ) from None
        except OpenEnvError:
            self._drop()
            raise

    def _connect(self) -> ClientConnection:
        if self.source is not None and not self.url:
            self.url = LAUNCHER.claim(self.source, self.sessions_per_server)
        if self._socket is None:
            base = self.url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            self._socket = self._opened.enter_context(
                connect(
                    f"{base}/ws",
                    open_timeout=self.connect_timeout_s,
                    close_timeout=1.0,
                    additional_headers=headers,
                    max_size=None,
                )
            )
        return self._socket

    def _drop(self) -> None:
        self._socket = None
        self._opened.close()

    def close(self) -> None:
        """Ends the server's session (a `close` frame) and the socket."""
        if self._socket is not None:
            with contextlib.suppress(WebSocketException):  # already gone: nothing to end
                self._socket.send(json.dumps({"type": "close"}))
        self._drop()
        if self.source is not None and self.url:
            LAUNCHER.release(self.source, self.url)
            self.url = ""
        super().close()
