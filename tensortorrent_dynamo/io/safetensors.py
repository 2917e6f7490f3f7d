"""Safetensors files: where each tensor of one is, from its header alone, and writing one.

:func:`safetensors_locations` indexes a safetensors checkpoint from its header alone,
:func:`checkpoint_files` finds the files of a checkpoint sharded over several (its index,
as ``save_pretrained`` writes a large model), and :func:`write_safetensors` writes one
atomically (no dependency on the safetensors package): to a temporary name, flushed and
renamed, so a crash leaves the previous file readable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..errors import CheckpointError, OffloadError
from . import page_cache
from .locations import TensorLocation, block_checksums, dense
from .page_cache import _round_up

__all__ = ["checkpoint_files", "safetensors_locations", "write_safetensors"]

# The safetensors package refuses headers above this size; so do we.
_MAX_HEADER_BYTES = 100_000_000
# The data of the files written here starts at a multiple of this many bytes (the format
# asks for 8), as does every tensor of a size that is a multiple of it; see _write_file.
_DATA_ALIGNMENT = 64

_TEMP_PREFIX = ".tmp-"

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "C64": torch.complex64,  # rotary tables kept as complex numbers (Qwen-Image's)
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def _dtype_name(key: str, dtype: torch.dtype) -> str:
    """The safetensors name of ``dtype``; raises :class:`OffloadError` for one we cannot store."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise OffloadError(
            f"{key}: tensors of dtype {dtype} cannot be stored on disk; the supported dtypes are "
            + ", ".join(str(d) for d in _DTYPES.values())
        )
    return name


