"""The plan cache's key: every figure of every device the planner reads is in it, so that a
plan searched under other figures is never replayed as if it were this search's."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tensortorrent_dynamo import _planner as planner
from tensortorrent_dynamo.cost_graph import CostGraph
from tensortorrent_dynamo.plan import cache
from tests.models import mlp
from tests.unit.cost_graph.test_cost_graph import capture

BASE: dict[str, Any] = {
    "mem_bytes_per_s": 5e10,
    "disk_bytes_per_s": 2e9,
    "class_flops_per_s": [1e11],
    "disk_latency_s": 4e-4,
    "read_slowdown": 1.5,
    "read_cpu_s": 5e-5,
    "inline_read_bytes": 65536,
    "inline_read_s": 8e-5,
    "segment_call_s": 7e-6,
    "resident_lookup_s": 2e-6,
    "stream_op_s": 1.5e-5,
    "class_latency_s": [3e-6],
    "cold_latency_s": 2e-6,
}


@functools.cache
def _graph() -> CostGraph:
    (graph,) = capture(mlp(16, 2), torch.randn(2, 16))
    return graph


def _key(**changed: Any) -> str:
    graph = _graph()
    host = planner.Device("cpu", True, 2e11, 1 << 30, 0.0, 0.0, 2.5e-6, **{**BASE, **changed})
    return cache.key(graph, None, [], [host], [], {}, "1.0.0+src.0")


@pytest.mark.parametrize(
    "changed",
    [
        {"mem_bytes_per_s": 6e10},
        {"disk_bytes_per_s": 3e9},
        {"class_flops_per_s": [2e11]},
        {"disk_latency_s": 1e-4},
        {"read_slowdown": 1.2},
        {"read_cpu_s": 7e-5},
        {"inline_read_bytes": 4096},
        {"inline_read_s": 9e-5},
        {"segment_call_s": 8e-6},
        {"resident_lookup_s": 3e-6},
        {"stream_op_s": 1e-5},
        {"class_latency_s": [4e-6]},
        {"cold_latency_s": 1e-6},
    ],
    ids=lambda changed: next(iter(changed)),
)
def test_every_device_figure_the_planner_reads_changes_the_key(changed: dict[str, Any]) -> None:
    assert _key(**changed) != _key()
    assert _key() == _key()
