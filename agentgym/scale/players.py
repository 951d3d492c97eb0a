"""`make_player`: who plays the run's episodes, as the config says; the one place a player
is chosen (preflight and `config.rules` only check the options).

A Ray worker, a torchrun rank, the in-process sampler and held-out evaluation each get
their player here, so that a new kind of player (`run.player`) plays everywhere they do.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from agentgym.config import Config
from agentgym.rollout.player import Player, turn_player, user_player
from agentgym.serve.agents import agent_options


def make_player(config: Config, tokenizer: PreTrainedTokenizerBase) -> Player:
    """The player `run.player` names, else the agent program `run.agent` names (played
    through the endpoint), else the turn loop with the run's environment options."""
    named = user_player(config, tokenizer)
    if named is not None:
        return named
    agent = agent_options(config)
    if agent is not None:
        return agent.player(tokenizer)
    return turn_player(config, tokenizer)
