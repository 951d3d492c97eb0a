"""Every option of a run (`sections`), and the config built from a file and overrides (`files`)."""

from agentgym.config.files import ConfigError, load_config
from agentgym.config.sections import (
    MIX_ENV,
    Config,
    CurriculumConfig,
    DistributedConfig,
    EvalConfig,
    GRPOConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PipelineConfig,
    PolicyConfig,
    RewardFunctionConfig,
    RewardsConfig,
    RunConfig,
    SamplingConfig,
    SFTConfig,
)

__all__ = [
    "MIX_ENV",
    "Config",
    "ConfigError",
    "CurriculumConfig",
    "DistributedConfig",
    "EvalConfig",
    "GRPOConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "PipelineConfig",
    "PolicyConfig",
    "RewardFunctionConfig",
    "RewardsConfig",
    "RunConfig",
    "SamplingConfig",
    "SFTConfig",
    "load_config",
]
