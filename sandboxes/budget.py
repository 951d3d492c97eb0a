"""How the local sandbox bounds a run's memory and processes: a cgroup, or split rlimits.

The modes (`BudgetMode`, chosen by `LocalSandbox(budget=...)`):

- "cgroup": one cgroup per run (see `agentgym.sandboxes.cgroups`) holds
  the tree's memory at `memory_mb` with no swap and its processes at the
  process cap. Each process also keeps `RLIMIT_AS = memory_mb`, so a
  single huge allocation still fails as a MemoryError rather than an OOM
  kill.
- "rlimit": the fallback where no cgroup can be made. rlimits bind each
  process alone, so the budget is split: `processes x address space <=
  memory_mb`, with at least `FALLBACK_FLOOR_MB` of address space each (a
  bare `python -S` maps about 13 MB; the code env's harness runs in about
  30 MB) and as many processes as then fit, up to the cap.
- "per_process": the old, unsafe behaviour, `memory_mb` for each of up
  to `max_processes` processes. Only for measuring what the other modes
  prevent.

"auto" takes "cgroup" where `cgroups.detect()` finds a hierarchy, else
"rlimit" with one warning saying why.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

from agentgym.sandboxes import cgroups
from agentgym.sandboxes.contract import BudgetMode, SandboxUnavailableError

Budget = Literal["auto", "cgroup", "rlimit", "per_process"]
FALLBACK_FLOOR_MB = 128
"""The least address space a process gets in the rlimit fallback."""


@dataclass(frozen=True)
class BudgetPlan:
    """The mode a sandbox runs in, where its groups go, and why it is not "cgroup"."""

    mode: BudgetMode
    hierarchy: cgroups.Hierarchy | None = None
    reason: str | None = None

    def describe(self, max_processes: int) -> str:
        """One line for logs: the mode and what it bounds."""
        if self.hierarchy is not None:
            where = self.hierarchy.memory_parent
            return (
                f"cgroup v{self.hierarchy.version} under {where}: memory_mb and "
                f"{max_processes} processes for each run's whole tree"
            )
        if self.mode == "rlimit":
            return (
                f"rlimit fallback ({self.reason}): memory_mb split over at most "
                f"memory_mb // {FALLBACK_FLOOR_MB} (<= {max_processes}) processes"
            )
        return f"per_process (UNSAFE): memory_mb for each of {max_processes} processes"


@dataclass(frozen=True)
class ProcessLimits:
    """The rlimits a run's processes get: address space each, and how many of them."""

    address_space_bytes: int
    processes: int


def plan_budget(budget: Budget) -> BudgetPlan:
    """Resolves `budget` on this machine; warns once when "auto" falls back.

    Raises:
        SandboxUnavailableError: for budget="cgroup" where no cgroup can be made.
        ValueError: for an unknown budget.
    """
    if budget not in ("auto", "cgroup", "rlimit", "per_process"):
        raise ValueError(f"unknown budget {budget!r}: auto, cgroup, rlimit or per_process")
    if budget == "per_process":
        warnings.warn(
            "LocalSandbox(budget='per_process') bounds each process, not the run: a run may "
            "use max_processes x memory_mb",
            stacklevel=3,
        )
        return BudgetPlan("per_process")
    if budget == "rlimit":
        return BudgetPlan("rlimit", reason="asked for")
    found = cgroups.detect()
    if isinstance(found, cgroups.Hierarchy):
        return BudgetPlan("cgroup", found)
    if budget == "cgroup":
        raise SandboxUnavailableError(f"budget='cgroup': no cgroup for runs here: {found}")
    warnings.warn(
        f"LocalSandbox: no cgroup for runs ({found}); falling back to rlimits split so that "
        f"processes x address space <= memory_mb (at least {FALLBACK_FLOOR_MB} MB each)",
        stacklevel=3,
    )
    return BudgetPlan("rlimit", reason=found)


def process_limits(mode: BudgetMode, memory_mb: int, max_processes: int) -> ProcessLimits:
    """The address-space and process rlimits of a run under `mode` (see the module doc)."""
    if mode != "rlimit":
        return ProcessLimits(memory_mb << 20, max_processes)
    processes = max(1, min(max_processes, memory_mb // FALLBACK_FLOOR_MB))
    return ProcessLimits((memory_mb << 20) // processes, processes)
