"""The vLLM policy against the transformers one, on the embedded SmolLM2-135M.

Runs where vLLM is installed: `make test-vllm` runs this file in .venv-vllm (vLLM's CPU
build); elsewhere every test here skips. Each engine starts in its own worker process
(vLLM's default) with a 1 GiB KV cache; nothing downloads. The gaps found are printed
(`pytest -s`). Tiny-random cannot serve here: its head size, 16, is not one vLLM's CPU
attention has kernels for.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

# the engine's float32 matmuls on a GPU at full precision, not TF32: vLLM's default since
# it reads this variable (late 2025), set here so that LOGPROB_TOLERANCE means float32
os.environ.setdefault("VLLM_FLOAT32_MATMUL_PRECISION", "highest")
pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-vllm` runs these tests in .venv-vllm"
)

from agentgym.config import ConfigError, load_config  # noqa: E402
from agentgym.env.core import make_env  # noqa: E402
from agentgym.policy.base import SamplingParams  # noqa: E402
from agentgym.policy.hf import HFPolicy, stop_token_ids  # noqa: E402
from agentgym.policy.vllm import VLLMPolicy, save_model_folder  # noqa: E402
from agentgym.rollout.episodes import TaskSpec, collect, render  # noqa: E402
from agentgym.run.preflight import require_vllm  # noqa: E402
from agentgym.sync import shared_memory  # noqa: E402
from agentgym.sync.vllm_worker import WorkerSync  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
GREEDY = SamplingParams(max_new_tokens=32, temperature=0.0)
LOGPROB_TOLERANCE = 1e-3
"""Largest |vLLM - transformers| logprob of one token accepted. Both sides run float32
(`ENGINE`; transformers on the CPU), the engine on a GPU too, there at full float32
precision, not TF32: the two differ by summation order alone, 2^-24 = 6e-8 relative per
operation, orders of magnitude below 1e-3 after 30 layers. TF32 (10-bit mantissa, 5e-4
relative per product) or bf16 (2e-3) would come near it or past it."""
NEAR_TIE = 1e-3
"""Greedy outputs may part only where transformers' two best tokens are this close (nats)."""
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 2048}
"""float32 as the transformers side, on a GPU too; no compilation: these tests time nothing."""


@pytest.fixture(scope="module")
def embedded():
    from agentgym.policy.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(None)
    return model.eval(), tokenizer


@pytest.fixture(scope="module")
def folder(embedded):
    """The embedded model as a plain HF folder an engine starts from."""
    model, tokenizer = embedded
    path = save_model_folder(model, tokenizer)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(embedded, folder):
    model, tokenizer = embedded
    policy = VLLMPolicy(folder, stop_ids=stop_token_ids(model, tokenizer), **ENGINE)
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def prompts(embedded):
    return _first_turn_prompts(embedded[1])


def _first_turn_prompts(tokenizer) -> list[list[int]]:
    """The first-turn prompts of four tool_call tasks, as the rollout builds them."""
    env = make_env("tool_call")
    out = []
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        out.append(tokenizer.encode(render(tokenizer, obs, True), add_special_tokens=False))
    env.close()
    return out


def _top2_gap(model, prompt: list[int], prefix: tuple[int, ...]) -> float:
    """Transformers' logprob gap between its two best next tokens after prompt + prefix."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
    top = torch.log_softmax(logits.float(), -1).topk(2).values
    return float(top[0] - top[1])


def _compare_greedy(model, tokenizer, engine, prompts, label: str) -> list[tuple[int, ...]]:
    """Greedy outputs of both backends; they must agree up to any first divergence, which
    must fall on a near-tie of transformers' logits. Prints what it finds."""
    ours = engine.generate(prompts, GREEDY)
    theirs = HFPolicy(model, tokenizer).generate(prompts, GREEDY)
    for prompt, a, b in zip(prompts, ours, theirs, strict=True):
        common = next(
            (i for i, (x, y) in enumerate(zip(a.ids, b.ids, strict=False)) if x != y), None
        )
        if common is None and len(a.ids) == len(b.ids):
            gap = max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs, strict=True))
            print(f"{label}: {len(a.ids)} tokens agree, max logprob gap {gap:.2e}")
            assert gap < LOGPROB_TOLERANCE
            continue
        common = common if common is not None else min(len(a.ids), len(b.ids))
        tie = _top2_gap(model, prompt, b.ids[:common])
        print(f"{label}: first divergence at token {common}, transformers' top-2 gap {tie:.2e}")
        assert tie < NEAR_TIE, f"{label}: outputs part at token {common} without a near-tie"
    return [b.ids for b in theirs]


