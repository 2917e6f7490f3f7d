"""Released weights: model tensors whose bytes are on disk, not in RAM.

A parameter's bytes are on disk in one of two ways:

* the model was built on the meta device and its weights are in the user's safetensors
  checkpoint (``checkpoint=``): :func:`bind_checkpoint` gives each meta tensor a CPU
  placeholder of the right shape and dtype with no storage, and remembers where its
  bytes are in the file;
* the plan put it on disk (``weights.disk.place_on_disk``): its bytes were written to
  the offload store and its RAM released.

Either way the tensor is *released*: its storage holds no bytes, its shape, dtype and
identity are unchanged (so Dynamo's guards still hold), and :func:`released_location`
says where its bytes are. The runtime reads them from there on each run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import cast

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import CheckpointError
from ..io.locations import FileGuard, TensorLocation
from ..io.safetensors import safetensors_locations

log = logging.getLogger(__name__)

# tensor -> where its bytes are, for as long as the tensor lives
_released: WeakIdKeyDictionary = WeakIdKeyDictionary()


def released_location(tensor: torch.Tensor) -> TensorLocation | None:
    """Where the bytes of a released tensor are; ``None`` for a tensor that holds its own."""
    location = _released.get(tensor)  # type: ignore[no-untyped-call]
    return cast("TensorLocation | None", location)


def _remember(tensor: torch.Tensor, location: TensorLocation) -> None:
    """Record that ``tensor``'s bytes are at ``location``, for as long as it lives."""
    _released[tensor] = location


def release(tensor: torch.Tensor, location: TensorLocation) -> None:
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
