"""The plan cache: a graph planned once on this machine is not searched again.

Keyed by everything the planner reads (the cost graph, every device's rates and
budget, the objective, whether the host computes, the planner's version), the
cache stores the decisions of the chosen plan; a hit rebuilds the same plan (and
hash) with ``replay`` instead of searching. Entries live under the cache
directory (``$TENSORTORRENT_CACHE_DIR`` or ``~/.cache/tensortorrent``) in
``plans/``; ``TENSORTORRENT_PLAN_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cost_graph import CostGraph
from ..profile.cache import cache_dir
from .files import graph_hash

if TYPE_CHECKING:
    from .. import _planner

log = logging.getLogger(__name__)

PLAN_CACHE_ENV = "TENSORTORRENT_PLAN_CACHE"


def enabled() -> bool:
    return os.environ.get(PLAN_CACHE_ENV, "1") != "0"


def key(
    cost: CostGraph,
    devices: Sequence[_planner.Device],
    objective: str,
    host_compute: bool,
    planner_version: str,
    param_home: Sequence[str] = (),
) -> str:
    """A hash of every input the planner reads."""
    data = {
        "graph": graph_hash(cost),
        "param_home": list(param_home),
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
            ]
            for d in devices
        ],
        "objective": objective,
        "host_compute": host_compute,
        "planner": planner_version,
    }
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(entry: str) -> Path:
    return cache_dir() / "plans" / f"{entry}.json"


def lookup(entry: str) -> dict[str, Any] | None:
    """The cached decisions for ``entry``, or ``None`` (a damaged entry is ignored)."""
    path = _path(entry)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not {"chosen", "node_device", "param_streamed"} <= set(
            data
        ):
            raise ValueError("missing fields")
        kinds: dict[str, type] = {"node_device": int, "param_streamed": bool, "value_spilled": bool}
        if not isinstance(data["chosen"], str) or not all(
            isinstance(values := data.get(k, []), list)
            and all(type(v) is t and isinstance(v, int) and 0 <= v < 2**31 for v in values)
            for k, t in kinds.items()
        ):
            raise ValueError("a field has the wrong type")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:
        log.warning("ignoring the damaged plan cache entry %s: %s", path, exc)
        return None
    return data


def store(entry: str, plan: _planner.Plan) -> None:
    """Remember the decisions of ``plan``; a cache that cannot be written is skipped."""
    path = _path(entry)
    data = {
        "chosen": plan.chosen,
        "node_device": list(plan.node_device),
        "param_streamed": list(plan.param_streamed),
        "value_spilled": list(plan.value_spilled),
        "plan_hash": plan.plan_hash,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: two processes storing one entry must not share a temp file
        temp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
        temp.write_text(json.dumps(data))
        temp.replace(path)
    except OSError as exc:
        log.info("plan cache not written (%s): %s", path, exc)