@pytest.mark.slow
def test_greedy_outputs_and_logprobs_agree_with_transformers(embedded, engine, prompts):
    model, tokenizer = embedded
    _compare_greedy(model, tokenizer, engine, prompts, "greedy")


@pytest.mark.slow
def test_sampled_logprobs_match_transformers_recomputed(embedded, engine, prompts):
    model, _ = embedded
    params = SamplingParams(max_new_tokens=32, temperature=0.7, seed=3)
    gaps = []
    for prompt, gen in zip(prompts, engine.generate(prompts, params), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(gen.ids)])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / params.temperature, -1)
        theirs = logp.gather(-1, torch.tensor(gen.ids)[:, None]).squeeze(-1)
        gaps.append(float((theirs - torch.tensor(gen.logprobs)).abs().max()))
    print(f"sampled at T=0.7: max |vLLM - transformers| logprob {max(gaps):.2e}")
    assert max(gaps) < LOGPROB_TOLERANCE


@pytest.mark.slow
def test_a_group_samples_differently_and_a_seed_replays_it(engine, prompts):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=11)
    group = engine.generate([prompts[0]] * 8, params)
    assert len({g.ids for g in group}) > 1
    assert [g.ids for g in engine.generate([prompts[0]] * 8, params)] == [g.ids for g in group]
    streams = list(range(100, 108))
    coupled = engine.generate([prompts[0]] * 8, params, streams)
    assert [g.ids for g in engine.generate([prompts[0]] * 8, params, streams)] == [
        g.ids for g in coupled
    ]
    for g in group:
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
        stops = [i for i, t in enumerate(g.ids) if t in engine.stop_ids]
        assert stops in ([], [len(g.ids) - 1])
        assert (g.finish_reason == "stop") == bool(stops)


@pytest.mark.slow
def test_a_multi_turn_rollout_continues_from_the_exact_ids(embedded, engine):
    _, tokenizer = embedded
    envs = [make_env("tool_call") for _ in range(4)]
    params = SamplingParams(max_new_tokens=48, temperature=1.0, seed=5)
    trajectories = collect(envs, [TaskSpec(seed=1), TaskSpec(seed=2)], 2, engine, tokenizer,
                           params, max_tokens=1024)  # fmt: skip
    for t in trajectories:
        assert len(t.tokens) == len(t.loss_mask) == len(t.logprobs)
        for start, end in t.turn_spans:
            assert all(t.loss_mask[start:end]) and all(lp <= 0 for lp in t.logprobs[start:end])
    for env in envs:
        env.close()


def test_turns_stream_through_the_engine_without_waiting_for_other_episodes(embedded, engine):
    """Continuous batching over turns with vLLM (`run.turn_batching`): each turn is the
    engine's own request, added while it runs. Task 0's first tool waits for task 1's second
    call, which comes only if task 1 goes on meanwhile (counted, not timed)."""
    import threading

    from test_turn_batching import SPECS, ManyTurnEnv, Rendezvous

    _, tokenizer = embedded
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)

    def play(turns, envs, specs):
        return collect(envs, specs, 2, engine, tokenizer, params, turn_batching=turns)

    for turns, met in (("continuous", True), ("barrier", False)):
        second_call, seen = threading.Event(), []
        envs = [Rendezvous(second_call, seen, 60.0 if met else 1.0) for _ in range(4)]
        played = play(turns, envs, SPECS[:2])
        assert seen == [met, met], turns
        assert [len(t.turns) for t in played] == [1, 1, 2, 2]
    ordered = [play("ordered", [ManyTurnEnv() for _ in range(12)], SPECS) for _ in range(2)]
    # a seed gives the same trajectories (the second run's prompts meet the engine's prefix
    # cache, whose keys and values were computed in other batches: logprobs within 1e-4)
    for a, b in zip(*ordered, strict=True):
        assert (a.tokens, a.loss_mask, a.turns) == (b.tokens, b.loss_mask, b.turns)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert sorted({len(t.turns) for t in ordered[0]}) == [1, 2, 3]
    for t in ordered[0]:
        for start, end in t.turn_spans:
            assert all(t.loss_mask[start:end]) and all(lp <= 0 for lp in t.logprobs[start:end])


