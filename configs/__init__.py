"""The configs shipped with agentgym (`agentgym.configs`): `tool_call.yaml` is the default run,
what `agentgym train` with neither `--env` nor `--config` trains (and `make train`); the others
are named by `--config NAME` (`agentgym.config.files.shipped_config`)."""
