"""Released weights: model tensors whose bytes are on disk, not in RAM.

A parameter's bytes are on disk in one of two ways:

* the model was built on the meta device and its weights are in the user's safetensors
  checkpoint (``checkpoint=``): :func:`bind_checkpoint` gives each meta tensor a CPU
  tensor of the right shape and dtype over its bytes in the file, and remembers where
  they are;
* the plan put it on disk (``weights.disk.place_on_disk``): its bytes were written to
  the offload store and its RAM released.

Either way the tensor is *released*: its shape, dtype and identity are unchanged (so
Dynamo's guards still hold), :func:`released_location` says where its bytes are, and the
runtime reads them from there on each run. Its storage is those bytes in the file, mapped
copy-on-write: no RAM is set aside for them, and code that calls the model's modules
outside the compiled graphs (``generate()`` runs an encoder-decoder's encoder eagerly;
a user calls the original module) reads them through the page cache, unverified and outside
the budgets, where it would otherwise fail deep inside torch on a tensor with no storage.
A write to the tensor copies the pages it touches into RAM and never reaches the file, so
the compiled graphs, which read the file, would run on the old bytes. A tensor given other
bytes (``.data = ...``, ``module.to(dtype)``, an adapter merged) holds its own again
(:func:`released_location` is ``None``): a plan that reads it from disk is refused by
:func:`check_released` before the runtime reads it (``ReplacedWeightError``), and its graph
planned again, where it is now. A tensor written in place since it was released (its version
counter moved: the model's own ``load_state_dict``, an in-place op; or through ``.data``,
``p.data += delta``, an adapter merged in place, which moves no version counter but copies
the pages it touches out of the file's mapping: the process's page map (:mod:`..io.pagemap`)
shows them, and where their bytes differ from the file's the tensor was written; on Linux,
elsewhere such a write goes unseen) is made one given other bytes: :func:`own_written_bytes`
gives it RAM of its own holding its bytes as the model sees them, at the disk read that
finds it (for every weight so written) or before a graph is planned (for its weights). Where
the file cannot be mapped (no ``mmap``, a damaged file), the storage is empty.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import mmap
import os
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..errors import CheckpointError, ReplacedWeightError
from ..io.locations import FileGuard, TensorLocation, dense
from ..io.page_cache import PAGE_BYTES
from ..io.pagemap import copied_ranges, pages_copied
from ..io.safetensors import checkpoint_files, safetensors_locations

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, eq=False)
class HeldBytes:
    """What a tensor held at a moment: its version counter, the address of its bytes, and
    their storage (held, so that no other bytes can take that address while this lives).
    A write in place moves the version counter; ``.data = ...`` (``module.to(dtype)``)
    changes the address; a write in place through ``.data`` changes neither.

    Made ``sampled``, it also tells, cheaply on every check, a write through ``.data`` that
    changes much of the tensor (an adapter merged in place): for a tensor in RAM, by a few of
    its bytes kept (:class:`_Sample`); for a released one, by whether the page of the first
    of them was copied out of the file's mapping (:class:`_MappedSample`). A write to a few
    elements elsewhere may go unseen."""

    version: int | None  # None: an inference tensor, which has no version counter
    data_ptr: int
    storage: torch.UntypedStorage
    sample: _Sample | _MappedSample | None = None

    @classmethod
    def of(cls, tensor: torch.Tensor, *, sampled: bool = False) -> HeldBytes:
        sample = _sample_of(tensor) if sampled else None
        return cls(_version(tensor), tensor.data_ptr(), tensor.untyped_storage(), sample)

    def same_bytes(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` still holds these bytes (written in place or not)."""
        return tensor.data_ptr() == self.data_ptr

    def unchanged(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` still holds these bytes, unwritten since."""
        if _version(tensor) != self.version or tensor.data_ptr() != self.data_ptr:
            return False
        return self.sample is None or self.sample.unchanged(tensor)


def _version(tensor: torch.Tensor) -> int | None:
    """The tensor's version counter; ``None`` for an inference tensor (a model built under
    ``torch.inference_mode()``), which has none, even once given other bytes: it can be
    written in place only under inference mode, and that goes untracked."""
    try:
        return tensor._version
    except RuntimeError:
        return None


# a tensor's bytes are sampled in two windows of this many bytes, a third and two thirds of
# the way in (a tensor of at most this many: all of it, twice)
_SAMPLE_BYTES = 32


def _sample_windows(nbytes: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(start, length)`` of the two windows a tensor of ``nbytes`` is sampled in."""
    if nbytes <= _SAMPLE_BYTES:
        return (0, nbytes), (0, nbytes)
    return (nbytes // 3, _SAMPLE_BYTES), (nbytes * 2 // 3, _SAMPLE_BYTES)


def _sample_of(tensor: torch.Tensor) -> _Sample | _MappedSample | None:
    """How a write through ``.data`` to ``tensor`` is told; ``None`` for a tensor off the
    host, not dense, or holding no bytes."""
    record = _record(tensor)
    if record is not None and record.holds(tensor):
        address = record.address(tensor)
        if address is None:
            return None
        at, _ = _sample_windows(record.location.nbytes)[0]
        return _MappedSample(record, ((address + at) // PAGE_BYTES,))
    nbytes = tensor.numel() * tensor.element_size()
    if (
        tensor.device.type != "cpu"
        or nbytes == 0
        or tensor.untyped_storage().nbytes() == 0
        or not dense(tensor.shape, tensor.stride())
    ):
        return None
    address = tensor.data_ptr()
    first, second = (
        (ctypes.c_char * n).from_address(address + at) for at, n in _sample_windows(nbytes)
    )
    return _Sample(first, second, (first.raw, second.raw))


@dataclasses.dataclass(frozen=True, eq=False)
class _Sample:
    """A few bytes of a dense tensor in RAM, as they were and where they are (valid while
    the tensor holds the storage they are in, which :class:`HeldBytes` checks first). The
    windows are ``ctypes`` arrays over the tensor's memory: reading one is a copy of its
    bytes, about 0.1 us."""

    first: ctypes.Array[ctypes.c_char]
    second: ctypes.Array[ctypes.c_char]
    seen: tuple[bytes, bytes]

    def unchanged(self, tensor: torch.Tensor) -> bool:
        return self.first.raw == self.seen[0] and self.second.raw == self.seen[1]


@dataclasses.dataclass(frozen=True, eq=False)
class _MappedSample:
    """The page of a released tensor's first sample window in its file's mapping: while it
    was not copied on write the tensor is taken as unwritten (its page table entry read,
    about 2 us); once it was, the tensor's bytes are compared with the file's."""

    record: _Released
    pages: tuple[int, ...]

    def unchanged(self, tensor: torch.Tensor) -> bool:
        return not (pages_copied(self.pages) and self.record.written(tensor))


@dataclasses.dataclass(frozen=True, eq=False)
class _Released:
    location: TensorLocation
    held: HeldBytes  # what the tensor held once released
    # of a row chunk: the weight it is rows of, and that weight's record when released
    whole: weakref.ref[torch.Tensor] | None = None
    whole_record: _Released | None = None

    def _whole(self) -> tuple[torch.Tensor, _Released] | None:
        """The weight a row chunk is of, and its record (``None`` for a whole weight, or
        once that weight died)."""
        whole = self.whole() if self.whole is not None else None
        if whole is None or self.whole_record is None:
            return None
        return whole, self.whole_record

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (the record's), and the weight it is rows of, still hold the
        bytes they were released with."""
        whole = self._whole()
        return self.held.same_bytes(tensor) and (whole is None or whole[1].holds(whole[0]))

    def unchanged(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` (the record's), and the weight it is rows of, hold the bytes
        they were released with, unwritten since: no write in place moved their version
        counters, and none through ``.data`` changed the bytes of the file's mapping."""
        whole = self._whole()
        if not self.held.unchanged(tensor):
            return False
        if whole is not None and not whole[1].held.unchanged(whole[0]):
            return False
        return not self.written(tensor)

    def address(self, tensor: torch.Tensor) -> int | None:
        """Where this location's bytes are in the file's copy-on-write mapping (the storage
        of ``tensor``, or of the weight it is rows of); ``None`` where the tensor holds no
        bytes (the file could not be mapped)."""
        whole = self._whole()
        base, base_location = (
            (tensor, self.location) if whole is None else (whole[0], whole[1].location)
        )
        storage = base.untyped_storage()
        if storage.nbytes() != base_location.nbytes:
            return None
        return storage.data_ptr() + self.location.offset - base_location.offset

    def written(self, tensor: torch.Tensor) -> bool:
        """Whether this location's bytes in the file's mapping were written, through
        ``.data`` or not: pages copied on write whose bytes differ from the file's.
        ``False`` where the tensor holds no bytes or the page map cannot be read."""
        address = self.address(tensor)
        if address is None:
            return False
        ranges = copied_ranges(address, self.location.nbytes)
        return ranges is not None and _differs_from_file(self.location, address, ranges)


_COMPARE_BYTES = 2**20


def _differs_from_file(
    location: TensorLocation, address: int, ranges: list[tuple[int, int]]
) -> bool:
    """Whether the bytes at the address ranges ``ranges`` (within ``location``'s bytes,
    mapped at ``address``) differ from the file's (a page copied on write may hold what the
    file does: a neighbour's write, a value written over itself); ``True`` where the file
    cannot be read to tell."""
    try:
        with open(location.path, "rb") as file:
            for start, stop in ranges:
                for at in range(start, stop, _COMPARE_BYTES):
                    n = min(_COMPARE_BYTES, stop - at)
                    if ctypes.string_at(at, n) != os.pread(
                        file.fileno(), n, location.offset + at - address
                    ):
                        return True
    except OSError:
        return True
    return False


# tensor -> where its bytes are, for as long as the tensor lives
_released: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _record(tensor: torch.Tensor) -> _Released | None:
    return cast("_Released | None", _released.get(tensor))  # type: ignore[no-untyped-call]


def released_location(tensor: torch.Tensor) -> TensorLocation | None:
    """Where the bytes of a released tensor are; ``None`` for a tensor that holds its own
    (never released, or given other bytes since)."""
    record = _record(tensor)
    return None if record is None or not record.holds(tensor) else record.location


def _live() -> list[tuple[torch.Tensor, _Released]]:
    """Every live released tensor with its record (a snapshot: the caller may change them)."""
    return list(_released.items())  # type: ignore[no-untyped-call]


def mapped_directories() -> set[Path]:
    """The directories whose files hold the bytes of a live released tensor (one that still
    holds them): an offload store not among them holds nothing this process reads."""
    return {record.location.path.parent for tensor, record in _live() if record.holds(tensor)}


def check_released(tensor: torch.Tensor, location: TensorLocation) -> None:
    """Raise unless ``tensor`` is the released tensor whose bytes are at ``location``, where a
    plan reads its weight from, unchanged since: :class:`ReplacedWeightError` for one holding
    other bytes (given them since, or released elsewhere), which a plan made now reads from
    where they are, and for one written in place since its bytes were stored there (or the
    weight a row chunk is of): the file does not hold its new bytes, so the weight is given
    RAM of its own holding them (its bytes as the model sees them: the pages written, the
    file's elsewhere), and is then one given other bytes."""
    record = _record(tensor)
    if record is not None and record.location == location and record.holds(tensor):
        if record.unchanged(tensor):
            return
        own_written_bytes()
        raise ReplacedWeightError(
            f"{location.key}: the model's tensor was written in place after its bytes were "
            f"moved to {location.path} (an in-place op, ``load_state_dict``, a write through "
            "``.data`` such as an adapter merged into it): it now holds its bytes in RAM, "
            "and the graphs that read it from disk are planned again with them"
        )
    raise ReplacedWeightError(
        f"{location.key}: the model's tensor holds other bytes than those its plan reads from "
        f"{location.path}: it was given them after the plan was made (``.data = ...``, "
        "``module.to(dtype)``, an adapter merged into it)"
    )


def own_written_bytes(tensors: Iterable[torch.Tensor] | None = None) -> None:
    """Give each released tensor of ``tensors`` (every live one by default) written in place
    since it was released (or whose weight, for a row chunk, was) RAM of its own holding its
    bytes as the model sees them (the pages written, the file's elsewhere): it is then one
    given other bytes, planned where it is. A write is often to many weights at once (a
    state dict loaded, adapters merged): found at a disk read, all are taken at once, so
    that a graph is planned again once."""
    if tensors is None:
        pairs = _live()
    else:
        pairs = [(t, r) for t in tensors if (r := _record(t)) is not None]
    for tensor, record in pairs:
        if record.holds(tensor) and not record.unchanged(tensor):
            whole = record._whole()
            written = tensor if whole is None else whole[0]
            written.data = written.data.clone()


def _remember(
    tensor: torch.Tensor, location: TensorLocation, whole: torch.Tensor | None = None
) -> None:
    """Record that ``tensor``'s bytes are at ``location`` (rows of ``whole``'s), for as long
    as it lives."""
    if whole is None:
        _released[tensor] = _Released(location, HeldBytes.of(tensor))
    else:
        whole_record = _record(whole)
        assert whole_record is not None
        _released[tensor] = _Released(
            location, HeldBytes.of(tensor), weakref.ref(whole), whole_record
        )


def release(tensor: torch.Tensor, location: TensorLocation) -> None:
    """Give the tensor's RAM back: the same tensor object now holds its bytes in the file."""
    tensor.data = _placeholder(location)
    _remember(tensor, location)


def own_memory(tensor: torch.Tensor) -> None:
    """Give a released tensor RAM of its own, uninitialised, for bytes about to be copied
    into it (``CompiledModule.load_state_dict``): it is then one given other bytes, planned
    again with them, without the copy-on-write of the file's pages and the copy of them
    that :func:`own_written_bytes` makes of a tensor written where it is."""
    if released_location(tensor) is not None:
        tensor.data = torch.empty_like(tensor)


def released_rows(weight: torch.Tensor, start: int, stop: int) -> torch.Tensor | None:
    """Rows ``start:stop`` of ``weight`` as a released tensor of their own (no storage: only
    the compiled graphs use it, and the runtime reads its bytes), or ``None`` while
    ``weight`` holds its bytes in RAM."""
    location = released_location(weight)
    if location is None:
        return None
    rows = location.rows(start, stop)
    _remember(rows_tensor := _empty(rows), rows, whole=weight)
    return rows_tensor


def _placeholder(location: TensorLocation) -> torch.Tensor:
    """A CPU tensor of the location's shape and dtype over its bytes in the file (see the
    module); one with no storage where the file cannot be mapped."""
    flat = _mapped(location)
    if flat is None:
        return _empty(location)
    return location.tensor(flat.view(location.dtype))


def _empty(location: TensorLocation) -> torch.Tensor:
    """A CPU tensor of the location's shape and dtype that holds no bytes.

    ``torch.empty`` reserves address space only; the pages are never touched before the
    storage is resized to nothing, so the placeholder never costs RAM.
    """
    if location.strides is None:
        tensor = torch.empty(location.shape, dtype=location.dtype)
    else:
        tensor = torch.empty_strided(location.shape, location.strides, dtype=location.dtype)
    tensor.untyped_storage().resize_(0)
    return tensor


# one mapping per file (by identity: a file replaced under the same name is mapped anew), as
# long as a tensor over it lives; each tensor has a storage of its own over its bytes
_mappings: weakref.WeakValueDictionary[tuple[int, int, int, int], mmap.mmap] = (
    weakref.WeakValueDictionary()
)


def _mapped(location: TensorLocation) -> torch.Tensor | None:
    """The location's bytes as a 1-D uint8 tensor over a private, copy-on-write mapping of
    its file; ``None`` where that cannot be made."""
    private = getattr(mmap, "MAP_PRIVATE", None)
    if private is None or location.nbytes == 0:
        return None
    try:
        with open(location.path, "rb") as file:
            stat = os.fstat(file.fileno())
            if location.offset + location.nbytes > stat.st_size:
                return None  # a truncated file: the reads will say so
            key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            region = _mappings.get(key)
            if region is None:
                region = mmap.mmap(
                    file.fileno(), 0, flags=private, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
                _mappings[key] = region
    except (OSError, ValueError) as exc:
        log.debug("cannot map %s (%s): %s holds no bytes", location.path, exc, location.key)
        return None
    # a storage of its own (over the shared mapping, which it keeps alive): released tensors
    # are never taken for views of one another
    return torch.frombuffer(
        region, dtype=torch.uint8, count=location.nbytes, offset=location.offset
    )


def bind_checkpoint(model: torch.nn.Module, path: str | os.PathLike[str]) -> int:
    """Point every meta parameter and buffer of ``model`` at its bytes in the safetensors
    checkpoint ``path`` (a file, or one sharded over several: its index or its directory,
    see :func:`~..io.safetensors.checkpoint_files`); returns how many were bound. Nothing is
    read but the files' headers.

    A checkpoint holds a tied weight once, under one of its names (transformers' keep the
    input embedding, not the output head): a model with a ``tie_weights()`` method
    (transformers') has it called first, as ``from_pretrained`` does, since a model built
    under ``accelerate.init_empty_weights`` is not tied yet.

    Raises :class:`CheckpointError` when a meta tensor is missing from the file or differs
    from it in shape or dtype.
    """
    locations: dict[str, TensorLocation] = {}
    for file in checkpoint_files(path):
        for key, location in _guarded(safetensors_locations(file), file).items():
            if key in locations:
                raise CheckpointError(
                    f"{path}: {key!r} is in two of its files, {locations[key].path} and {file}"
                )
            locations[key] = location
    tie_weights = getattr(model, "tie_weights", None)
    if callable(tie_weights):
        tie_weights()
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
            "its weights must be in the checkpoint under the model's own names (buffers "
            "computed at construction can be kept real with "
            "accelerate.init_empty_weights(include_buffers=False)). A checkpoint whose names "
            "are not the model's (transformers renames some weights and splits fused experts "
            "when saving, and undoes it when loading) cannot be read in place: write one of "
            "the model's state_dict (safetensors.torch.save_model)"
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
