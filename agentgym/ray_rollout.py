"""Rollout workers as Ray actors (`distributed.backend: ray`).

Each worker is a Ray actor holding its own copy of the model (the run's start
model, LoRA-wrapped as the learner's is), its own `HFPolicy` and its own
environments. A step's task groups are spread over the workers whole and in
order (all G episodes of a task on one worker), each worker runs the ordinary
`rollout.collect` on its share, and the trajectories come back in the order the
in-process rollout would give them. Sampling draws each episode's random
numbers from a stream named by (seed, task, member, turn), so an episode does
not depend on which worker plays it nor on what else is in its batch: with the
same weights, the Ray rollout gives the in-process rollout's trajectories.

After each learner step the trainable weights (the LoRA adapters, or the whole
model) are put once into Ray's object store and every worker copies them in by
name. A collective broadcast from the learner's GPU to the workers' GPUs (NCCL,
as vLLM-based trainers do) would be faster where GPUs are present; it is not
implemented: on GPUs too, weights go through the object store, via CPU memory.

A worker that dies (its process killed, its node lost) is restarted by Ray
(`max_restarts`); the driver notices the failed call, sends the restarted
worker the current weights, and sends it its groups again. Restarts are
counted; past `distributed.max_worker_restarts` of one worker the run stops
with a `TrainingError`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import torch

from agentgym.config import Config, ConfigError, DistributedConfig
from agentgym.core import make_env
from agentgym.interrupt import TrainingError
from agentgym.learner import _wrap_lora
from agentgym.policy.base import SamplingParams
from agentgym.policy.hf import HFPolicy, merged_adapters
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout import TaskSpec, collect
from agentgym.types import Trajectory

UNAVAILABLE_WAIT_S = 60.0
"""How long a worker may stay unreachable (neither answering nor reported dead)."""


def require_ray() -> Any:
    """Imports Ray, or raises ConfigError naming the setting and the install command."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "distributed.backend: 'ray' needs Ray, which is not installed: "
            "pip install 'ray>=2.9' (or pip install 'agentgym[distributed]')"
        ) from None
    return ray


