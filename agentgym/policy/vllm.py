"""The vLLM backend: a colocated engine that samples token ids and takes the learner's
weights in place after every step.

How it meets the `Policy` contract, and where it departs from the transformers backend:

- Prompts go in as token ids (`TokensPrompt`) and the sampled ids come back as they
  are, never decoded. Each prompt is its own request with its own seed: the G members
  of a group draw differently, and vLLM's prefix cache computes the prompt they share
  once; an episode's next turn extends the ids of its last one, so its cached blocks
  are reused too (block by block, rather than `HFPolicy.reusing_cache`'s whole rows).
- Seeds: a row's stream (`streams[i]`), or, without streams, a hash of
  (`SamplingParams.seed`, row), becomes the request's `seed`, so a seeded run samples
  the same ids again on the same engine. The draws are vLLM's, not `HFPolicy`'s
  counter-based uniforms: the two backends sample alike only greedily.
- Logprobs are vLLM's "processed_logprobs": log p of the sampled id under logits / T,
  as `Generation` requires; with top_p < 1 they are taken after the top-p cut, i.e.
  under the distribution actually sampled from. Greedy decoding gives the logits' own.
  The learner never trusts them as its old logprobs: it recomputes its own and
  corrects the difference by truncated importance sampling (`grpo.truncated_is_weights`).
- Weight sync (`load_weights`): no file is written. Every tensor reaches the engine's
  worker in one `collective_rpc` to a worker extension
  (`agentgym.sync.vllm_worker.WorkerSync`), which loads them all in place in one call
  (`Worker.reload_weights`): in-process, the tensors themselves; to a separate
  process, one shared-memory block the worker maps and reads as views (CPU tensors)
  or CUDA IPC handles (CUDA tensors). Then the
  prefix cache is reset, since its keys and values came from the old weights. For
  LoRA, the trained adapters are written as a PEFT adapter folder and served as a new
  adapter version (a `LoRARequest` with the next id: vLLM 0.32 takes adapters only
  from a folder); the base weights are never touched.
- Where the engine runs (`in_process`, `policy.engine_process`): by default in this
  process on a GPU, as TRL's colocate mode, and in vLLM's own worker process (V1
  multiprocessing) on CPU. On CPU that matters: run in-process, vLLM's CPU worker
  cuts the caller's torch threads to 1 and disables `torch.set_num_threads`, which
  would slow the learner, and it decoded about 3.5 times slower here.
- Sleep mode (`released`): the engine's GPU memory (weights offloaded to host memory,
  KV cache dropped: vLLM's sleep level 1) is freed while the learner steps. vLLM
  offers it on CUDA, ROCm and XPU; on CPU it refuses `enable_sleep_mode` at start, so
  this class raises a ValueError naming `policy.enable_sleep_mode` first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from agentgym.config import ConfigError
from agentgym.policy.base import Generation, PolicyBase, SamplingParams, check_generate_args
from agentgym.sync.vllm_worker import WorkerSync, send_weights

if TYPE_CHECKING:
    from agentgym.config import Config

ENGINE_PROCESS = {"auto": None, "in_process": True, "separate": False}
"""`policy.engine_process` as `VLLMPolicy(in_process=...)` takes it."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's LoRA kernels are built for (`max_lora_rank` takes one of them)."""


