"""`make_player`: who plays the run's episodes, as the config says; the one place a player
is chosen (preflight and `config.rules` only check the options).

A Ray worker, a torchrun rank, the in-process sampler and held-out evaluation each get
their player here, so that a new kind of player (`run.player`) plays everywhere they do.
"""

from __future__ import annotations

from dataclasses import replace

from transformers import PreTrainedTokenizerBase

from agentgym.config import Config
from agentgym.config.files import ConfigError
from agentgym.env.core import env_agent_program
from agentgym.rollout.player import Player, turn_player, user_player
from agentgym.serve.agents import agent_options


def make_player(config: Config, tokenizer: PreTrainedTokenizerBase) -> Player:
    """The agent program the environment declares it is played by (`--env verifiers:...`),
    else the player `run.player` names, else the agent program `run.agent` names (played
    through the endpoint), else the turn loop with the run's environment options."""
    required = env_agent_program(config.run.env)
    if required is not None:
        run = config.run
        if run.player is not None or run.agent not in (None, required):
            given = f"run.player {run.player!r}" if run.player else f"run.agent {run.agent!r}"
            raise ConfigError(
                f"{given} with --env {run.env}: that environment is played by its own "
                f"agent program ({required}); leave {given.split()[0]} out"
            )
        forced = agent_options(config, required)
        assert forced is not None  # an agent is given
        # library code, whose episodes may share one event loop's state: not on threads
        return replace(forced, own_thread=False).player(tokenizer)
    named = user_player(config, tokenizer)
    if named is not None:
        return named
    agent = agent_options(config)
    if agent is not None:
        return agent.player(tokenizer)
    return turn_player(config, tokenizer)
