"""One thread samples for every request: requests that arrive together share forward passes.

HTTP handlers `submit` prompts and wait on futures; the engine's thread takes every prompt
waiting, and more while they keep arriving (until `gather_s` passes without one, or
`gather_max_s` after the first), and samples them in one `generate` call per set of
sampling parameters: 16 agents released together decode as one batch of 16.
A prompt that arrives while a batch decodes goes into the next one (the batch is not
joined mid-decode: the transformers backend decodes a batch to its end); of the sets taken
together, those asking fewer tokens are sampled first.

`version` is the policy version sampling now; the training loop sets it after each weight
sync, under `lock`, which `generate` holds too.

A request whose future is cancelled (its client went away) is dropped before it decodes,
and while it decodes at the next step (`Policy.cancelling`, the transformers backend). A
batch whose sampling fails fails its requests, never the engine: an allocation that fails
is `OutOfMemory` (the server answers 503), any other error is passed on as it is.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import replace

from agentgym.policy.base import Generation, Policy, SamplingParams, as_policy
from agentgym.serve.continuous import continuous_loop, serves_continuously
from agentgym.serve.pending import Pending, failed, settle


class Engine:
    """Samples the prompts submitted from any thread, batched, on its own thread.

    Args:
        policy: What samples; the engine is its only caller while it runs.
        gather_s: The quiet time that closes a batch: how long to wait for one more prompt.
        gather_max_s: The longest a batch's first prompt waits for others.
        max_batch: Most prompts in one `generate` call.
        continuous: Requests join and leave decoding at every step where the policy can
            (`agentgym.serve.continuous`: the transformers backend, no weight changes).
    """

    def __init__(
        self,
        policy: Policy,
        gather_s: float = 0.01,
        gather_max_s: float = 0.1,
        max_batch: int = 256,
        continuous: bool = False,
    ):
        self.policy = policy
        self.gather_s, self.gather_max_s, self.max_batch = gather_s, gather_max_s, max_batch
        self.version = 0
        self.lock = threading.Lock()
        self.batches: list[int] = []  # the size of each generate call made, in order
        self._queue: queue.Queue[Pending | None] = queue.Queue()
        self.continuous = continuous and serves_continuously(policy)
        loop = self._continuous if self.continuous else self._loop
        self._thread = threading.Thread(target=loop, name="agentgym-engine", daemon=True)
        self._thread.start()

    def submit(
        self, prompt: list[int], params: SamplingParams, stream: int
    ) -> Future[tuple[Generation, int]]:
        """A future of the completion of `prompt` and the policy version that sampled it.

        `stream` names the random stream of the completion (`Policy.generate`'s streams):
        the same stream and parameters give the same completion whatever else is batched.
        """
        if not self._thread.is_alive():
            raise RuntimeError("the engine is closed")
        pending = Pending(prompt, replace(params, seed=None), stream)
        self._queue.put(pending)
        return pending.future

    def close(self) -> None:
        """Stops the thread once the batch in progress is done; later submits raise."""
        self._queue.put(None)
        self._thread.join()

    def _take(self) -> tuple[list[Pending], bool]:
        """The next batch (blocking for its first prompt), and whether to stop after it."""
        first = self._queue.get()
        if first is None:
            return [], True
        batch, deadline = [first], time.monotonic() + self.gather_max_s
        while len(batch) < self.max_batch:
            wait = min(self.gather_s, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            batch, stop = self._take()
            groups: dict[SamplingParams, list[Pending]] = {}
            for item in batch:
                groups.setdefault(item.params, []).append(item)
            # the shortest first: a long request taken with short ones does not hold them up
            for params, items in sorted(groups.items(), key=lambda g: g[0].max_new_tokens):
                self._sample(params, items)
        self.fail_late()

    def _continuous(self) -> None:
        continuous_loop(self.policy, self._queue, self.lock, lambda: self.version)
        self.fail_late()

    def fail_late(self) -> None:
        """Prompts submitted while closing get an error, not a hang."""
        while True:
            try:
                late = self._queue.get_nowait()
            except queue.Empty:
                return
            if late is not None:
                settle(late.future, error=RuntimeError("the engine is closed"))

    def _sample(self, params: SamplingParams, items: list[Pending]) -> None:
        items = [i for i in items if not i.future.cancelled()]  # their clients went away
        if not items:
            return
        try:
            cancelled = as_policy(self.policy).cancelling(lambda k: items[k].future.cancelled())
            with self.lock, cancelled:
                self.batches.append(len(items))
                version = self.version
                gens = self.policy.generate(
                    [i.prompt for i in items], params, [i.stream for i in items]
                )
        except Exception as err:  # the requests fail; the engine goes on
            error = failed(err, items, params)
            for item in items:
                settle(item.future, error=error)
            return
        for item, gen in zip(items, gens, strict=True):
            settle(item.future, (gen, version))