def request_seed(seed: int, row: int) -> int:
    """The seed of row `row` of a call seeded with `seed` and given no streams: a 63-bit hash."""
    digest = hashlib.blake2b(f"{seed}/{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def save_model_folder(model, tokenizer) -> Path:
    """Writes `model` (a plain transformers model) and its tokenizer to a new temporary
    folder, for an engine to start from; the caller owns the folder."""
    folder = Path(tempfile.mkdtemp(prefix="agentgym-vllm-model-"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_sleep_mode(enabled: bool) -> None:
    """Refuses `policy.enable_sleep_mode` where vLLM has no sleep mode (CPU among them): its
    own refusal would come only once the engine starts, after the model and SFT."""
    from vllm.platforms import current_platform

    if enabled and not current_platform.is_sleep_mode_available():
        raise ConfigError(
            f"policy.enable_sleep_mode is true, but vLLM has no sleep mode on this platform "
            f"({current_platform.device_type}); it has one on CUDA, ROCm and XPU. Set "
            "policy.enable_sleep_mode=false."
        )


@contextlib.contextmanager
def engine_processes(*, separate: bool) -> Iterator[None]:
    """Within the block, a new vLLM engine starts in processes of its own (`separate`) or
    in this one. vLLM's switch is an environment variable, read as an engine starts and
    cached once an engine runs in a process; the variable is restored on the way out."""
    import vllm.envs

    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(key)
    os.environ[key] = "1" if separate else "0"
    vllm.envs.disable_envs_cache()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def default_dtype() -> str:
    """The engine's weight dtype for `policy.dtype: auto`: float32 on CPU, as the learner
    there, and bfloat16 on a GPU."""
    return "bfloat16" if torch.cuda.is_available() else "float32"


class VLLMPolicy(PolicyBase):
    """A vLLM engine as a policy.

    Args:
        model_path: A transformers model folder (weights, config, tokenizer).
        stop_ids: Ids that end a turn (`agentgym.policy.hf.stop_token_ids`).
        stop_strings: Text that ends a turn, kept in the output: the chat template's turn
            end where it is several tokens (`TurnEnd.stop_strings`).
        max_model_len: The longest prompt plus completion the engine must hold.
        dtype: The engine's weight dtype, as vLLM names it ("float32", "bfloat16", ...).
        gpu_memory_utilization: Share of the GPU's memory the engine may take.
        enable_sleep_mode: Let `released` free the engine's GPU memory (not on CPU).
        cpu_kv_cache_gb: KV cache size on CPU, in GiB (on a GPU, gpu_memory_utilization
            sizes it).
        lora: The learner's peft `LoraConfig` when it trains LoRA adapters: the engine
            then serves each synced adapter unmerged, as a new adapter version.
        seed: The engine's seed, for requests that carry none.
        owns_folder: Delete `model_path` on `close` (a folder `save_model_folder` made).
        enforce_eager: Skip vLLM's graph compilation; on CPU it costs minutes at start
            for little gain on small models.
        in_process: Run the engine in this process (its worker takes the tensors of
            `load_weights` as they are) rather than in vLLM's own worker process (they
            go through shared memory or CUDA IPC); None: in this process on a GPU, in
            its own on CPU (see the module docstring).
    """

    streams_turns = True

    def __init__(
        self,
        model_path: str | Path,
        *,
        stop_ids: Iterable[int],
        stop_strings: Iterable[str] = (),
        max_model_len: int,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        cpu_kv_cache_gb: float = 1.0,
        lora: Any = None,
        seed: int = 0,
        owns_folder: bool = False,
        enforce_eager: bool | None = None,
        in_process: bool | None = None,
    ):
        from vllm import LLM
        from vllm.platforms import current_platform

        check_sleep_mode(enable_sleep_mode)
        self.model_path = Path(model_path)
        self.stop_ids = set(stop_ids)
        self.stop_strings = tuple(stop_strings)
        self.max_model_len = max_model_len
        self.sleep_enabled = enable_sleep_mode
        self.owns_folder = owns_folder
        self.lora = lora
        self.lora_request = None
        self._lora_dir: Path | None = None
        cpu = current_platform.device_type == "cpu"
        self.in_process = not cpu if in_process is None else in_process
        kwargs: dict[str, Any] = {}
        if cpu:
            kwargs["kv_cache_memory_bytes"] = int(cpu_kv_cache_gb * 2**30)
        if lora is not None:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_lora_rank(lora.r))
        with engine_processes(separate=not self.in_process):
            self.llm = LLM(
                str(model_path),
                dtype=default_dtype() if dtype == "auto" else dtype,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=enable_sleep_mode,
                enable_prefix_caching=True,
                enforce_eager=cpu if enforce_eager is None else enforce_eager,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=f"{WorkerSync.__module__}.{WorkerSync.__name__}",
                seed=seed,
                **kwargs,
            )
        self.adapter_version = 0

    @classmethod
    def for_learner(cls, folder: Path, model, tokenizer, config: Config) -> VLLMPolicy:
        """The engine of a training run, started from `folder` (the start weights, from
        `save_model_folder`; the policy owns it from here on) and serving the learner's
        LoRA adapters when `model`, the learner's model, trains them."""
        from agentgym.policy.hf import stop_token_ids
        from agentgym.policy.turn_end import find_turn_end

        p, s = config.policy, config.sampling
        end = find_turn_end(tokenizer)
        turn = max(s.max_new_tokens, config.eval.max_new_tokens or 0)
        try:
            return cls(
                folder,
                stop_ids=stop_token_ids(model, tokenizer, end),
                stop_strings=end.stop_strings,
                max_model_len=p.max_model_len or s.max_episode_tokens + turn,
                dtype=p.dtype,
                gpu_memory_utilization=p.gpu_memory_utilization,
                enable_sleep_mode=p.enable_sleep_mode,
                cpu_kv_cache_gb=p.cpu_kv_cache_gb,
                lora=model.peft_config["default"] if config.lora.enabled else None,
                seed=config.run.seed,
                owns_folder=True,
                in_process=ENGINE_PROCESS[p.engine_process],
            )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        streams: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Samples one completion per prompt; see `Policy.generate`."""
        from vllm.inputs import TokensPrompt

        check_generate_args(prompts, streams)
        self._check_fit(prompts)
        requests = []
        for i, prompt in enumerate(prompts):
            seed = None
            if streams is not None:
                seed = int(streams[i]) % 2**63
            elif params.seed is not None:
                seed = request_seed(params.seed, i)
            requests.append(self._request(prompt, params, seed))
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
            requests,
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        return [self._generation(out.outputs[0]) for out in outputs]

    def _check_fit(self, prompts: list[list[int]]) -> None:
        """Refuses prompts the engine's context cannot hold, naming the longest."""
        too_long = [len(p) for p in prompts if len(p) >= self.max_model_len]
        if too_long:
            raise ValueError(
                f"a prompt of {max(too_long)} tokens does not fit the engine's "
                f"max_model_len {self.max_model_len} (policy.max_model_len)"
            )

    def _request(self, prompt: list[int], params: SamplingParams, seed: int | None):
        """The engine's sampling parameters for one prompt."""
        from vllm import SamplingParams as VLLMParams

        stop = [*params.stop, *self.stop_strings]
        return VLLMParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=seed,
            max_tokens=min(params.max_new_tokens, self.max_model_len - len(prompt)),
            stop_token_ids=sorted(self.stop_ids),
            logprobs=0,
            skip_special_tokens=False,
            # stop strings are matched on the text: only then does the engine detokenize
            stop=stop,
            include_stop_str_in_output=True,
            detokenize=bool(stop),
        )

    @contextlib.contextmanager
    def turn_stream(self, params: SamplingParams) -> Iterator[VLLMTurnStream]:
        """Turns as the engine's own requests, added while it runs (continuous batching
        over turns): vLLM batches whatever is in flight at each of its steps, and its prefix
        cache continues an episode's next turn from the keys and values of its last."""
        yield VLLMTurnStream(self, params)

    def _generation(self, sample) -> Generation:
        ids = tuple(sample.token_ids)
        logprobs = tuple(
            float(step[t].logprob) for t, step in zip(ids, sample.logprobs, strict=True)
        )
        stopped = sample.finish_reason == "stop" or (bool(ids) and ids[-1] in self.stop_ids)
        return Generation(ids, logprobs, "stop" if stopped else "length")

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Takes the learner's updated weights: full weights in place, in one batched call
        to the engine's model and with no file written, or LoRA adapters (with `lora`) as
        a new adapter version."""
        tensors = [(name, t.detach()) for name, t in named_tensors]
        if self.lora is not None:
            self._load_adapter(tensors)
            return
        if any(".lora_" in name for name, _ in tensors):
            raise ValueError(
                "load_weights got LoRA adapter tensors, but this engine was started "
                "without `lora`; pass the learner's LoraConfig"
            )
        send_weights(self.llm, tensors, in_process=self.in_process)
        self.llm.reset_prefix_cache()

    def _load_adapter(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Writes the adapters as a PEFT folder and serves them under the next adapter id."""
        from vllm.lora.request import LoRARequest

        if not tensors or not all(".lora_" in name for name, _ in tensors):
            raise ValueError(
                "an engine serving LoRA takes only the adapters' tensors (names with "
                ".lora_A / .lora_B), as Learner.named_weights gives them"
            )
        self.adapter_version += 1
        folder = Path(tempfile.mkdtemp(prefix=f"agentgym-lora-{self.adapter_version}-"))
        state = {_peft_name(name): t.to("cpu", copy=True).contiguous() for name, t in tensors}
        save_file(state, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps(_adapter_config(self.lora)))
        previous, previous_dir = self.lora_request, self._lora_dir
        self.lora_request = LoRARequest(
            f"agentgym-v{self.adapter_version}", self.adapter_version, str(folder)
        )
        self.llm.llm_engine.add_lora(self.lora_request)
        self._lora_dir = folder
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous_dir, ignore_errors=True)

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Within the block, the engine's GPU memory is free for the learner (sleep
        level 1: weights to host memory, KV cache dropped); without sleep mode, nothing."""
        if not self.sleep_enabled:
            yield
            return
        self.llm.sleep(level=1)
        try:
            yield
        finally:
            self.llm.wake_up()

    def close(self) -> None:
        """Shuts the engine down and deletes the folders it was given to own; again, nothing."""
        if self.llm is None:
            return
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        for folder in (self._lora_dir, self.model_path if self.owns_folder else None):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _lora_rank(r: int) -> int:
    """The smallest LoRA rank vLLM supports that holds rank `r`."""
    for rank in LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"lora.r is {r}; vLLM serves LoRA ranks up to {LORA_RANKS[-1]}")


def _peft_name(name: str) -> str:
    """A peft parameter name as PEFT saves it: without the adapter's name ("default")."""
    return name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def _adapter_config(lora) -> dict[str, Any]:
    """The adapter_config.json of a peft `LoraConfig`, with the modules it resolved."""
    config = lora.to_dict()
    modules = config.get("target_modules")
    if isinstance(modules, set | frozenset | tuple):
        config["target_modules"] = sorted(modules)
    return json.loads(json.dumps(config, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, set | frozenset | tuple):
        return sorted(value)
    return str(value)


class VLLMTurnStream:
    """`HFPolicy.turn_stream`'s contract over a vLLM engine: `add` is a request added,
    `step` one engine step, returning the turns that finished on it."""

    def __init__(self, policy: VLLMPolicy, params: SamplingParams) -> None:
        self.policy, self.params = policy, params
        self.keys: dict[str, int] = {}  # request id -> the caller's key
        self.count = 0

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, key: int, prompt: list[int], stream: int | None = None) -> None:
        from vllm.inputs import TokensPrompt

        if key in self.keys.values():
            raise ValueError(f"turn_stream: key {key} is already decoding")
        self.policy._check_fit([prompt])
        seed = None if stream is None else int(stream) % 2**63
        if seed is None and self.params.seed is not None:
            seed = request_seed(self.params.seed, self.count)
        self.count += 1
        request = f"turn-{self.count}"
        self.policy.llm.llm_engine.add_request(
            request,
            TokensPrompt(prompt_token_ids=list(prompt)),
            self.policy._request(prompt, self.params, seed),
            lora_request=self.policy.lora_request,
        )
        self.keys[request] = key

    def step(self) -> list[tuple[int, Generation]]:
        if not self.keys:
            return []
        outputs = self.policy.llm.llm_engine.step()
        return [
            (self.keys.pop(out.request_id), self.policy._generation(out.outputs[0]))
            for out in outputs
            if out.finished and out.request_id in self.keys
        ]
