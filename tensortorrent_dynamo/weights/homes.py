"""Where weights live between runs: on disk (and giving their RAM back), or pinned.

A parameter lives on disk in one of two ways:

* the model was built on the meta device and its weights are in the user's safetensors
  checkpoint (``checkpoint=``): :func:`bind_checkpoint` gives each meta tensor a CPU
  placeholder of the right shape and dtype with no storage, and remembers where its
  bytes are in the file;
* the plan made its home disk because the host budget cannot hold the weights:
  :func:`place_on_disk` writes the parameters the plan streams to the offload store
  (once: the store keeps checksums and reuses what is already there) and then releases
  their RAM, leaving the model's tensor an empty placeholder.

Either way the tensor is *released*: its storage holds no bytes, its shape, dtype and
identity are unchanged (so Dynamo's guards still hold), and :func:`released_location`
says where its bytes are. The runtime reads them from there on each run.

Weights that stay in host RAM but stream to a CUDA device are moved to pinned memory
(:func:`pin_streamed_weights`), so their copies are asynchronous.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..cost_graph import CostGraph
from ..errors import CheckpointError
from ..io.integrity import FileGuard
from ..io.safetensors import TensorLocation, safetensors_locations
from ..io.store import OffloadStore
from ..plan.planner import GraphPlan
from ..profile.cache import default_offload_dir
from ..settings import Settings
from ..units import format_bytes

log = logging.getLogger(__name__)

# id(tensor) -> (weak reference to it, where its bytes are)
_released: dict[int, tuple[weakref.ref[torch.Tensor], TensorLocation]] = {}
# offload stores this process wrote (and released weights to)
_stores: set[Path] = set()


def released_location(tensor: torch.Tensor) -> TensorLocation | None:
    """Where the bytes of a released tensor are; ``None`` for a tensor that holds its own."""
    entry = _released.get(id(tensor))
    if entry is None or entry[0]() is not tensor:
        return None
    return entry[1]


def _remember(tensor: torch.Tensor, location: TensorLocation) -> None:
    """Record that ``tensor``'s bytes are at ``location``, for as long as it lives."""
    key = id(tensor)
    _released[key] = (weakref.ref(tensor, lambda _: _released.pop(key, None)), location)


def _release(tensor: torch.Tensor, location: TensorLocation) -> None:
    """Give the tensor's RAM back: the same tensor object now holds an empty placeholder."""
    _remember(tensor, location)
    tensor.data = _placeholder(location)


def _placeholder(location: TensorLocation) -> torch.Tensor:
    """A CPU tensor of the location's shape and dtype that holds no bytes.

    ``torch.empty`` reserves address space only; the pages are never touched before the
    storage is resized to nothing, so the placeholder never costs RAM.
    """
    tensor = torch.empty(location.shape, dtype=location.dtype)
    tensor.untyped_storage().resize_(0)
    return tensor


def bind_checkpoint(model: torch.nn.Module, path: str | os.PathLike[str]) -> int:
    """Point every meta parameter and buffer of ``model`` at its bytes in the safetensors
    file ``path``; returns how many were bound. Nothing is read but the file's header.

    Raises :class:`CheckpointError` when a meta tensor is missing from the file or differs
    from it in shape or dtype.
    """
    locations = _guarded(safetensors_locations(path), Path(os.path.abspath(path)))
    bound = 0
    seen: dict[int, torch.Tensor] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        prefix = f"{module_name}." if module_name else ""
        for table in (module._parameters, module._buffers):
            for name, tensor in list(table.items()):
                if tensor is None or tensor.device.type != "meta":
                    continue
                if id(tensor) in seen:  # tied weights: one placeholder for every name
                    table[name] = seen[id(tensor)]
                    continue
                replacement = _bound(tensor, _find(model, tensor, prefix + name, locations, path))
                seen[id(tensor)] = replacement
                table[name] = replacement
                bound += 1
    log.info("bound %d meta tensors of the model to %s", bound, path)
    return bound


def _guarded(locations: dict[str, TensorLocation], path: Path) -> dict[str, TensorLocation]:
    """The checkpoint's locations, each read verified from then on: its blocks' checksums are
    recorded at their first read, and the file must keep the size and modification time it
    has now."""
    guard = FileGuard(
        path,
        {key: (loc.offset, loc.nbytes, None) for key, loc in locations.items()},
        source="checkpoint",
        advice=(
            "The model's weights are read from this file on every call: restore it, or build "
            "the model on the meta device again and compile it with the checkpoint as it is now"
        ),
    )
    return guard.locate(locations)


