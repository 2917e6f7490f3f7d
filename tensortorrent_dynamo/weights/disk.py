"""Weights the plan puts on disk: written once to the offload store, their RAM released
(:func:`place_on_disk`), and where each planned parameter's bytes come from
(:class:`Weight`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cost_graph import CostGraph
from ..io.files import digest
from ..io.locations import TensorLocation
from ..io.store import OffloadStore, let_go, remove_unused, tensor_sums
from ..plan.planner import GraphPlan
from ..profile.cache import default_offload_dir
from ..settings import Settings
from ..units import format_bytes
from .released import mapped_directories, release, released_location

log = logging.getLogger(__name__)

# offload stores this process wrote (and released weights to)
_stores: set[Path] = set()


def offload_dir(settings: Settings) -> Path:
    """The disk tier's directory: the ``offload_dir`` option, else ``<cache dir>/offload``."""
    return Path(settings.offload_dir) if settings.offload_dir else default_offload_dir()


@dataclasses.dataclass(frozen=True)
class Weight:
    """Where a planned parameter's bytes come from: the model's tensor ``tensor`` (named
    ``fqn``), whole, or only its rows ``rows`` when the planner sees it in row chunks
    (``chunking.py``)."""

    fqn: str
    tensor: torch.Tensor
    rows: tuple[int, int] | None = None

    def location(self) -> TensorLocation | None:
        """Where these bytes are on disk; ``None`` while the tensor holds its own."""
        location = released_location(self.tensor)
        if location is None or self.rows is None:
            return location
        return location.rows(*self.rows)


def whole_weights(cost: CostGraph, example_inputs: Sequence[Any]) -> list[Weight]:
    """The weight of each parameter of ``cost``: the graph input itself, whole."""
    return [Weight(p.fqn, example_inputs[p.arg_index]) for p in cost.params]


def place_on_disk(
    plan: GraphPlan, weights: Sequence[Weight], settings: Settings
) -> dict[str, TensorLocation]:
    """Where each parameter of ``plan`` whose home is disk is, by the plan's fqn
    (``weights[i]`` is where parameter ``i``'s bytes come from).

    Tensors the plan streams (a part of) from disk and that still hold their bytes are
    written to the offload store whole, then their RAM is released; those the plan keeps
    in RAM stay as they are (and are not in the result unless already released).
    """
    disk = [i for i, r in enumerate(plan.residency) if r.on_disk]
    _check_stores(loc for i in disk if (loc := weights[i].location()) is not None)
    to_write: dict[str, torch.Tensor] = {}
    for pid in disk:
        weight = weights[pid]
        if plan.residency[pid].streams and released_location(weight.tensor) is None:
            to_write[weight.fqn] = weight.tensor
    if to_write:
        _write_and_release(plan.graph_index, to_write, settings)
    locations: dict[str, TensorLocation] = {}
    for pid in disk:
        location = weights[pid].location()
        if location is not None:
            locations[plan.cost.params[pid].fqn] = location
    return locations


def released_weights(plan: GraphPlan, weights: Sequence[Weight]) -> frozenset[str]:
    """The weights (whole, by fqn) of ``plan``'s parameters on disk whose RAM is released:
    the model's tensors hold no bytes (``weights[i]`` is where parameter ``i``'s come
    from)."""
    return frozenset(
        w.fqn
        for w, r in zip(weights, plan.residency, strict=True)
        if r.on_disk and released_location(w.tensor) is not None
    )


def _write_and_release(
    graph_index: int, to_write: dict[str, torch.Tensor], settings: Settings
) -> None:
    """Write ``to_write`` (by fqn) to the offload store, then release their RAM."""
    # One store per set of weights (names, shapes, dtypes and bytes): the same weights
    # compiled again reuse what is already written, and another model's never displace
    # them (two of one architecture, a base model and its fine-tune, in the default
    # directory every model shares). This process holds the store while its tensors map
    # it; the stores of the same parameters with other bytes that no process holds (written
    # before the weights changed, in this process or another) are deleted.
    tensors = {k: t.detach() for k, t in to_write.items()}
    sums = tensor_sums(tensors)
    layout = digest(sorted((k, str(t.dtype), list(t.shape)) for k, t in tensors.items()))
    root = offload_dir(settings)
    store = OffloadStore(root / f"{layout}-{digest(sorted(sums.items()))}")
    written = store.write(tensors, sums=sums, hold=True)
    _stores.add(store.directory)
    stale = [d for d in root.glob(f"{layout}-*") if d != store.directory]
    mapped = mapped_directories()
    for directory in stale:
        if directory in _stores and directory not in mapped:
            let_go(directory)
            _stores.discard(directory)
    for directory in remove_unused(stale):
        log.info("offload: deleted %s, the same parameters' other weights", directory)
    for fqn, tensor in to_write.items():
        release(tensor, written[fqn])
    total = sum(w.nbytes for w in written.values())
    log.warning(
        "graph %d: %d parameters (%s) now live on disk in %s and their RAM was released; "
        "the model's tensors map their bytes there, so code run outside the compiled graphs "
        "(the original module, generate()'s encoder) reads them through the page cache, "
        "unverified and outside the budgets",
        graph_index,
        len(to_write),
        format_bytes(total),
        store.directory,
    )


def _check_stores(locations: Iterable[TensorLocation]) -> None:
    """Check the offload stores holding weights released to them by an earlier compile
    (a graph break or a recompile): their only copy is on disk, so a damaged shard raises
    ``OffloadCorruptError`` now rather than feeding wrong weights to the model."""
    by_store: dict[Path, list[str]] = {}
    for location in locations:
        if location.path.parent in _stores:
            by_store.setdefault(location.path.parent, []).append(location.key)
    for directory, keys in by_store.items():
        OffloadStore(directory).locations(keys, verify=True)