def spread_groups(groups: int, workers: int) -> list[range]:
    """Each worker's share of a step's task groups: contiguous, in order, sizes within one.

    Whole groups are spread, never episodes, so a group's G members are played
    (and their shared prompt prefilled) together.
    """
    return [range(w * groups // workers, (w + 1) * groups // workers) for w in range(workers)]


class RolloutWorker:
    """One rollout worker: a model, its policy and environments (a Ray actor's body).

    A plain class, so it runs in-process too; `RayRollout` makes it an actor.

    Args:
        config: The run's config (model, lora and run sections are read).
        model_name: The model GRPO started from (the SFT checkpoint after a warm-up).
        envs: How many environments to make: the most groups it plays times G.
        threads: torch's intra-op threads, to match the CPUs Ray gave the actor.
    """

    def __init__(self, config: Config, model_name: str | None, envs: int, threads: int):
        torch.set_num_threads(threads)
        model, self.tokenizer = load_model_and_tokenizer(model_name)
        model = model.to(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        if config.lora.enabled:  # the learner's adapter names, so its weights load by name
            model = _wrap_lora(model, config)
        self.policy = HFPolicy(model, self.tokenizer)
        self.envs = [make_env(config.run.env, **config.run.env_kwargs) for _ in range(envs)]
        self.incarnation = uuid.uuid4().hex  # a restarted actor gets a new one

    def identity(self) -> str:
        """This process's incarnation: it changes when Ray restarts the actor."""
        return self.incarnation

    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> None:
        """Copies the learner's trainable weights in, by name."""
        self.policy.load_weights(named_tensors.items())

    def collect(self, specs: Sequence[TaskSpec], group_size: int, params: SamplingParams,
                max_tokens: int | None) -> list[Trajectory]:  # fmt: skip
        """`rollout.collect` over this worker's groups; groups are numbered from 0."""
        with merged_adapters(self.policy.model):
            return collect(self.envs, specs, group_size, self.policy, self.tokenizer, params,
                           max_tokens=max_tokens)  # fmt: skip

    def close(self) -> None:
        """Closes the environments (sandbox pools, tool processes)."""
        for env in self.envs:
            env.close()


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

    def __init__(self, config: Config, model_name: str | None,
                 weights: Iterable[tuple[str, torch.Tensor]]):  # fmt: skip
        ray = self._ray = require_ray()
        d = config.distributed
        self.max_restarts = d.max_worker_restarts
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(address=d.ray_address, include_dashboard=False, **_local_runtime(d))
        g = config.grpo
        per_worker = -(-g.tasks_per_step // d.rollout_workers) * g.group_size
        options = _actor_options(ray, d.rollout_workers, d.max_worker_restarts)
        threads = max(1, int(options["num_cpus"]))
        actor = ray.remote(RolloutWorker).options(**options)
        self._actors = [actor.remote(config, model_name, per_worker, threads)
                        for _ in range(d.rollout_workers)]  # fmt: skip
        self._restarts = [0] * d.rollout_workers
        self._identities: dict[int, str] = {}
        self._weights: Any = None  # the ObjectRef of the weights the workers hold
        try:
            self._identities = self._call_all(lambda w: self._actors[w].identity.remote())
            self.load_weights(weights)
        except BaseException:  # a worker that cannot start: end the others, and our Ray
            self.close()
            raise

    @property
    def restarts(self) -> int:
        """Worker restarts so far, all workers together."""
        return sum(self._restarts)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
        """Sends new weights to every worker; returns the seconds it took (put to loaded)."""
        start = time.perf_counter()
        self._weights = self._ray.put({n: t.detach().cpu() for n, t in named_tensors})
        self._call_all(lambda w: self._actors[w].load_weights.remote(self._weights))
        return time.perf_counter() - start

    def collect(self, specs: Sequence[TaskSpec], group_size: int, params: SamplingParams,
                max_tokens: int | None = None) -> list[Trajectory]:  # fmt: skip
        """`rollout.collect`'s trajectories, played by the workers: grouped by task, in
        the order of `specs`, `group` numbering the task within the step."""
        shares = spread_groups(len(specs), len(self._actors))
        busy = {w: share for w, share in enumerate(shares) if share}

        def play(w: int):
            mine = [specs[i] for i in busy[w]]
            return self._actors[w].collect.remote(mine, group_size, params, max_tokens)

        played = self._call_all(play, busy)
        return [replace(t, group=t.group + busy[w].start) for w in sorted(busy) for t in played[w]]

    def _call_all(self, call: Callable[[int], Any], workers: Iterable[int] | None = None
                  ) -> dict[int, Any]:  # fmt: skip
        """Makes `call(w)` (an actor call's ObjectRef) for each worker, all by default, and
        gathers the results; a worker that died is revived and its call made again."""
        ray = self._ray
        pending = {call(w): w for w in (range(len(self._actors)) if workers is None else workers)}
        results: dict[int, Any] = {}
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            w = pending.pop(ref)
            try:
                results[w] = ray.get(ref)
            except ray.exceptions.RayActorError:
                self._revive(w)
                pending[call(w)] = w
        return results

    def _revive(self, w: int) -> None:
        """After worker `w`'s call failed: waits until it answers; if it is a restarted
        process, counts the restart and sends it the current weights."""
        while True:
            identity = self._identity(w)
            if identity == self._identities.get(w, identity):
                return  # the same process, unreachable for a moment: it kept its weights
            self._restarts[w] += 1
            self._identities[w] = identity
            if self._weights is None:
                return
            try:
                self._ray.get(self._actors[w].load_weights.remote(self._weights))
                return
            except self._ray.exceptions.RayActorError:
                continue  # it died again before it had the weights

    def _identity(self, w: int) -> str:
        """Worker `w`'s incarnation, once it answers; TrainingError once Ray gave it up."""
        ray = self._ray
        since = time.monotonic()
        while True:
            try:
                return ray.get(self._actors[w].identity.remote())
            except ray.exceptions.ActorDiedError as err:  # Ray's max_restarts are spent
                raise TrainingError(
                    f"rollout worker {w} died after {self._restarts[w]} restarts "
                    f"(distributed.max_worker_restarts={self.max_restarts}); look for the "
                    f"cause in Ray's worker logs (out of memory, a crashing environment): {err}"
                ) from None
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() - since > UNAVAILABLE_WAIT_S:
                    raise TrainingError(f"rollout worker {w} has been unreachable for "
                                        f"{UNAVAILABLE_WAIT_S:.0f} s") from None  # fmt: skip
                time.sleep(1.0)

    def close(self) -> None:
        """Closes the workers' environments, ends the actors, and stops a Ray it started."""
        ray = self._ray
        for actor in self._actors:
            # a dead or stuck worker has nothing left to close
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
                ray.get(actor.close.remote(), timeout=30)
            ray.kill(actor)
        if self._started_ray:
            ray.shutdown()


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
    node_cpus = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]),
                    default=1.0)  # fmt: skip
    share = total.get("CPU", 1.0) / workers
    cpus = min(node_cpus, float(int(share))) if share >= 1 else share
    return {
        "num_cpus": cpus,
        "num_gpus": 1 if total.get("GPU", 0.0) >= workers else 0,
        "max_restarts": max_restarts,
        "max_task_retries": 0,  # the driver retries, after re-sending the weights
        "scheduling_strategy": "SPREAD",
    }
