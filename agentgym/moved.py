"""Import paths the docs gave before their modules moved: each still imports, with a
`DeprecationWarning` naming where its names are now.

`MOVED` maps an old module to the modules holding its names today, searched in order
(`agentgym.grpo`'s loss registry went to `agentgym.learn.losses`, the rest to
`agentgym.learn.grpo`). An old module is a stand-in that hands each name on from there:
`from agentgym.checker import check_agent_env` gives the same function as
`from agentgym.env.checker import check_agent_env`. `agentgym/__init__.py` installs the
finder; no file of the old name exists, so no two modules share a name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

MOVED: dict[str, tuple[str, ...]] = {
    "agentgym.checker": ("agentgym.env.checker",),
    "agentgym.checkpoint": ("agentgym.run.checkpoint",),
    "agentgym.core": ("agentgym.env.core",),
    "agentgym.dist": ("agentgym.learn.dist", "agentgym.scale.ranks"),
    "agentgym.fsdp_sync": ("agentgym.scale.ranks",),
    "agentgym.grpo": ("agentgym.learn.grpo", "agentgym.learn.losses"),
    "agentgym.health": ("agentgym.run.health",),
    "agentgym.heldout": ("agentgym.eval.heldout", "agentgym.eval.report", "agentgym.eval.command"),
    "agentgym.policy.factory": ("agentgym.policy.backend",),
    "agentgym.policy.vllm_sync": ("agentgym.sync.vllm_worker",),
    "agentgym.preflight": ("agentgym.run.preflight",),
    "agentgym.ray_rollout": ("agentgym.scale.ray_rollout",),
    "agentgym.reward_fns": ("agentgym.rewards.functions",),
    "agentgym.run.doctor": ("agentgym.doctor.template_checks",),
    "agentgym.run.export": ("agentgym.export.model_folder",),
    "agentgym.run.rft": ("agentgym.rft.rejection_sampling",),
    "agentgym.run.sft": ("agentgym.sft.warmup", "agentgym.policy.models", "agentgym.run.phases"),
    "agentgym.run.update": ("agentgym.learn.update",),
    "agentgym.sandboxes.base": ("agentgym.sandboxes.contract",),
    "agentgym.scale.dist": ("agentgym.scale.ranks",),
    "agentgym.scale.fsdp_sync": ("agentgym.scale.ranks",),
    "agentgym.scale.weight_sync": ("agentgym.sync",),
    "agentgym.train": ("agentgym.run.train",),
    "agentgym.weight_sync": ("agentgym.sync",),
}


class MovedModule(types.ModuleType):
    """An old module path: each attribute is looked up in the modules that hold it now."""

    __moved_to__: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for target in self.__moved_to__:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(
            f"module {self.__name__!r} (moved to {' and '.join(self.__moved_to__)}) has no "
            f"attribute {name!r}"
        )

    def __dir__(self) -> list[str]:
        names = {n for t in self.__moved_to__ for n in dir(importlib.import_module(t))}
        return sorted(names)


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the modules of `MOVED` (after every other finder: a real module wins)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return MovedModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        targets = MOVED[module.__name__]
        assert isinstance(module, MovedModule)
        module.__moved_to__ = targets
        for target in targets:  # a target that fails to import fails the old path too
            importlib.import_module(target)
        warnings.warn(
            f"{module.__name__} has moved: import from {' or '.join(targets)}",
            DeprecationWarning,
            stacklevel=_importer_level(),
        )


def _importer_level() -> int:
    """The warning's stack level of the first frame outside importlib and this module:
    the line that imported the old path. `warnings.warn` does not count importlib's
    bootstrap frames, so neither does this."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and (
        frame.f_code.co_filename == __file__ or "importlib" in frame.f_code.co_filename
    ):
        frame = frame.f_back
        name = frame.f_code.co_filename
        level += not ("importlib" in name and "_bootstrap" in name)
    return level


def install() -> None:
    """Puts the finder at the end of `sys.meta_path`, once."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