@pytest.mark.slow
def test_synced_weights_change_greedy_output_as_in_transformers(embedded, engine, prompts):
    model, tokenizer = embedded
    before = _compare_greedy(model, tokenizer, engine, prompts, "before sync")
    changed = copy.deepcopy(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g))
    engine.load_weights(changed.named_parameters())
    after = _compare_greedy(changed, tokenizer, engine, prompts, "after sync")
    assert after != before
    engine.load_weights(model.named_parameters())  # and back, for the tests after this one
    assert _compare_greedy(model, tokenizer, engine, prompts, "synced back") == before


def _perturbed(model, seed: int):
    """A copy of `model` with every weight scaled by 1 + 5% noise."""
    changed = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in changed.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g))
    return changed


def _refuse(*args, **kwargs):
    raise AssertionError("load_weights wrote a file")


@pytest.mark.slow
def test_a_sync_writes_no_file_and_releases_its_shared_block(embedded, engine, monkeypatch):
    import safetensors.torch

    from agentgym.policy import vllm as vllm_policy

    model, _ = embedded
    for module, name in (
        (safetensors.torch, "save_file"),
        (vllm_policy, "save_file"),
        (tempfile, "mkstemp"),
        (tempfile, "mkdtemp"),
        (tempfile, "NamedTemporaryFile"),
        (tempfile, "TemporaryDirectory"),
    ):
        monkeypatch.setattr(module, name, _refuse)
    blocks: list[str] = []

    class Recorded(shared_memory.SharedMemory):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            blocks.append(self.name)

    monkeypatch.setattr(shared_memory, "SharedMemory", Recorded)
    calls, rpc = [], engine.llm.collective_rpc

    def listed_rpc(method, *args, **kwargs):
        calls.append((method, set(os.listdir(shared_memory.SHM_DIR))))
        return rpc(method, *args, **kwargs)

    monkeypatch.setattr(engine.llm, "collective_rpc", listed_rpc)
    before = set(os.listdir(shared_memory.SHM_DIR))
    engine.load_weights(_perturbed(model, 2).named_parameters())
    engine.load_weights(model.named_parameters())  # back, for the tests after this one
    after = set(os.listdir(shared_memory.SHM_DIR))
    assert [method for method, _ in calls] == ["agentgym_load_shared"] * 2
    assert len(set(blocks)) == 2 and not set(blocks) & before
    assert all(block in listed for block, (_, listed) in zip(blocks, calls, strict=True))
    assert not set(blocks) & after, "a shared block outlived its sync"
    print(f"/dev/shm: {len(before)} entries before the syncs, {len(after)} after")


def test_a_shared_block_carries_each_dtype_and_shape_and_is_unlinked():
    class Catching(WorkerSync):
        def agentgym_reload(self, weights):
            self.got = [(name, t.clone()) for name, t in weights]
            return len(weights)

    g = torch.Generator().manual_seed(0)
    tensors = [("a", torch.randn(3, 5, generator=g)),
               ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
               ("c", torch.tensor(3)), ("d", torch.zeros(0, 4)),
               ("e", torch.randn(4, 6, generator=g).t()),  # not contiguous
               ("f", torch.arange(5, dtype=torch.int8))]  # fmt: skip
    worker = Catching()
    with shared_memory.shared_block(tensors) as block:
        assert (shared_memory.SHM_DIR / block.name).exists()
        assert all(offset % shared_memory.ALIGN == 0 for *_, offset in block.layout)
        # the RPC delivers the layout's rows as lists
        rows = [list(row) for row in block.layout]
        assert worker.agentgym_load_shared(block.name, block.size, rows) == len(tensors)
    assert not (shared_memory.SHM_DIR / block.name).exists()
    assert [name for name, _ in worker.got] == [name for name, _ in tensors]
    for (_, got), (_, sent) in zip(worker.got, tensors, strict=True):
        assert got.dtype == sent.dtype and torch.equal(got, sent)


def _worker_pid(worker) -> int:
    return os.getpid()


