"""The engine's continuous mode (`agentgym serve` on the transformers backend): requests
join and leave decoding at every step, so a long request cannot hold up short ones.

Requests with the same sampling parameters share one turn stream (`HFTurnStream`: rows
join the running batch as they arrive and leave it as they end); the streams of different
parameters are stepped in turn, one decode step each. A short request that arrives while a
long one decodes starts at the next step and ends after its own tokens, the long one's
steps interleaved. A request whose future is cancelled (its client went away) leaves its
stream at the next step. Each row draws from its own random stream at its own index, as
`HFPolicy.generate` does, so what it samples does not depend on its neighbours.

Only where no weights change while it serves (a completion here may span many steps, and
one version is recorded for it): the training loop's endpoint samples batch by batch.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

from agentgym.policy.base import Policy, SamplingParams
from agentgym.policy.hf import HFPolicy
from agentgym.policy.hf_turns import HFTurnStream, evaluating
from agentgym.serve.pending import Pending, failed, settle


def serves_continuously(policy: object) -> bool:
    """Whether the engine can serve `policy` continuously: the transformers backend."""
    return isinstance(policy, HFPolicy)


def continuous_loop(
    policy: Policy,
    requests: queue.Queue[Pending | None],
    lock: threading.Lock,
    version: Callable[[], int],
) -> None:
    """Samples the `requests` step by step until None arrives and the live ones end; each
    step under `lock`, each completion stamped with `version()`."""
    assert isinstance(policy, HFPolicy)  # serves_continuously
    streams: dict[SamplingParams, HFTurnStream] = {}
    live: dict[int, Pending] = {}
    keys, closing = itertools.count(), False
    with evaluating(policy.model):
        while not (closing and not live):
            for item in _arrived(requests, block=not live and not closing):
                if item is None:
                    closing = True
                elif closing:
                    settle(item.future, error=RuntimeError("the engine is closed"))
                elif not item.future.cancelled():
                    key = next(keys)
                    live[key] = item
                    stream = streams.get(item.params)
                    if stream is None:
                        stream = streams[item.params] = HFTurnStream(policy, item.params)
                    stream.add(key, item.prompt, item.stream)
            for params, stream in list(streams.items()):
                for key in [k for k in stream.rows if live[k].future.cancelled()]:
                    stream.drop(key)
                    live.pop(key)
                try:
                    if len(stream):
                        with lock:
                            ended = stream.step()
                        for key, gen in ended:
                            settle(live.pop(key).future, (gen, version()))
                except Exception as err:  # its requests fail; the engine goes on
                    error = failed(err, [live[k] for k in stream.rows], params)
                    for key in list(stream.rows):
                        settle(live.pop(key).future, error=error)
                    stream.rows.clear()
                if not len(stream):
                    del streams[params]


def _arrived(requests: queue.Queue[Pending | None], block: bool) -> list[Pending | None]:
    """The requests submitted since the last look (waiting for one when `block`)."""
    out: list[Pending | None] = [requests.get()] if block else []
    while True:
        try:
            out.append(requests.get_nowait())
        except queue.Empty:
            return out
