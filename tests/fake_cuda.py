"""Plans with segments on ``cuda:0`` on a machine without one: a profile that has a
nominal CUDA device, and each CUDA segment run on fake tensors on it (fake tensors check
that an op's inputs share a device, and make nothing). What is checked is where each
segment's tensors are; the CUDA runtime itself needs a GPU (``bench/gpu_check.sh``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from tensortorrent_dynamo.compiling.segments import fake_inputs
from tensortorrent_dynamo.cost_graph import build_cost_graph
from tensortorrent_dynamo.functional import GraphInputs
from tensortorrent_dynamo.passes.rewrite import Rewritten, rewrite
from tensortorrent_dynamo.plan.planner import plan_graph
from tensortorrent_dynamo.profile.host import (
    NOMINAL_CUDA_FLOPS,
    NOMINAL_CUDA_LATENCY_S,
    NOMINAL_CUDA_LINK_BYTES_PER_S,
    DeviceProfile,
)
from tensortorrent_dynamo.profile.resolve import nominal_profile
from tensortorrent_dynamo.run.residents import ResidentCopies
from tensortorrent_dynamo.run.runtime import Runtime
from tensortorrent_dynamo.settings import parse_options

CUDA = "cuda:0"


def plan_on_cuda(
    index: int, gm: torch.fx.GraphModule, inputs: GraphInputs, budget: int | None = None
) -> Rewritten:
    """``gm`` planned for a host with a nominal ``cuda:0`` of ``budget`` bytes (1 GiB
    when ``None``) and rewritten; nothing is copied anywhere."""
    memory = 1 << 30 if budget is None else budget
    cuda = DeviceProfile(
        CUDA,
        "cuda",
        memory,
        NOMINAL_CUDA_FLOPS,
        NOMINAL_CUDA_LINK_BYTES_PER_S,
        NOMINAL_CUDA_LINK_BYTES_PER_S,
        NOMINAL_CUDA_LATENCY_S,
    )
    base = nominal_profile()
    profile = dataclasses.replace(base, devices=(*base.devices, cuda))
    budgets = {} if budget is None else {CUDA: budget}
    settings = parse_options(compiler="eager", devices=[CUDA], budgets=budgets)
    cost = build_cost_graph(gm, inputs.values, inputs.params)
    plan = plan_graph(index, cost, profile, settings, {})
    return rewrite(gm, plan, Runtime({}, None, ResidentCopies()))


def cuda_segments(rewritten: Rewritten) -> list[str]:
    return [name for name, device in rewritten.segments.items() if device == CUDA]


def run_on_fake_cuda(rewritten: Rewritten, name: str) -> Sequence[Any]:
    """Segment ``name``'s outputs, run on the fake inputs it is compiled for."""
    parent = rewritten.module
    fakes = fake_inputs(parent, name, torch.device(CUDA))
    mode = next(f.fake_mode for f in fakes if isinstance(f, FakeTensor))
    with mode, torch.no_grad():
        out = getattr(parent, name)(*fakes)
    return out if isinstance(out, (tuple, list)) else (out,)
