"""The plan cache: a graph planned once on this machine is not searched again.

Keyed by everything the planner reads (the cost graph, every device's rates and
budget, the objective, whether the host computes, the planner's version: its crate
version and a hash of its sources, so a change to the search misses), the
cache stores the decisions of the chosen plan; a hit rebuilds the same plan (and
hash) with ``replay`` instead of searching. Entries live under the cache
directory (``$TENSORTORRENT_CACHE_DIR`` or ``~/.cache/tensortorrent``) in
``plans/``; ``TENSORTORRENT_PLAN_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..cost_graph import CostGraph
from ..io.files import digest, write_json
from ..profile.cache import cache_dir
from .decisions import Decisions

if TYPE_CHECKING:
    from .. import _planner

log = logging.getLogger(__name__)


def key(
    cost: CostGraph,
    split: CostGraph | None,
    on_disk: Sequence[str],
    devices: Sequence[_planner.Device],
    in_ram: Sequence[str],
    options: Mapping[str, object],
    planner_version: str,
) -> str:
    """A hash of every input the planner reads."""
    data = {
        "graph": cost.digest(),
        "split": split.digest() if split is not None else None,
        "on_disk": list(on_disk),
        "in_ram": list(in_ram),
        "devices": [
            [
                d.name,
                d.is_host,
                d.flops_per_s,
                d.budget_bytes,
                d.h2d_bytes_per_s,
                d.d2h_bytes_per_s,
                d.latency_s,
                d.mem_bytes_per_s,
                d.disk_bytes_per_s,
                d.disk_latency_s,
                d.read_slowdown,
                d.read_cpu_s,
                d.inline_read_bytes,
                d.inline_read_s,
                d.segment_call_s,
                d.resident_lookup_s,
                d.stream_op_s,
                d.cold_latency_s,
                list(d.class_flops_per_s),
                list(d.class_latency_s),
            ]
            for d in devices
        ],
        "options": dict(options),
        "planner": planner_version,
    }
    return digest(data, 32)


def _path(entry: str) -> Path:
    return cache_dir() / "plans" / f"{entry}.json"


def lookup(entry: str) -> Decisions | None:
    """The cached decisions for ``entry``, or ``None`` (a damaged entry is ignored)."""
    path = _path(entry)
    try:
        return Decisions.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("ignoring the damaged plan cache entry %s: %s", path, exc)
        return None


def store(entry: str, decisions: Decisions) -> None:
    """Remember ``decisions``; a cache that cannot be written is skipped."""
    path = _path(entry)
    try:
        write_json(path, decisions.to_json())
    except OSError as exc:
        log.info("plan cache not written (%s): %s", path, exc)
