"""The offload store: a directory of safetensors shards described by ``manifest.json``.

:class:`OffloadStore` records checksums of every tensor's bytes, block by block. A tensor
is written once: a later write of the same bytes reuses the stored copy after checking it.
Every file is written to a temporary name, flushed and renamed, so a crash leaves the
previous state readable, and free space is checked before anything is written.

A process that released a model's weights to a store (their only copy is then there) holds
a shared lease on it for as long as it runs (:meth:`OffloadStore.write` with ``hold``);
:func:`remove_unused` deletes only the stores no process holds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import math
import os
import re
import secrets
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from ..errors import OffloadCorruptError, OffloadError
from ..units import format_bytes, format_rate
from .locations import (
    CHECKSUM,
    VERIFY_BLOCK_BYTES,
    FileGuard,
    TensorLocation,
    block_checksums,
    checksum,
    dense,
)
from .page_cache import _round_up
from .pool import HostBufferPool
from .reader import DiskReader, ReadResult
from .safetensors import (
    _DTYPE_NAMES,
    _DTYPES,
    _TEMP_PREFIX,
    _atomic_create,
    _dtype_name,
    _strides,
    _tensor_bytes,
    _write_file,
)

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "MANIFEST_FORMAT",
    "OffloadStore",
    "in_use",
    "let_go",
    "remove_unused",
    "tensor_sums",
]

log = logging.getLogger(__name__)

MANIFEST_FORMAT = "tensortorrent-offload/2"
DEFAULT_SHARD_BYTES = 256 * 2**20
# A store is verified in pieces of this size, this many in flight.
_VERIFY_PIECE_BYTES = 16 * 2**20
_VERIFY_LOOKAHEAD = 4

_MANIFEST = "manifest.json"
# what a write to a full, read-only or forbidden directory fails with
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})
_LOCK = ".lock"
# held shared by every process whose weights live in the store (see remove_unused)
_LEASE = ".in-use"
# the lease file of each store this process holds, by directory, open for its lifetime
_leases: dict[Path, int] = {}
_SHARD_NAME = re.compile(r"shard-[0-9a-f]{16}\.safetensors")


def _names(keys: Sequence[str], limit: int = 8) -> str:
    """``'a', 'b' and 3 more``: a readable list of tensor names."""
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


@dataclasses.dataclass(frozen=True)
class _Shard:
    """One shard file as written: its size, where its data starts, its header's checksums."""

    size: int
    data_start: int
    header_sums: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "header_sums", tuple(self.header_sums))


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One stored tensor: its shard, where it is in it, and the checksums of its bytes, one
    per ``VERIFY_BLOCK_BYTES`` block."""

    shard: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    sums: tuple[int, ...]
    # its strides, for a tensor stored as it is in memory (``TensorLocation.strides``)
    strides: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sums", tuple(self.sums))
        if self.strides is not None:
            object.__setattr__(self, "strides", tuple(self.strides))


@dataclasses.dataclass
class _Manifest:
    """The parsed ``manifest.json``: shards by file name, stored tensors by key."""

    shards: dict[str, _Shard]
    tensors: dict[str, _Entry]

    def keys_in(self, shard: str) -> list[str]:
        """The keys stored in ``shard``, in file order."""
        keys = [k for k, e in self.tensors.items() if e.shard == shard]
        return sorted(keys, key=lambda k: self.tensors[k].offset)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "checksum": CHECKSUM,
                "block_bytes": VERIFY_BLOCK_BYTES,
                "shards": {n: dataclasses.asdict(s) for n, s in self.shards.items()},
                "tensors": {k: dataclasses.asdict(e) for k, e in self.tensors.items()},
            },
            indent=1,
        ).encode()


@dataclasses.dataclass(frozen=True)
class _Damage:
    """A shard that failed verification: what is wrong and the damaged keys."""

    shard: str
    problem: str
    keys: list[str]


class OffloadStore:
    """Safetensors shards in one directory, described by ``manifest.json`` with checksums.

    Each tensor is stored once: :meth:`write` reuses a stored tensor whose dtype, shape and
    checksum match and whose bytes still pass verification, and packs everything else into
    new shards of about ``shard_bytes``. Shards are written completely before the manifest
    names them, and the manifest is replaced atomically, so a crash at any point leaves the
    previous state. An exclusive ``flock`` on ``<directory>/.lock`` serialises writers
    across processes; readers of the manifest take it shared.
    """

    def __init__(
        self, directory: str | os.PathLike[str], shard_bytes: int = DEFAULT_SHARD_BYTES
    ) -> None:
        if shard_bytes <= 0:
            raise ValueError(f"shard_bytes must be positive, got {shard_bytes}")
        self.directory = Path(os.path.abspath(directory))
        self.shard_bytes = shard_bytes

    def write(
        self,
        tensors: Mapping[str, torch.Tensor],
        sums: Mapping[str, tuple[int, ...]] | None = None,
        hold: bool = False,
    ) -> dict[str, TensorLocation]:
        """Make sure every tensor of ``tensors`` is stored; returns where each one is.

        ``sums`` are the tensors' :func:`tensor_sums` where already computed. With ``hold``
        this process takes a shared lease on the store, before another can change it, and
        keeps it while it runs: :func:`remove_unused` in any process leaves the store (hold
        it when the caller is about to release the tensors' own bytes to it).

        Other tensors already in the store stay. Raises :class:`OffloadError` for a tensor
        that cannot be stored (a meta tensor, an unsupported dtype).
        """
        with self._locked(exclusive=True):
            manifest = self._load()
            for key, tensor in tensors.items():
                _dtype_name(key, tensor.dtype)
            if sums is None:
                sums = tensor_sums(tensors)
            stored = {
                key
                for key, tensor in tensors.items()
                if (entry := manifest.tensors.get(key)) is not None
                and entry.dtype == _DTYPE_NAMES[tensor.dtype]
                and entry.shape == tuple(tensor.shape)
                and entry.strides == _strides(tensor)
                and entry.sums == sums[key]
            }
            damage = self._scan(manifest, stored)
            damaged = {key for d in damage for key in d.keys}
            if damaged:
                log.warning(
                    "offload: %s; rewriting them from the model's weights",
                    "; ".join(f"{self.directory / d.shard} {d.problem}" for d in damage),
                )
            todo = {k: t for k, t in tensors.items() if k not in stored or k in damaged}
            if not todo:
                log.info(
                    "offload: all %d tensors (%s) already stored in %s",
                    len(tensors),
                    format_bytes(sum(manifest.tensors[k].nbytes for k in tensors)),
                    self.directory,
                )
            self._commit(manifest, todo, sums)
            if hold:
                self._hold()
            return self._locations(manifest, tensors)

    def locations(
        self, keys: Iterable[str] | None = None, verify: bool = True
    ) -> dict[str, TensorLocation]:
        """Where the stored tensors ``keys`` (default: all) are, from the manifest.

        With ``verify``, every shard holding one of them is read (around the page cache, so
        checking does not warm it) and checked against the manifest; a damaged or missing
        one raises :class:`OffloadCorruptError`. Raises :class:`OffloadError` for a key that
        is not stored.
        """
        with self._locked(exclusive=False):
            manifest = self._load()
            wanted = list(manifest.tensors) if keys is None else list(keys)
            missing = [key for key in wanted if key not in manifest.tensors]
            if missing:
                raise OffloadError(f"{self.directory} does not store {_names(missing)}")
            if verify:
                damage = self._scan(manifest, set(wanted))
                if damage:
                    raise self._corrupt_error(damage)
            return self._locations(manifest, wanted)

    def verify(self) -> list[str]:
        """The keys whose bytes fail their checksum or whose shard is missing or truncated."""
        with self._locked(exclusive=False):
            manifest = self._load()
            return sorted(
                key for d in self._scan(manifest, set(manifest.tensors)) for key in d.keys
            )

    def repair(self, sources: Mapping[str, torch.Tensor]) -> list[str]:
        """Rewrite every damaged tensor from ``sources``; returns the keys rewritten.

        Raises :class:`OffloadCorruptError`, before writing anything, when a damaged tensor
        has no source.
        """
        with self._locked(exclusive=True):
            manifest = self._load()
            damage = self._scan(manifest, set(manifest.tensors))
            unsourced = [
                _Damage(d.shard, d.problem, [k for k in d.keys if k not in sources]) for d in damage
            ]
            unsourced = [d for d in unsourced if d.keys]
            if unsourced:
                raise self._corrupt_error(unsourced, "and no source was given for them")
            todo = {key: sources[key] for d in damage for key in d.keys}
            sums = tensor_sums(todo)
            self._commit(manifest, todo, sums)
            return sorted(todo)

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold ``<directory>/.lock``: exclusively to change the store, shared to read it.

        A lock taken on a file that :func:`remove_unused` deleted meanwhile (with the whole
        store) is taken again on a new one."""
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.directory / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                if exc.errno not in _WRITE_ERRNOS:
                    raise
                raise self._write_error(0, None, exc.strerror or str(exc)) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                if _same_file(fd, self.directory / _LOCK):
                    yield
                    return
            finally:
                os.close(fd)  # releases the lock

    def _hold(self) -> None:
        """Take this process's shared lease on the store, kept while it runs (under the
        store's lock, so that no ``remove_unused`` can come between)."""
        if self.directory in _leases:
            if _same_file(_leases[self.directory], self.directory / _LEASE):
                return
            os.close(_leases.pop(self.directory))
        fd = os.open(self.directory / _LEASE, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _leases[self.directory] = fd

    def _load(self) -> _Manifest:
        """The manifest; an empty one when none was written yet."""
        path = self.directory / _MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return _Manifest({}, {})
        try:
            data = json.loads(raw)
            if data.get("format") != MANIFEST_FORMAT or data.get("checksum") != CHECKSUM:
                raise OffloadError(
                    f"{path} is in format {data.get('format')!r} with checksum "
                    f"{data.get('checksum')!r}; this version of TensorTorrent reads "
                    f"{MANIFEST_FORMAT!r} with {CHECKSUM!r}: delete {self.directory} or choose "
                    "another offload_dir"
                )
            shards = {str(n): _Shard(**s) for n, s in data["shards"].items()}
            tensors = {
                str(k): _Entry(**{**e, "shape": tuple(e["shape"])})
                for k, e in data["tensors"].items()
            }
            if any(_SHARD_NAME.fullmatch(name) is None for name in shards):
                raise ValueError("a shard has a name this store does not write")
            if any(e.shard not in shards or e.dtype not in _DTYPES for e in tensors.values()):
                raise ValueError("a tensor names an unknown shard or dtype")
            items: list[_Shard | _Entry] = [*shards.values(), *tensors.values()]
            for item in items:
                for field in dataclasses.fields(item):  # every field not a str holds counts
                    value = getattr(item, field.name)
                    if value is None and field.name == "strides":
                        continue
                    counts = value if isinstance(value, tuple) else (value,)
                    if field.type != "str" and not all(type(n) is int and n >= 0 for n in counts):
                        raise ValueError(f"{field.name} is {value!r}, not a count")
            if any(
                e.strides is not None and not dense(e.shape, e.strides) for e in tensors.values()
            ):
                raise ValueError("a tensor's strides do not lay out its bytes densely")
            sizes = {k: math.prod(e.shape) * _DTYPES[e.dtype].itemsize for k, e in tensors.items()}
            if any(e.nbytes != sizes[k] for k, e in tensors.items()):
                raise ValueError("a tensor's size does not match its shape and dtype")
            if data.get("block_bytes") != VERIFY_BLOCK_BYTES:
                raise ValueError(f"checksum blocks of {data.get('block_bytes')!r} bytes")
            blocks = [(e.sums, e.nbytes) for e in tensors.values()]
            blocks += [(s.header_sums, s.data_start) for s in shards.values()]
            if any(len(sums) != -(-n // VERIFY_BLOCK_BYTES) for sums, n in blocks):
                raise ValueError("a checksum list does not cover its bytes")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise OffloadCorruptError(
                f"{path} cannot be read ({exc}); delete {self.directory} and compile again "
                "from the model's weights"
            ) from None
        return _Manifest(shards, tensors)

    def _locations(self, manifest: _Manifest, keys: Iterable[str]) -> dict[str, TensorLocation]:
        """Where the stored tensors ``keys`` are, each guarded by its shard's checksums."""
        keys = list(keys)
        guards = {
            name: FileGuard(
                self.directory / name,
                {
                    k: (
                        manifest.tensors[k].offset,
                        manifest.tensors[k].nbytes,
                        manifest.tensors[k].sums,
                    )
                    for k in manifest.keys_in(name)
                },
                source="offload shard",
                advice=(
                    "The store holds the only copy of these weights (the model's were released "
                    f"to it): delete {self.directory}, reload the model and compile again"
                ),
            )
            for name in sorted({manifest.tensors[k].shard for k in keys})
        }
        locations = {}
        for key in keys:
            entry = manifest.tensors[key]
            locations[key] = TensorLocation(
                key,
                self.directory / entry.shard,
                entry.offset,
                entry.nbytes,
                _DTYPES[entry.dtype],
                entry.shape,
                guards[entry.shard],
                entry.strides,
            )
        return locations

    def _scan(self, manifest: _Manifest, keys: set[str]) -> list[_Damage]:
        """Check every shard holding one of ``keys``; the damage found to ``keys``.

        A shard that is missing, has another size than written or a damaged header takes
        down all its keys; otherwise each key whose bytes fail their checksum is damaged.
        """
        shards = sorted({manifest.tensors[key].shard for key in keys})
        if not shards:
            return []
        damage: list[_Damage] = []
        start = time.perf_counter()
        scanned = 0
        with DiskReader(HostBufferPool()) as reader:
            for name in shards:
                found = self._check_shard(reader, manifest, name)
                scanned += manifest.shards[name].size
                bad = [key for key in found.keys if key in keys] if found else []
                if found and bad:
                    damage.append(_Damage(name, found.problem, bad))
        elapsed = time.perf_counter() - start
        log.debug(
            "offload: verified %d shards (%s) in %.2f s",
            len(shards),
            format_bytes(scanned),
            elapsed,
        )
        return damage

    def _check_shard(self, reader: DiskReader, manifest: _Manifest, name: str) -> _Damage | None:
        """What is wrong with shard ``name`` and which keys it spoils; ``None`` if it is sound."""
        shard = manifest.shards[name]
        keys = manifest.keys_in(name)
        path = self.directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return _Damage(name, "is missing", keys)
        if size != shard.size:
            problem = f"is {size} bytes, not {shard.size} as written (truncated or overwritten)"
            return _Damage(name, problem, keys)
        header = "<header>"
        ranges = [(header, 0, shard.data_start)]
        ranges += [(k, manifest.tensors[k].offset, manifest.tensors[k].nbytes) for k in keys]
        try:
            sums = _range_checksums(reader, path, size, ranges)
        except (OSError, OffloadError) as exc:
            return _Damage(name, f"cannot be read ({exc})", keys)
        if sums[header] != shard.header_sums:
            return _Damage(name, "has a damaged header (checksum mismatch)", keys)
        bad = [k for k in keys if sums[k] != manifest.tensors[k].sums]
        return _Damage(name, f"fails its checksum for {len(bad)} tensor(s)", bad) if bad else None

    def _commit(
        self,
        manifest: _Manifest,
        todo: Mapping[str, torch.Tensor],
        sums: Mapping[str, tuple[int, ...]],
    ) -> None:
        """Write ``todo`` to new shards, then the manifest naming them, then sweep.

        The free space is checked first. A write that fails (no space, no permission, a
        read-only file system) raises :class:`OffloadError` saying what to do, and the
        shards already written by this call are deleted: the store is as it was.
        """
        if todo:
            total = sum(t.numel() * t.element_size() for t in todo.values())
            # the shards, their headers and the manifest (each block's checksum in JSON)
            needed = total + 2**20 + 512 * len(todo) + 24 * sum(len(v) for v in sums.values())
            free = self._free_bytes()
            if needed > free:
                raise self._write_error(needed, free, "there is not enough free space")
            log.info(
                "offload: writing %d tensors, %s to %s",
                len(todo),
                format_bytes(total),
                self.directory,
            )
            start = time.perf_counter()
            new: list[Path] = []
            try:
                for group in self._pack(todo):
                    name = f"shard-{secrets.token_hex(8)}.safetensors"
                    new.append(self.directory / name)
                    written = _write_file(new[-1], [(k, todo[k]) for k in group], as_in_memory=True)
                    manifest.shards[name] = _Shard(
                        written.size, written.data_start, written.header_sums
                    )
                    for key, loc in written.locations.items():
                        manifest.tensors[key] = _Entry(
                            name,
                            loc.offset,
                            loc.nbytes,
                            _DTYPE_NAMES[loc.dtype],
                            loc.shape,
                            sums[key],
                            loc.strides,
                        )
                used = {e.shard for e in manifest.tensors.values()}
                manifest.shards = {n: s for n, s in manifest.shards.items() if n in used}
                with _atomic_create(self.directory / _MANIFEST) as file:
                    file.write(manifest.to_json())
            except OSError as exc:
                for path in new:
                    path.unlink(missing_ok=True)
                if exc.errno not in _WRITE_ERRNOS:
                    raise
                raise self._write_error(
                    needed, self._free_bytes(), exc.strerror or str(exc)
                ) from exc
            elapsed = time.perf_counter() - start
            log.info(
                "offload: wrote %d tensors, %s in %.2f s (%s)",
                len(todo),
                format_bytes(total),
                elapsed,
                format_rate(total / max(elapsed, 1e-9), "B/s"),
            )
        self._sweep(manifest)

    def _free_bytes(self) -> int:
        """Bytes an unprivileged writer may still write to the store's file system."""
        stat = os.statvfs(self.directory)
        return stat.f_bavail * stat.f_frsize

    def _write_error(self, needed: int, free: int | None, why: str) -> OffloadError:
        room = f", {format_bytes(free)} free" if free is not None else ""
        return OffloadError(
            f"cannot write weights to the offload directory {self.directory}: {why} (this needs "
            f"{format_bytes(needed)}{room}). Choose another offload_dir with room "
            "(options={'offload_dir': ...}) or raise the host budget (budgets={'cpu': ...}) so "
            "that fewer weights live on disk; the model's weights are untouched"
        )

    def _pack(self, todo: Mapping[str, torch.Tensor]) -> list[list[str]]:
        """Group keys, in order, into shards of about ``shard_bytes`` (a larger tensor alone)."""
        groups: list[list[str]] = []
        size = 0
        for key, tensor in todo.items():
            nbytes = tensor.numel() * tensor.element_size()
            if not groups or (size + nbytes > self.shard_bytes and size > 0):
                groups.append([])
                size = 0
            groups[-1].append(key)
            size += nbytes
        return groups

    def _sweep(self, manifest: _Manifest) -> None:
        """Delete temporary files and shards the manifest no longer names.

        Only called under the exclusive lock, when no other writer can be mid-write.
        """
        for entry in os.scandir(self.directory):
            stale = entry.name.startswith(_TEMP_PREFIX) or (
                _SHARD_NAME.fullmatch(entry.name) is not None and entry.name not in manifest.shards
            )
            if stale:
                Path(entry.path).unlink(missing_ok=True)

    def _corrupt_error(self, damage: list[_Damage], why: str = "") -> OffloadCorruptError:
        found = "; ".join(
            f"{self.directory / d.shard} {d.problem}, holding {_names(d.keys)}" for d in damage
        )
        return OffloadCorruptError(
            f"offloaded weights are damaged: {found}{' ' + why if why else ''}. The only copy "
            f"of these weights is corrupt; delete {self.directory} and compile again from the "
            "model's weights",
            [key for d in damage for key in d.keys],
        )


def tensor_sums(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The block checksums of each tensor's bytes, as a store records them."""
    return {
        key: block_checksums(_tensor_bytes(key, t, as_in_memory=True)) for key, t in tensors.items()
    }


def remove_unused(directories: Iterable[Path]) -> list[Path]:
    """Delete each store of ``directories`` that no process holds (no lease on it, no
    writer or reader in it); returns those deleted. A store some process released weights
    to stays, as does one being written or read."""
    removed = []
    for directory in directories:
        try:
            lock = os.open(directory / _LOCK, os.O_RDWR)
        except OSError:
            continue  # not a store, or one being made: its writer holds it
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lease = os.open(directory / _LEASE, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # the lock file last: a process waiting on it then finds it gone and
                # makes the store anew (OffloadStore._locked)
                for entry in os.scandir(directory):
                    if entry.name != _LOCK:
                        Path(entry.path).unlink(missing_ok=True)
                (directory / _LOCK).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    directory.rmdir()
                removed.append(directory)
            finally:
                os.close(lease)
        except BlockingIOError:
            continue  # held: in use
        finally:
            os.close(lock)
    return removed


def let_go(directory: Path) -> None:
    """Drop this process's lease on the store in ``directory`` (none of its tensors maps the
    store any more), so that :func:`remove_unused` may delete it once no other process
    holds it."""
    fd = _leases.pop(directory, None)
    if fd is not None:
        os.close(fd)


def in_use(directory: Path) -> bool:
    """Whether some process holds the store in ``directory`` (it released weights to it)."""
    try:
        fd = os.open(directory / _LEASE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``fd`` is still the file at ``path`` (not one deleted, or replaced)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (now.st_dev, now.st_ino)


def _range_checksums(
    reader: DiskReader, path: Path, size: int, ranges: list[tuple[str, int, int]]
) -> dict[str, tuple[int, ...]]:
    """The block checksums (as :func:`block_checksums`) of each named byte range
    ``(name, offset, nbytes)`` of ``path``, in one pass.

    The file is read front to back in pieces through ``reader``, a few pieces ahead of the
    checksumming, which overlaps the two; ranges must not overlap.
    """
    sums: dict[str, list[int]] = {name: [] for name, _, _ in ranges}
    partial: dict[str, int] = {}  # the checksum so far of a range's block cut by a piece end
    ordered = sorted(ranges, key=lambda r: r[1])
    pieces = [(p, min(p + _VERIFY_PIECE_BYTES, size)) for p in range(0, size, _VERIFY_PIECE_BYTES)]
    pending: deque[concurrent.futures.Future[ReadResult]] = deque()
    submitted = 0
    current = 0  # the first range not yet fully summed
    for low, high in pieces:
        while submitted < len(pieces) and len(pending) < _VERIFY_LOOKAHEAD:
            p, q = pieces[submitted]
            pending.append(
                reader.submit(TensorLocation(str(path), path, p, q - p, torch.uint8, (q - p,)))
            )
            submitted += 1
        result = pending.popleft().result()
        data = result.tensor.numpy().data
        while current < len(ordered):
            name, offset, nbytes = ordered[current]
            end = offset + nbytes
            pos = max(offset, low)
            while pos < min(end, high):
                block_end = min(offset + _round_up(pos + 1 - offset, VERIFY_BLOCK_BYTES), end)
                stop = min(block_end, high)
                value = checksum(data[pos - low : stop - low], partial.pop(name, 0))
                if stop == block_end:
                    sums[name].append(value)
                else:
                    partial[name] = value
                pos = stop
            if end > high:
                break
            current += 1
        reader.pool.give(result.buffer)
    return {name: tuple(values) for name, values in sums.items()}
