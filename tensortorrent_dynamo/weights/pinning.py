"""Weights that stay in host RAM but stream to a CUDA device live in pinned memory, so
that their copies are asynchronous."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..plan.planner import GraphPlan

log = logging.getLogger(__name__)


def pin_streamed_weights(plan: GraphPlan, example_inputs: Sequence[Any]) -> int:
    """Move the host-RAM weights the plan streams to a CUDA device into pinned memory, once,
    so that every prefetch is an asynchronous DMA copy (from pageable memory a copy is
    staged and synchronous); returns how many were pinned. The tensor objects stay the
    same (their ``data`` is swapped), so nothing recompiles.
    """
    pinned = 0
    for ref, residency in zip(plan.cost.params, plan.residency, strict=True):
        if not residency.pinned:
            continue
        tensor = example_inputs[ref.arg_index]
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor.data = tensor.data.pin_memory()
            pinned += 1
    if pinned:
        log.info("graph %d: pinned %d streamed weights in host memory", plan.graph_index, pinned)
    return pinned