def check_in_process_sync(folder: str) -> None:
    """Syncs perturbed weights into an engine in this process, which must be handed the
    learner's tensors themselves and then sample greedily as transformers does."""
    from agentgym.policy.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(None)
    model.eval()
    prompts = _first_turn_prompts(tokenizer)
    policy = VLLMPolicy(folder, stop_ids=stop_token_ids(model, tokenizer), in_process=True,
                        **ENGINE)  # fmt: skip
    try:
        assert policy.llm.collective_rpc(_worker_pid) == [os.getpid()]
        before = _compare_greedy(model, tokenizer, policy, prompts, "in-process, before sync")
        handed: list[tuple[str, torch.Tensor]] = []
        rpc = policy.llm.collective_rpc

        def handing_rpc(method, *args, **kwargs):
            handed.extend(kwargs["args"][0])
            return rpc(method, *args, **kwargs)

        policy.llm.collective_rpc = handing_rpc
        changed = _perturbed(model, 3)
        policy.load_weights(changed.named_parameters())
        params = dict(changed.named_parameters())
        assert handed and all(t.data_ptr() == params[n].data_ptr() for n, t in handed)
        after = _compare_greedy(changed, tokenizer, policy, prompts, "in-process, after sync")
        assert after != before
    finally:
        policy.close()


@pytest.mark.slow
def test_an_in_process_engine_is_handed_the_tensors_themselves(folder):
    # in a process of its own: on CPU an in-process engine cuts its process's torch threads
    # to 1 for good, which would slow the tests after this one
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import test_vllm; test_vllm.check_in_process_sync({str(folder)!r})")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    print("\n".join(line for line in done.stdout.splitlines() if "sync" in line))
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_lora_adapters_are_served_unmerged_as_new_versions(embedded, folder, prompts):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = embedded
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=8, lora_alpha=16,
                                target_modules="all-linear", task_type="CAUSAL_LM"))  # fmt: skip
    policy = VLLMPolicy(folder, stop_ids=stop_token_ids(model, tokenizer),
                        lora=peft_model.peft_config["default"], **ENGINE)  # fmt: skip
    try:
        base = _compare_greedy(peft_model, tokenizer, policy, prompts, "lora v0")
        g, outputs = torch.Generator().manual_seed(1), [base]
        for version in (1, 2):
            with torch.no_grad():
                for name, p in peft_model.named_parameters():
                    if "lora_B" in name:
                        p.copy_(0.02 * torch.randn(p.shape, generator=g))
            policy.load_weights((n, p) for n, p in peft_model.named_parameters() if p.requires_grad)
            assert policy.lora_request.lora_int_id == version
            outputs.append(_compare_greedy(peft_model, tokenizer, policy, prompts,
                                           f"lora v{version}"))  # fmt: skip
        assert outputs[1] != outputs[0] and outputs[2] != outputs[1]
    finally:
        policy.close()


def test_sleep_mode_is_refused_on_cpu_before_an_engine_starts(embedded, folder):
    if torch.cuda.is_available():
        pytest.skip("a GPU has sleep mode")
    model, tokenizer = embedded
    with pytest.raises(ValueError, match="policy.enable_sleep_mode"):
        VLLMPolicy(folder, stop_ids=stop_token_ids(model, tokenizer), max_model_len=256,
                   enable_sleep_mode=True)  # fmt: skip
    with pytest.raises(ConfigError, match="policy.enable_sleep_mode"):
        require_vllm(load_config(overrides={"policy.enable_sleep_mode": True}))


FLOAT32 = ["model.precision=fp32", "policy.dtype=float32"]
"""The learner and the engine in float32, on a GPU too, where `auto` would put both in
bf16 (on the CPU `auto` is float32 already). bf16 rounds each logit by up to 2^-9 of it,
and 30 layers of two kernels' rounding compound that: the two sides' gaps would then say
little about the run, and no tight bound on them could be stated."""
TRAIN_LOGPROB_BOUND = 1e-2 if torch.cuda.is_available() else 0.1
"""Largest |learner - vLLM| logprob (`rollout/logprob_diff_max`) of the train test, and
twice the largest |is_ratio_mean - 1|. On a GPU, 1e-2: the engine keeps within
LOGPROB_TOLERANCE (1e-3) of transformers' float32 (the one-forward tests above), the
learner runs float32 too, and the two take different paths (the learner's padded rows and
one prefix run; vLLM's prefix cache and unmerged LoRA), so ten times that. A logprob read
one token off, or at another temperature, is off by nats. On the CPU, 0.1, the figure for
vLLM's CPU build as before."""