def _tensor_bytes(key: str, tensor: torch.Tensor, as_in_memory: bool = False) -> memoryview:
    """The tensor's bytes in row-major order; with ``as_in_memory``, those of a dense tensor
    of another memory format as they are in memory (see :func:`_strides`).

    A view of its own memory when it is a contiguous CPU tensor (or, with ``as_in_memory``,
    a dense one: no copy); otherwise a contiguous CPU copy. Reinterpreting as uint8 first
    lets numpy expose dtypes it lacks (bfloat16, float8).
    """
    if tensor.device.type == "meta":
        raise OffloadError(f"{key} is on the meta device: it has no bytes to store")
    tensor = tensor.detach().to("cpu")
    if as_in_memory and _strides(tensor) is not None:
        flat = tensor.as_strided((tensor.numel(),), (1,), tensor.storage_offset())
    else:
        flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def _strides(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """The strides of a dense tensor that is not row-major (``channels_last``), whose bytes
    are stored as they are in memory so that the tensor read back has its strides (the
    graphs were traced with them, and Dynamo's guards hold to them); ``None`` for the
    rest, stored row-major."""
    strides = tuple(tensor.stride())
    if strides == _row_major(tensor.shape) or not dense(tensor.shape, strides):
        return None
    return strides


def _row_major(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a row-major tensor of ``shape``, as torch gives them (those of a
    dimension of size 1 too, which Dynamo's guards compare: a ``channels_last`` 1x1
    convolution weight is contiguous for ``is_contiguous()``, not for them)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _stored_shape(tensor: torch.Tensor, as_in_memory: bool) -> list[int]:
    """The shape the file's header gives ``tensor``: its own, or, for one stored as it is
    in memory, its dimensions from the outermost in memory (a row-major tensor of the same
    bytes: ``tensor.permute(order)``, which other readers load as such)."""
    if not as_in_memory or _strides(tensor) is None:
        return list(tensor.shape)
    strides = tensor.stride()
    order = sorted(range(tensor.dim()), key=lambda d: -strides[d])
    return [tensor.shape[d] for d in order]


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_create(path: Path) -> Iterator[BinaryIO]:
    """A file written under a temporary name and renamed to ``path`` once complete.

    The data is fsynced before the rename and the directory after it, so ``path`` names
    either the previous file or the complete new one, whenever the machine stops. The
    written pages are dropped from the page cache: the data is not read back soon, and
    writing gigabytes of weights must not evict everything else.
    """
    temp = path.with_name(f"{_TEMP_PREFIX}{secrets.token_hex(6)}-{path.name}")
    try:
        with open(temp, "xb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
            page_cache.drop(file.fileno(), 0, 0)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


_INDEX_SUFFIX = ".safetensors.index.json"


def checkpoint_files(path: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of the checkpoint at ``path``: ``path`` itself; or the shards
    named by an index (``path`` the index, ``*.safetensors.index.json``, whose
    ``weight_map`` maps each tensor to its shard, as transformers' and diffusers'
    ``save_pretrained`` write a large model); or, for a directory, those of the one index
    in it, else its one safetensors file. Raises :class:`CheckpointError` saying what was
    found instead. The shards' own headers say where each tensor is; the index says only
    which files to read."""
    where = Path(os.path.abspath(path))
    if where.is_dir():
        indexes = sorted(where.glob(f"*{_INDEX_SUFFIX}"))
        files = sorted(where.glob("*.safetensors"))
        if len(indexes) == 1:
            where = indexes[0]
        elif len(indexes) > 1 or len(files) != 1:
            found = ", ".join(f.name for f in [*indexes, *files]) or "nothing of the kind"
            raise CheckpointError(
                f"{where}: a checkpoint directory must hold one *{_INDEX_SUFFIX} (a sharded "
                f"checkpoint) or one *.safetensors file; found {found}. Pass the file to use"
            )
        else:
            return files
    if not where.name.endswith(_INDEX_SUFFIX):
        return [where]
    try:
        weight_map = json.loads(where.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(
            f"{where}: not a safetensors index (a JSON object whose weight_map maps each "
            f"tensor's name to its shard's file name): {type(exc).__name__}: {exc}"
        ) from None
    if not shards or not all(isinstance(s, str) and Path(s).name == s for s in shards):
        raise CheckpointError(f"{where}: its weight_map names no shard, or names one elsewhere")
    missing = [s for s in shards if not (where.parent / s).is_file()]
    if missing:
        raise CheckpointError(
            f"{where}: {len(missing)} of its {len(shards)} shards are not beside it "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"
        )
    return [where.parent / s for s in shards]


def safetensors_locations(path: str | os.PathLike[str]) -> dict[str, TensorLocation]:
    """Where each tensor of the safetensors file ``path`` is, read from its header alone.

    The format: an 8-byte little-endian header length, a JSON header mapping each name to
    its dtype, shape and ``data_offsets`` (relative to the end of the header), then the
    data. Raises :class:`CheckpointError` naming the file and the problem when the file is
    missing, truncated or malformed, or holds a dtype we cannot read.
    """
    file = Path(os.path.abspath(path))

    def bad(problem: str) -> CheckpointError:
        return CheckpointError(f"{file}: {problem}")

    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(8)
            if len(prefix) < 8:
                raise bad(f"{size} bytes is too short for a safetensors file")
            header_bytes = int.from_bytes(prefix, "little")
            if header_bytes > min(size - 8, _MAX_HEADER_BYTES):
                raise bad(
                    f"the header claims {header_bytes} bytes but the file has {size - 8} after "
                    "the length prefix: truncated, or not a safetensors file"
                )
            raw = f.read(header_bytes)
    except FileNotFoundError:
        raise bad("no such file") from None
    except IsADirectoryError:
        raise bad("is a directory, not a safetensors file") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad(f"the header is not JSON ({exc}): not a safetensors file, or damaged") from None
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, not an object")
    data_start = 8 + header_bytes
    locations: dict[str, TensorLocation] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise bad(f"tensor {key!r}: expected dtype, shape and two data_offsets") from None
        dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise bad(
                f"tensor {key!r} has dtype {dtype_name!r}, which TensorTorrent cannot read; "
                f"supported: {', '.join(_DTYPES)}"
            )
        ints = [*shape, begin, end] if isinstance(shape, list) else None
        if ints is None or not all(type(n) is int and n >= 0 for n in ints) or end < begin:
            raise bad(f"tensor {key!r}: malformed shape {shape!r} or data_offsets {entry!r}")
        nbytes = math.prod(shape) * dtype.itemsize
        if end - begin != nbytes:
            raise bad(
                f"tensor {key!r} of shape {shape} and dtype {dtype_name} needs {nbytes} bytes "
                f"but its data_offsets span {end - begin}"
            )
        if data_start + end > size:
            raise bad(
                f"tensor {key!r} ends at byte {data_start + end} but the file has {size} bytes: "
                "truncated"
            )
        locations[key] = TensorLocation(key, file, data_start + begin, nbytes, dtype, tuple(shape))
    return locations


@dataclasses.dataclass(frozen=True)
class _Written:
    """What writing one safetensors file produced."""

    locations: dict[str, TensorLocation]
    data_start: int
    header_sums: tuple[int, ...]
    size: int


def _tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _write_file(
    path: Path, tensors: Sequence[tuple[str, torch.Tensor]], as_in_memory: bool = False
) -> _Written:
    """Write ``tensors`` as the safetensors file ``path``, atomically; with
    ``as_in_memory``, a dense tensor of another memory format as it is in memory (the
    offload store's, whose manifest keeps its strides: :func:`_strides`), else row-major.

    The data starts at a multiple of 64 bytes, and the tensors whose size is a multiple of 64
    bytes come first (the format allows no gap between tensors), so each of them starts at a
    multiple of 64, as torch's own CPU allocations do: a weight read from the file into a
    page-aligned buffer is then viewed at the alignment the model's tensor had, and the
    matrix kernels take the same path on it (a 1-row product on a weight 8 bytes off a 16-byte
    boundary sums in another order, and differs from eager in its last bits). The rest follow
    by decreasing element size (stable, so model order is kept within each group): every
    tensor starts at a multiple of its element size, and a reader can view its bytes in place.
    """
    ordered = sorted(
        tensors,
        key=lambda item: (_tensor_nbytes(item[1]) % _DATA_ALIGNMENT != 0, -item[1].element_size()),
    )
    header: dict[str, Any] = {}
    offset = 0
    for key, tensor in ordered:
        nbytes = _tensor_nbytes(tensor)
        header[key] = {
            "dtype": _dtype_name(key, tensor.dtype),
            "shape": _stored_shape(tensor, as_in_memory),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    # Pad with spaces (valid JSON whitespace) so that the data starts aligned.
    text += b" " * (_round_up(8 + len(text), _DATA_ALIGNMENT) - 8 - len(text))
    head = len(text).to_bytes(8, "little") + text
    with _atomic_create(path) as file:
        file.write(head)
        for key, tensor in ordered:
            file.write(_tensor_bytes(key, tensor, as_in_memory))
    start = len(head)
    return _Written(
        locations={
            key: TensorLocation(
                key,
                path,
                start + header[key]["data_offsets"][0],
                tensor.numel() * tensor.element_size(),
                tensor.dtype,
                tuple(tensor.shape),
                strides=_strides(tensor) if as_in_memory else None,
            )
            for key, tensor in tensors
        },
        data_start=start,
        header_sums=block_checksums(head),
        size=start + offset,
    )


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor]
) -> dict[str, TensorLocation]:
    """Write ``tensors`` as a safetensors file at ``path``; returns where each one is.

    The file is complete or absent: it is written under a temporary name in the same
    directory, fsynced and renamed. Non-contiguous tensors are written in row-major order.
    """
    file = Path(os.path.abspath(path))
    return _write_file(file, list(tensors.items())).locations
