"""A Ray rollout worker sampling with vLLM (`policy.backend: vllm`, `distributed.backend: ray`).

Runs where vLLM and Ray are installed (`.venv-vllm`); elsewhere it skips. One worker,
one engine (the embedded SmolLM2-135M, LoRA adapters, a small KV cache): tiny-random
cannot serve on vLLM's CPU build (see tests/test_vllm.py).
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm"
)
pytest.importorskip("ray", reason="Ray is not installed here")

from agentgym.config import load_config  # noqa: E402
from agentgym.learn.lora import wrap_lora as _wrap_lora  # noqa: E402
from agentgym.policy.base import SamplingParams  # noqa: E402
from agentgym.policy.models import load_model_and_tokenizer  # noqa: E402
from agentgym.rollout.episodes import TaskSpec  # noqa: E402
from agentgym.rollout.player import Submission  # noqa: E402
from agentgym.scale.ray_rollout import RayRollout  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SPECS = (TaskSpec(seed=3),)
PARAMS = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5)
MAX_TOKENS = 1024
LOGPROB_TOLERANCE = 1e-3
"""Largest |vLLM - transformers| logprob of one sampled token; both float32 on CPU."""


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


def _teacher_forced_gap(model, trajectory) -> float:
    """Largest |sampler logprob - transformers' logprob| over the tokens the policy sampled."""
    ids = torch.tensor([trajectory.tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    ours = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)
    theirs = torch.tensor(trajectory.logprobs[1:])
    return float((ours - theirs)[mask].abs().max())


def _assert_well_formed(trajectories, group_size: int) -> None:
    assert [t.group for t in trajectories] == [0] * group_size
    for t in trajectories:
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs) <= MAX_TOKENS
        assert not any(t.loss_mask[: t.prompt_length]) and t.completion_length > 0
        assert all(lp <= 0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)


@pytest.mark.slow
def test_a_vllm_ray_worker_samples_with_the_weights_each_sync_path_sent(ray_local):
    config = load_config(overrides={
        "run.env": "tool_call", "lora.enabled": True, "lora.r": 8, "grpo.group_size": 2,
        "grpo.tasks_per_step": len(SPECS), "sampling.max_new_tokens": PARAMS.max_new_tokens,
        "sampling.max_episode_tokens": MAX_TOKENS, "policy.backend": "vllm",
        "policy.cpu_kv_cache_gb": 0.25, "distributed.backend": "ray",
        "distributed.rollout_workers": 1, "distributed.weight_sync": "collective",
    })  # fmt: skip
    model, _ = load_model_and_tokenizer(None)
    model = _wrap_lora(model, config).eval()
    weights = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(0)

    # New adapters, far enough from the last to change the samples: with B of scale 0.02 the
    # adapters moved logprobs by less than LOGPROB_TOLERANCE and the seeded samples could come
    # out the same (a stop's CI did), so neither check saw whether the engine had them.
    def learner_step():
        with torch.no_grad():
            for name, p in weights:
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.1)

    def play(label: str) -> list[tuple[int, ...]]:
        played = rollout.collect(Submission(SPECS, 2, PARAMS, MAX_TOKENS))
        _assert_well_formed(played, 2)
        gap = max(_teacher_forced_gap(model, t) for t in played)
        print(f"{label}: largest logprob gap to transformers {gap:.2e}")
        assert gap < LOGPROB_TOLERANCE, f"{label}: the engine samples with other weights"
        return [t.tokens for t in played]

    rollout = RayRollout(config, None, weights)  # the first sync: collective
    try:
        outputs = [play("start")]
        for path in ("collective (gloo)", "object_store"):
            learner_step()
            rollout.collective = path != "object_store"  # one sync down each path
            rollout.load_weights(weights)
            assert rollout.sync_path == path
            outputs.append(play(path))
            assert outputs[-1] != outputs[-2], f"{path}: the samples did not change"
        assert rollout.restarts == 0
    finally:
        rollout.close()
