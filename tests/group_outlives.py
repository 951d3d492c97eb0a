"""Run under torchrun by test_dist_exit.py: joins the group, takes one FSDP step (or a
plain all-reduce), leaves the group, and writes whether it outlived `ranks.shutdown`."""

import sys
from pathlib import Path

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from agentgym.scale import ranks

mode, out = sys.argv[1], Path(sys.argv[2])
assert ranks.init()
if mode == "fsdp":
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
    model(torch.randn(3, 8)).sum().backward()
    del model
else:
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
ranks.shutdown()
(out / f"rank{ranks.rank()}.txt").write_text(str(ranks.group_outlived_shutdown()))
