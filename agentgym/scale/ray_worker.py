"""A Ray rollout worker: one actor's policy and environments, playing its share of a step.

`agentgym.scale.ray_rollout.RayRollout` starts `distributed.rollout_workers` of these
actors, hands each its groups and syncs the learner's weights into them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from agentgym.config import Config
from agentgym.env.core import make_env
from agentgym.learn.lora import wrap_lora
from agentgym.policy.backend import engine_folder, make_policy
from agentgym.policy.chat_templates import apply_chat_template_option
from agentgym.policy.models import load_model_and_tokenizer
from agentgym.rollout.player import Submission
from agentgym.rollout.sampler import play_merged
from agentgym.scale.players import make_player
from agentgym.sync.collective import GroupAddress, SyncGroup, TensorMeta

Reply = tuple[str, Any]
"""A worker's answer: its incarnation, and the call's value."""


class RolloutWorker:
    """One rollout worker: a policy and environments (a Ray actor's body).

    A plain class, so it runs in-process too; `RayRollout` makes it an actor.
    Every method but `close` answers a `Reply`: (this process's incarnation, value).

    Args:
        config: The run's config (model, lora, policy and run sections are read).
        model_name: The model GRPO started from (the SFT checkpoint after a warm-up).
        envs: How many environments to make: the most groups it plays times G.
        threads: torch's intra-op threads, to match the CPUs Ray gave the actor.
    """

    def __init__(self, config: Config, model_name: str | None, envs: int, threads: int):
        torch.set_num_threads(threads)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model, tokenizer = load_model_and_tokenizer(model_name)
        self.tokenizer = apply_chat_template_option(tokenizer, config.model.chat_template)
        # a vLLM engine starts from the weights saved before LoRA wraps them, and owns them
        engine_dir = engine_folder(config, model, self.tokenizer)
        if engine_dir is None:  # sampled in this process: the model on this worker's device
            # transformers wraps Module.to with functools.wraps, whose type wants self first
            model = model.to(self.device)  # type: ignore[arg-type]
        if config.lora.enabled:  # the learner's adapter names, so its weights load by name
            model = wrap_lora(model, config)
        self.policy = make_policy(config, model, self.tokenizer, engine_dir=engine_dir)
        self.envs = [make_env(config.run.env, **config.run.env_kwargs) for _ in range(envs)]
        self.player = make_player(config, self.tokenizer)
        self.incarnation = uuid.uuid4().hex  # a restarted actor gets a new one
        self._group: SyncGroup | None = None

    def hello(self) -> Reply:
        """This process's incarnation, and where its weights live ("cpu" or "cuda")."""
        return self.incarnation, self.device.type

    def load_weights(self, named_tensors: dict[str, torch.Tensor]) -> Reply:
        """Copies the learner's trainable weights in, by name."""
        self.policy.load_weights(named_tensors.items())
        return self.incarnation, None

    def join(self, address: GroupAddress, rank: int) -> Reply:
        """Joins the weight-sync group at `address` as `rank`, leaving any older one."""
        import ray

        self._leave()
        self._group = SyncGroup(address, rank, ray.util.get_node_ip_address(), self.device)
        return self.incarnation, None

    def receive(self, generation: int, metas: Sequence[TensorMeta]) -> Reply:
        """Takes the learner's broadcast of `metas` in group `generation`: each bucket's
        tensors are copied in as it arrives (a vLLM engine gets them all in one reload)."""
        group = self._group
        if group is None or group.address.generation != generation:
            raise RuntimeError(f"this worker is not in weight-sync group {generation}")
        try:
            if self.policy.model is not None:  # transformers: bucket by bucket
                for bucket in group.receive(metas):
                    self.policy.load_weights(bucket)
            else:
                self.policy.load_weights(
                    [(n, t.cpu()) for bucket in group.receive(metas) for n, t in bucket]
                )
        except BaseException:
            self._leave()  # the group is broken: the driver forms a new one
            raise
        return self.incarnation, None

    def weights(self, names: Sequence[str]) -> Reply:
        """Copies of the named parameters this worker samples with (transformers only)."""
        assert self.policy.model is not None, "a vLLM worker's weights are in its engine"
        params = dict(self.policy.model.named_parameters())
        return self.incarnation, {n: params[n].detach().cpu().clone() for n in names}

    def collect(self, submission: Submission) -> Reply:
        """This worker's share of a submission, played by its player; groups are
        numbered from 0."""
        return self.incarnation, play_merged(self.player, self.policy, self.envs, submission)

    def close(self) -> None:
        """Leaves the group, closes the environments (sandbox pools, tool processes) and
        shuts down a vLLM engine."""
        self._leave()
        self.player.close()
        for env in self.envs:
            env.close()
        self.policy.close()

    def _leave(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            with contextlib.suppress(RuntimeError):
                group.abort()