@pytest.mark.slow
def test_two_steps_of_agentgym_train_with_the_vllm_policy(tmp_path):
    out = tmp_path / "run"
    sets = ["grpo.group_size=2", "grpo.tasks_per_step=2", "sampling.max_new_tokens=48",
            "sampling.max_episode_tokens=1024", "lora.enabled=true", "optim.lr=1e-4",
            "run.report_to=[]", "run.save_every=2", *FLOAT32]  # fmt: skip
    cmd = [sys.executable, "-m", "agentgym", "train", "--env", "tool_call", "--policy", "vllm",
           "--steps", "2", "--output", str(out)]  # fmt: skip
    for item in sets:
        cmd += ["--set", item]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        print({k: round(r[k], 4) for k in ("rollout/weight_sync_seconds",
               "rollout/logprob_diff_max", "rollout/is_ratio_mean", "step_seconds")})  # fmt: skip
        assert r["rollout/weight_sync_seconds"] > 0
        assert 0 <= r["rollout/logprob_diff_max"] < TRAIN_LOGPROB_BOUND
        assert r["rollout/is_ratio_mean"] == pytest.approx(1.0, abs=TRAIN_LOGPROB_BOUND / 2)
    # the run's export, merged, is a model vLLM serves as transformers runs it
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.export.model_folder import export

    merged = export(out, tmp_path / "export", merge=True)
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged)
    policy = VLLMPolicy(str(merged), stop_ids=stop_token_ids(model, tokenizer), **ENGINE)
    try:
        outputs = _compare_greedy(
            model, tokenizer, policy, _first_turn_prompts(tokenizer), "export"
        )
        assert all(outputs)
    finally:
        policy.close()


@pytest.mark.slow
def test_a_stop_string_cuts_at_the_token_that_completes_it(embedded, engine, prompts):
    _, tokenizer = embedded
    (whole,) = engine.generate(prompts[:1], GREEDY)
    # a 3-character string that first appears when the k-th id is added, for some k > 2
    text = lambda k: tokenizer.decode(whole.ids[:k])  # noqa: E731
    k = next(k for k in range(3, len(whole.ids)) if text(k)[-3:] not in text(k - 1))
    stopped = replace(GREEDY, stop=(text(k)[-3:],))
    (cut,) = engine.generate(prompts[:1], stopped)
    assert cut.ids == whole.ids[:k] and cut.finish_reason == "stop"
    (same,) = engine.generate(prompts[:1], replace(GREEDY, stop=("\u2603\u2603",)))
    assert same.ids == whole.ids


def test_agentgym_serve_answers_through_the_vllm_engine(embedded, engine):
    """The endpoint over the vLLM engine (`agentgym serve --policy vllm`): the openai client's
    requests are sampled by the engine, `n` choices each, and an episode's turns recorded as
    the ids the engine sampled."""
    import openai

    from agentgym.serve.app import Server, create_app
    from agentgym.serve.engine import Engine
    from agentgym.serve.service import ChatService

    tokenizer = embedded[1]
    serving = Engine(engine)
    service = ChatService(serving, tokenizer, "embedded", max_new_tokens=16)
    try:
        with Server(create_app(service)) as server:
            client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
            messages = [{"role": "user", "content": "What is 2 + 3?"}]
            reply = client.chat.completions.create(model="embedded", messages=messages, n=2, seed=1)
            assert len(reply.choices) == 2 and all(c.message.content for c in reply.choices)
            key = service.open_episode()
            episode = openai.OpenAI(
                base_url=server.episode_url(key),
                api_key=service.episodes[key].token,
                max_retries=0,
            )
            first = episode.chat.completions.create(model="embedded", messages=messages).choices[0]
            grown = [*messages, first.message.model_dump(exclude_none=True)]
            episode.chat.completions.create(
                model="embedded", messages=[*grown, {"role": "user", "content": "Sure?"}]
            )
            (sample,) = service.close_episode(key).recorder.samples
            start, end = sample.spans[0]
            assert (
                tokenizer.decode(sample.tokens[start:end], skip_special_tokens=True).strip()
                == first.message.content.strip()
            )
            assert len(sample.spans) == 2 and sum(sample.loss_mask) == sum(
                e - s for s, e in sample.spans
            )
    finally:
        serving.close()