def _find(
    model: torch.nn.Module,
    tensor: torch.Tensor,
    fqn: str,
    locations: dict[str, TensorLocation],
    path: str | os.PathLike[str],
) -> TensorLocation:
    """The checkpoint entry of ``tensor``: by ``fqn``, else by any other name it has
    (a tied weight may be stored under either)."""
    location = locations.get(fqn)
    if location is None:  # walk the model's names only for a tensor stored under another
        names = [n for n, p in model.named_parameters(remove_duplicate=False) if p is tensor]
        names += [n for n, b in model.named_buffers(remove_duplicate=False) if b is tensor]
        location = next((locations[n] for n in names if n in locations), None)
    if location is None:
        raise CheckpointError(
            f"{path}: no tensor named {fqn!r}; the model's {fqn} is on the meta device, so "
            "its weights must be in the checkpoint (buffers computed at construction can be "
            "kept real with accelerate.init_empty_weights(include_buffers=False))"
        )
    if tuple(location.shape) != tuple(tensor.shape) or location.dtype != tensor.dtype:
        raise CheckpointError(
            f"{path}: {location.key} is {location.dtype} {list(location.shape)} in the file but "
            f"the model's {fqn} is {tensor.dtype} {list(tensor.shape)}"
        )
    return location


def _bound(tensor: torch.Tensor, location: TensorLocation) -> torch.Tensor:
    placeholder = _placeholder(location)
    if isinstance(tensor, torch.nn.Parameter):
        placeholder = torch.nn.Parameter(placeholder, requires_grad=tensor.requires_grad)
    _remember(placeholder, location)
    return placeholder


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
    disk = [i for i in range(len(plan.cost.params)) if plan.on_disk(i)]
    _check_stores(loc for i in disk if (loc := weights[i].location()) is not None)
    to_write: dict[str, torch.Tensor] = {}
    for pid in disk:
        weight = weights[pid]
        if plan.is_streamed(pid) and released_location(weight.tensor) is None:
            to_write[weight.fqn] = weight.tensor
    if to_write:
        _write_and_release(plan.graph_index, to_write, settings)
    locations: dict[str, TensorLocation] = {}
    for pid in disk:
        location = weights[pid].location()
        if location is not None:
            locations[plan.cost.params[pid].fqn] = location
    return locations


def _write_and_release(
    graph_index: int, to_write: dict[str, torch.Tensor], settings: Settings
) -> None:
    """Write ``to_write`` (by fqn) to the offload store, then release their RAM."""
    # One directory per set of parameters (names, shapes, dtypes): models of another
    # architecture never share shards; the same one reuses what is already written.
    layout = sorted((k, str(t.dtype), list(t.shape)) for k, t in to_write.items())
    digest = hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]
    store = OffloadStore(offload_dir(settings) / digest)
    written = store.write({k: t.detach() for k, t in to_write.items()})
    _stores.add(store.directory)
    for fqn, tensor in to_write.items():
        _release(tensor, written[fqn])
    total = sum(w.nbytes for w in written.values())
    log.warning(
        "graph %d: %d parameters (%s) now live on disk in %s and their RAM was released; "
        "the model's tensors are empty placeholders, so call the model through the compiled "
        "module only",
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


def pin_streamed_weights(plan: GraphPlan, example_inputs: Sequence[Any]) -> int:
    """Move the host-RAM weights the plan streams to a CUDA device into pinned memory, once,
    so that every prefetch is an asynchronous DMA copy (from pageable memory a copy is
    staged and synchronous); returns how many were pinned. The tensor objects stay the
    same (their ``data`` is swapped), so nothing recompiles.
    """
    pinned = 0
    for pid, ref in enumerate(plan.cost.params):
        if plan.on_disk(pid) or not plan.is_streamed(pid):
            continue
        if not plan.param_device(pid).startswith("cuda"):
            continue
        tensor = example_inputs[ref.arg_index]
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor.data = tensor.data.pin_memory()
            pinned += 1
    if pinned:
        log.info("graph %d: pinned %d streamed weights in host memory", plan.graph_index, pinned)
    return pinned
