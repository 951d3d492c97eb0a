"""Rollout workers as Ray actors (`distributed.backend: ray`).

Each worker is a Ray actor with its own policy and its own environments: a copy
of the model (the run's start model, LoRA-wrapped as the learner's is) sampled
by `HFPolicy`, or, with `policy.backend: vllm`, a vLLM engine of its own
(`VLLMPolicy`: in the actor's process on a GPU, in one it starts on CPU). A
step's task groups are spread over the workers whole and in order (all G
episodes of a task on one worker), each worker runs the ordinary
`rollout.collect` on its share, and the
trajectories come back in the order the in-process rollout would give them.
Sampling draws each episode's random numbers from a stream named by (seed, task,
member, turn), so an episode does not depend on which worker plays it nor on
what else is in its batch: with the same weights, transformers workers give the
in-process rollout's trajectories (vLLM samples with its own random numbers).

After each learner step the trainable weights (the LoRA adapters, or the whole
model) reach every worker by one of two paths (`distributed.weight_sync`):

- `object_store`: put once into Ray's object store (a CPU copy), and every
  worker copies them in by name (`agentgym.sync.object_store`).
- `collective`: broadcast from the learner, rank 0 of a torch.distributed group
  of its own with the workers (`agentgym.sync.collective`; NCCL where the weights
  and the workers are on GPUs, gloo otherwise), in buckets; every worker copies
  each bucket's tensors in by name as it arrives. The group is formed at the
  first sync and kept; a vLLM worker then hands what it received to its
  engine through `VLLMPolicy.load_weights`, i.e. not by NCCL into the engine.

`sync_path` says which path the last sync took; `load_weights` returns its seconds.

A worker that dies (its process killed, its node lost) is restarted by Ray
(`max_restarts`). Every answer of a worker names its process (an incarnation
id), so the driver also sees a restart that happened between two calls. It
then sends the restarted worker the current weights through the object store
(from the learner's tensors, which do not change between a sync and the next
rollout), and sends it its call again (its groups, or a sync). A collective
group cannot take a new member in place of a dead one, so the driver drops the
group and the next sync forms a new one with every worker; until then the
restarted worker has its weights from the object store. A collective sync that
fails midway (a member dies, a broadcast times out) is aborted everywhere and
that sync is done again through the object store (`sync_path` says so), and the
next sync forms a new group. Restarts are counted; past
`distributed.max_worker_restarts` of one worker the run stops with a
`TrainingError`.

No call to a worker is waited for longer than `distributed.worker_timeout_s`: its
batch, a weight sync, its `hello` after a failure, the weights sent to a restarted
one. A worker past it (a hung environment or tool, a stalled node) stops the run with
a `TrainingError` naming the worker and its actor, rather than stalling it for ever;
`close` then kills that worker without asking it to close.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

import torch

from agentgym.config import Config, DistributedConfig
from agentgym.rollout.player import Submission
from agentgym.scale.ray_worker import RolloutWorker
from agentgym.sync import collective
from agentgym.sync.collective import (
    GROUP_TIMEOUT_S,
    GroupAddress,
    SyncGroup,
    describe,
    serve_store,
)
from agentgym.sync.object_store import ObjectStore
from agentgym.types import TrainingError, Trajectory

logger = logging.getLogger(__name__)

UNAVAILABLE_WAIT_S = 60.0
"""How long a worker may stay unreachable (neither answering nor reported dead)."""


def spread_groups(groups: int, workers: int) -> list[range]:
    """Each worker's share of a step's task groups: contiguous, in order, sizes within one.

    Whole groups are spread, never episodes, so a group's G members are played
    (and their shared prompt prefilled) together.
    """
    return [range(w * groups // workers, (w + 1) * groups // workers) for w in range(workers)]


class _SyncFailed(RuntimeError):
    """A collective sync that some member could not finish."""


class RayRollout:
    """`distributed.rollout_workers` Ray actors that play a step's groups between them.

    Joins the cluster at `distributed.ray_address`, or starts a local Ray when it
    is None and none is running in this process (and shuts it down on `close`).

    Args:
        config: The run's config.
        model_name: The model GRPO started from; every node must be able to load it
            (a hub id, or a folder on storage the nodes share).
        weights: The learner's trainable weights now, by name (`Learner.named_weights()`).
    """

    def __init__(
        self, config: Config, model_name: str | None, weights: Iterable[tuple[str, torch.Tensor]]
    ):
        import ray as ray_module  # where missing, preflight.require_ray said so early

        ray = self._ray = cast(Any, ray_module)  # mypy knows no actor handle's `.remote`
        d = config.distributed
        self.max_restarts = d.max_worker_restarts
        self.collective = d.weight_sync == "collective"
        self.sync_path = "none"
        """The path of the last sync: 'object_store', 'collective (gloo|nccl)', or
        'object_store (collective failed)'."""
        self.collective_failures = 0
        self.timeout_s = d.worker_timeout_s
        """The most seconds one call to a worker is waited for (its first `hello`, which
        waits for the actor to start and load its model, included)."""
        self._stuck: set[int] = set()  # workers past the timeout: busy for ever, as far as we know
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=d.ray_address, include_dashboard=False, **_local_runtime(d))
        g = config.grpo
        per_worker = -(-g.tasks_per_step // d.rollout_workers) * g.group_size
        options = _actor_options(ray, d.rollout_workers, d.max_worker_restarts)
        threads = max(1, int(options["num_cpus"]))
        actor = ray.remote(RolloutWorker).options(**options)
        self._actors = [
            actor.remote(config, model_name, per_worker, threads) for _ in range(d.rollout_workers)
        ]
        self._restarts = [0] * d.rollout_workers
        self._identities: dict[int, str] = {}
        self._devices: dict[int, str] = {}
        self._held: list[tuple[str, torch.Tensor]] = []  # the weights the workers should hold
        self._store = ObjectStore()  # them, once put
        self._group: SyncGroup | None = None
        self._generation = 0
        try:
            self._devices = self._call_all("its start", lambda w: self._actors[w].hello.remote())
            self.load_weights(weights)
        except BaseException:  # a worker that cannot start: end the others, and our Ray
            self.close()
            raise

    @property
    def restarts(self) -> int:
        """Worker restarts so far, all workers together."""
        return sum(self._restarts)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Sends new weights to every worker; returns the seconds it took (until every
        worker had them). `sync_path` then says how they went."""
        start = time.perf_counter()
        # With `collective` these are the learner's own tensors, kept, not copied: a worker
        # restarted before the next sync is sent them, and they do not change until then.
        self._held = [(n, t.detach()) for n, t in named_tensors]
        self._store.drop()
        self.sync_path = self._sync_collective() if self.collective else self._sync_store()
        return time.perf_counter() - start

    def worker_weights(self, w: int, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Worker `w`'s copies of the named parameters (transformers workers), for checks."""
        return self._call_all(
            "a weights read", lambda v: self._actors[v].weights.remote(list(names)), [w]
        )[w]

    def collect(self, submission: Submission) -> list[Trajectory]:
        """The submission's trajectories, played by the workers (each its share of the
        groups, with its own player): grouped by task, in the order of its specs, `group`
        numbering the task within the submission."""
        shares = spread_groups(len(submission.specs), len(self._actors))
        busy = {w: share for w, share in enumerate(shares) if share}

        def play(w: int):
            mine = submission.share(busy[w].start, busy[w].stop)
            return self._actors[w].collect.remote(mine)

        played = self._call_all("its rollout batch", play, busy)
        return [replace(t, group=t.group + busy[w].start) for w in sorted(busy) for t in played[w]]

    def _sync_store(self) -> str:
        """Puts the weights into the object store once; every worker copies them in."""
        ref = self._weights_ref()
        self._call_all("a weight sync", lambda w: self._actors[w].load_weights.remote(ref))
        return self._store.name

    def _sync_collective(self) -> str:
        """Broadcasts the weights in the group (formed first if there is none); on a
        failure, aborts the group and syncs through the object store instead."""
        # revives (and catches up) a worker restarted since its last call, before the group
        self._devices = self._call_all("a hello", lambda w: self._actors[w].hello.remote())
        try:
            if self._group is None:
                self._form_group()
            self._broadcast()
        except (RuntimeError, self._ray.exceptions.RayError) as err:
            self._drop_group()
            self.collective_failures += 1
            logger.warning(
                "collective weight sync failed (%s); this sync goes through Ray's object "
                "store, the next forms a new group",
                err,
            )
            self._sync_store()
            return f"{self._store.name} (collective failed)"
        assert self._group is not None
        return self._group.name

    def _form_group(self) -> None:
        """Forms a new group: this process (rank 0) and every worker (ranks 1..N)."""
        on_gpu = (
            bool(self._held)
            and all(t.is_cuda for _, t in self._held)
            and all(d == "cuda" for d in self._devices.values())
        )
        host = self._ray.util.get_node_ip_address()
        store = serve_store(host)
        self._generation += 1
        address = GroupAddress(
            host,
            store.port,
            len(self._actors) + 1,
            "nccl" if on_gpu else "gloo",
            self._generation,
            collective.BUCKET_BYTES,
        )
        joins = {self._actors[w].join.remote(address, w + 1): w for w in range(len(self._actors))}
        device = self._held[0][1].device if on_gpu else torch.device("cpu")
        try:
            self._group = SyncGroup(address, 0, host, device, store=store)
        except BaseException:
            with contextlib.suppress(_SyncFailed):  # the workers' joins fail too: the cause is here
                self._settle(joins)
            raise
        self._settle(joins)

    def _broadcast(self) -> None:
        """Rank 0's side of one sync, the workers' receives made first."""
        assert self._group is not None
        metas = describe(self._held)
        generation = self._group.address.generation
        receives = {
            self._actors[w].receive.remote(generation, metas): w for w in range(len(self._actors))
        }
        try:
            self._group.send(self._held)
        except BaseException:
            self._drop_group()  # the workers' pending receives fail now, not at the timeout
            with contextlib.suppress(_SyncFailed):
                self._settle(receives)
            raise
        self._settle(receives)

    def _settle(self, refs: dict[Any, int]) -> None:
        """Waits for the workers' side of a group call; _SyncFailed if one failed or is
        not the process that was in the group."""
        ray = self._ray
        failed = []
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=GROUP_TIMEOUT_S)
        for ref in ready:
            try:
                incarnation, _ = ray.get(ref)
                if incarnation != self._identities.get(refs[ref]):
                    failed.append(f"worker {refs[ref]} was restarted")
            except ray.exceptions.RayError as err:
                failed.append(f"worker {refs[ref]}: {type(err).__name__}: {err}")
        failed += [f"worker {refs[ref]} did not answer in {GROUP_TIMEOUT_S:.0f} s" for ref in late]
        if failed:
            raise _SyncFailed("; ".join(failed)[:2000])

    def _drop_group(self) -> None:
        """Aborts this side of the group, if any; the next collective sync forms a new one."""
        if self._group is not None:
            group, self._group = self._group, None
            with contextlib.suppress(RuntimeError):
                group.abort()

    def _weights_ref(self) -> Any:
        """The ObjectRef of the weights the workers should hold; put on first need."""
        if self._store.ref is None:
            self._store.send(self._held)
        return self._store.ref

    def _call_all(
        self, what: str, call: Callable[[int], Any], workers: Iterable[int] | None = None
    ) -> dict[int, Any]:
        """Makes `call(w)` (an actor call's ObjectRef) for each worker, all by default, and
        gathers the values; a worker that died, or answers from a restarted process, is
        revived and its call made again."""
        ray = self._ray
        pending: dict[Any, tuple[int, float]] = {}  # ref: (worker, when it is late)

        def send(w: int) -> None:
            pending[call(w)] = (w, time.monotonic() + self.timeout_s)

        for w in range(len(self._actors)) if workers is None else workers:
            send(w)
        results: dict[int, Any] = {}
        while pending:
            wait_s = max(0.0, min(late for _, late in pending.values()) - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:  # ray.wait may return a little early: then the first due is late
                now = time.monotonic()
                late = [w for w, due in pending.values() if due <= now]
                first = min(pending.values(), key=lambda entry: entry[1])[0]
                raise self._stuck_error(late or [first], what)
            w, _ = pending.pop(ready[0])
            try:
                incarnation, value = self._get(ready[0], w, what)
            except ray.exceptions.RayActorError:
                incarnation = None
            if incarnation is not None and incarnation == self._identities.setdefault(
                w, incarnation
            ):
                results[w] = value
                continue
            self._revive(w)
            send(w)
        return results

    def _get(self, ref: Any, w: int, what: str) -> Any:
        """Worker `w`'s answer to a call (`what`, for the error); TrainingError if it
        takes past `timeout_s`."""
        try:
            return self._ray.get(ref, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise self._stuck_error([w], what) from None

    def _stuck_error(self, workers: Sequence[int], what: str) -> TrainingError:
        """The error that stops the run for `workers`, which did not answer `what` in time."""
        self._stuck.update(workers)
        named = ", ".join(f"{w} (actor {_actor_id(self._actors[w])})" for w in workers)
        return TrainingError(
            f"rollout worker {named} did not answer {what} within {self.timeout_s:g} s "
            "(distributed.worker_timeout_s): an environment step or a tool that hangs, or "
            "a stalled node; look in Ray's worker logs, or raise the limit for slow steps"
        )

    def _revive(self, w: int) -> None:
        """After worker `w`'s call failed: waits until it answers; if it is a restarted
        process, counts the restart, drops the group it was in, and sends it the current
        weights through the object store."""
        while True:
            identity = self._identity(w)
            if identity == self._identities.get(w, identity):
                return  # the same process, unreachable for a moment: it kept its weights
            self._restarts[w] += 1
            self._identities[w] = identity
            self._drop_group()
            if self._store.ref is None and not self._held:
                return
            try:
                ref = self._actors[w].load_weights.remote(self._weights_ref())
                self._get(ref, w, "the weights sent after its restart")
                return
            except self._ray.exceptions.RayActorError:
                continue  # it died again before it had the weights

    def _identity(self, w: int) -> str:
        """Worker `w`'s incarnation, once it answers; TrainingError once Ray gave it up."""
        ray = self._ray
        since = time.monotonic()
        while True:
            try:
                return self._get(self._actors[w].hello.remote(), w, "a hello after a failure")[0]
            except ray.exceptions.ActorDiedError as err:  # Ray's max_restarts are spent
                raise TrainingError(
                    f"rollout worker {w} died after {self._restarts[w]} restarts "
                    f"(distributed.max_worker_restarts={self.max_restarts}); look for the "
                    f"cause in Ray's worker logs (out of memory, a crashing environment): {err}"
                ) from None
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() - since > UNAVAILABLE_WAIT_S:
                    raise TrainingError(
                        f"rollout worker {w} has been unreachable for {UNAVAILABLE_WAIT_S:.0f} s"
                    ) from None
                time.sleep(1.0)

    def close(self) -> None:
        """Closes the workers' environments and engines, ends the actors, leaves the
        group, and stops a Ray it started."""
        ray = self._ray
        self._drop_group()
        for w, actor in enumerate(self._actors):
            # a dead or stuck worker has nothing left to close
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                if w not in self._stuck:  # its close would wait behind the call it is stuck in
                    ray.get(actor.close.remote(), timeout=min(30.0, self.timeout_s))
            ray.kill(actor)
        if self._started_ray:
            ray.shutdown()


def _actor_id(actor: Any) -> str:
    """The Ray actor id of a handle, as `ray list actors` and the worker logs show it."""
    found = getattr(actor, "_actor_id", None)  # Ray has no public accessor on the handle
    return found.hex() if found is not None else "unknown"


def _local_runtime(d: DistributedConfig) -> dict[str, Any]:
    """ray.init's runtime_env for a local Ray: the driver's import path, so that a
    `module:Env-v0` environment imports in the workers as it does here."""
    if d.ray_address is not None:
        return {}
    ours = (sys.prefix, sys.base_prefix)  # the interpreter's own paths, the same there
    path = os.pathsep.join(p for p in sys.path if p and not p.startswith(ours))
    return {"runtime_env": {"env_vars": {"PYTHONPATH": path}}}


def _actor_options(ray, workers: int, max_restarts: int) -> dict[str, Any]:
    """Resources per worker: one GPU each where the cluster has one per worker; the
    CPUs shared out (at most one node's), so that all workers fit at once."""
    total = ray.cluster_resources()
    node_cpus = max(
        (n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]), default=1.0
    )
    share = total.get("CPU", 1.0) / workers
    cpus = min(node_cpus, float(int(share))) if share >= 1 else share
    return {
        "num_cpus": cpus,
        "num_gpus": 1 if total.get("GPU", 0.0) >= workers else 0,
        "max_restarts": max_restarts,
        "max_task_retries": 0,  # the driver retries, after re-sending the weights
        "scheduling_strategy": "SPREAD",
    }
