"""OffloadStore: written once, atomic under crashes, damage detected and repaired."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import tensortorrent_dynamo.io.safetensors as safetensors_io
import tensortorrent_dynamo.io.store as store_io
from tensortorrent_dynamo.errors import OffloadCorruptError, OffloadError
from tensortorrent_dynamo.io.locations import TensorLocation
from tensortorrent_dynamo.io.pool import HostBufferPool
from tensortorrent_dynamo.io.reader import DiskReader
from tensortorrent_dynamo.io.store import OffloadStore


def model_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "layers.0.weight": torch.randn(16, 16, generator=g),
        "layers.0.bias": torch.randn(16, generator=g),
        "layers.1.weight": torch.randn(32, 16, generator=g).t(),  # not contiguous
        "steps": torch.tensor(3, dtype=torch.int64),
        "mask": torch.rand(4, 4, generator=g) > 0.5,
    }


def shards(store: OffloadStore) -> list[Path]:
    return sorted(store.directory.glob("shard-*.safetensors"))


def read_all(locations: dict[str, TensorLocation]) -> dict[str, torch.Tensor]:
    pool = HostBufferPool()
    with DiskReader(pool) as reader:
        out = {}
        for key, loc in locations.items():
            result = reader.submit(loc).result()
            out[key] = result.tensor.clone()
            pool.give(result.buffer)
    return out


def assert_holds(store: OffloadStore, tensors: dict[str, torch.Tensor]) -> None:
    stored = read_all(store.locations(tensors))
    for key, tensor in tensors.items():
        assert torch.equal(stored[key], tensor), key


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_round_trip_in_shards_that_safetensors_reads(tmp_path: Path) -> None:
    weights = model_weights()
    store = OffloadStore(tmp_path / "store", shard_bytes=1500)
    written = store.write(weights)
    assert set(written) == set(weights)
    assert written == store.locations()
    assert_holds(store, weights)
    files = shards(store)
    assert len(files) > 1, "shard_bytes splits the tensors"
    loaded = {k: v for f in files for k, v in safetensors.torch.load_file(f).items()}
    # the transposed weight is stored as it is in memory: its transpose, row-major
    assert all(torch.equal(loaded[k], t) for k, t in weights.items() if k != "layers.1.weight")
    assert torch.equal(loaded["layers.1.weight"], weights["layers.1.weight"].t())
    manifest = json.loads((store.directory / "manifest.json").read_text())
    assert manifest["format"] == "tensortorrent-offload/2" and manifest["checksum"] == "crc32c"


def test_a_tensor_larger_than_a_shard_gets_its_own(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path, shard_bytes=100)
    locations = store.write({"a": torch.zeros(2), "big": torch.zeros(64), "b": torch.ones(2)})
    assert set(safetensors.torch.load_file(locations["big"].path)) == {"big"}


def test_writing_the_same_tensors_again_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = model_weights()
    store = OffloadStore(tmp_path)
    first = store.write(weights)
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    files_written: list[Path] = []
    real_write_file = store_io._write_file

    def counting(
        path: Path, tensors: list[tuple[str, torch.Tensor]], as_in_memory: bool = False
    ) -> safetensors_io._Written:
        files_written.append(path)
        return real_write_file(path, tensors, as_in_memory)

    monkeypatch.setattr(store_io, "_write_file", counting)
    again = OffloadStore(tmp_path).write({k: t.clone() for k, t in weights.items()})
    assert again == first and files_written == []
    assert {p: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps
    # A subset is found too, and changed values are rewritten while the rest is kept.
    assert OffloadStore(tmp_path).write({"steps": weights["steps"]}) == {"steps": first["steps"]}
    changed = dict(weights, **{"layers.0.bias": torch.zeros(16)})
    OffloadStore(tmp_path).write(changed)
    assert len(files_written) == 1
    assert_holds(store, changed)


def test_a_shard_no_tensor_uses_any_more_is_deleted(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    old = store.write({"w": torch.zeros(8)})["w"].path
    new = store.write({"w": torch.ones(8)})["w"].path
    assert new != old and not old.exists() and shards(store) == [new]


def test_a_crash_before_the_manifest_is_replaced_keeps_the_previous_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = model_weights(0)
    after = model_weights(1)
    store = OffloadStore(tmp_path, shard_bytes=2000)
    store.write(before)
    real_replace = os.replace

    def crash_on_manifest(src: str | Path, dst: str | Path) -> None:
        if Path(dst).name == "manifest.json":
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_manifest)
    with pytest.raises(OSError, match="simulated crash"):
        store.write(after)
    monkeypatch.undo()
    assert_holds(store, before)
    assert store.verify() == []
    store.write(after)
    assert_holds(store, after)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {".lock", "manifest.json", *(p.name for p in shards(store))}
    assert len(shards(store)) == len({loc.path for loc in store.locations().values()})


def test_a_crash_mid_shard_leaves_no_shard_and_leftovers_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = OffloadStore(tmp_path)
    store.write({"a": torch.zeros(4)})

    def crash(fd: int) -> None:
        raise OSError("simulated power loss")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="power loss"):
        store.write({"a": torch.ones(4), "b": torch.ones(4)})
    monkeypatch.undo()
    assert len(shards(store)) == 1
    assert_holds(store, {"a": torch.zeros(4)})
    # What a killed process leaves: a half-written temporary file and a shard never named.
    (tmp_path / ".tmp-0123456789ab-shard-0000000000000000.safetensors").write_bytes(b"half")
    (tmp_path / "shard-ffffffffffffffff.safetensors").write_bytes(b"orphan")
    (tmp_path / "notes.txt").write_text("not ours: kept")
    store.write({"b": torch.ones(4)})
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {".lock", "manifest.json", "notes.txt", *(p.name for p in shards(store))}
    assert_holds(store, {"a": torch.zeros(4), "b": torch.ones(4)})


def test_a_flipped_byte_is_detected_and_repaired(tmp_path: Path) -> None:
    weights = model_weights()
    store = OffloadStore(tmp_path, shard_bytes=1500)
    locations = store.write(weights)
    target = locations["layers.0.weight"]
    flip_byte(target.path, target.offset + 5)
    assert store.verify() == ["layers.0.weight"]
    with pytest.raises(OffloadCorruptError) as info:
        store.locations()
    message = str(info.value)
    assert target.path.name in message and "'layers.0.weight'" in message
    assert f"delete {tmp_path}" in message and "compile again" in message
    assert info.value.keys == ["layers.0.weight"]
    others = [k for k in weights if k != "layers.0.weight"]
    assert set(store.locations(others)) == set(others), "undamaged tensors are still served"
    assert store.locations(verify=False)["layers.0.weight"] == target

    with pytest.raises(OffloadCorruptError, match="no source"):
        store.repair({k: weights[k] for k in others})
    assert store.repair(weights) == ["layers.0.weight"]
    assert store.verify() == []
    assert_holds(store, weights)


def test_a_damaged_tensor_is_rewritten_by_write(tmp_path: Path) -> None:
    weights = model_weights()
    store = OffloadStore(tmp_path)
    loc = store.write(weights)["embed.weight"]
    flip_byte(loc.path, loc.offset)
    store.write(weights)
    assert store.verify() == []
    assert_holds(store, weights)


@pytest.mark.parametrize("damage", ["missing", "truncated", "header"])
def test_shard_level_damage_takes_down_all_its_keys(tmp_path: Path, damage: str) -> None:
    weights = model_weights()
    store = OffloadStore(tmp_path)
    locations = store.write(weights)
    path = locations["steps"].path
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        os.truncate(path, path.stat().st_size - 1)
    else:
        flip_byte(path, 20)
    assert store.verify() == sorted(weights)
    with pytest.raises(OffloadCorruptError, match=re.escape(path.name)):
        store.locations(["steps"])
    assert store.repair(weights) == sorted(weights)
    assert_holds(store, weights)


def test_a_damaged_manifest_is_reported(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    store.write({"a": torch.zeros(2)})
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(OffloadCorruptError, match=r"manifest\.json cannot be read"):
        store.locations()
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "tensortorrent-offload/9"}))
    with pytest.raises(OffloadError, match="this version of TensorTorrent reads"):
        store.write({"a": torch.zeros(2)})


def test_unknown_keys_and_unstorable_tensors_are_refused(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    assert store.locations() == {}
    with pytest.raises(OffloadError, match="does not store 'nope'"):
        store.locations(["nope"])
    with pytest.raises(OffloadError, match="meta device"):
        store.write({"m": torch.empty(3, device="meta")})
    with pytest.raises(OffloadError, match="cannot be stored"):
        store.write({"c": torch.zeros(2, dtype=torch.complex128)})
    assert not shards(store)


def test_two_writers_share_a_directory(tmp_path: Path) -> None:
    parts = [{f"w{i}.{j}": torch.full((64,), float(i)) for j in range(3)} for i in range(4)]
    errors: list[BaseException] = []

    def write(part: dict[str, torch.Tensor]) -> None:
        try:
            OffloadStore(tmp_path).write(part)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert_holds(OffloadStore(tmp_path), {k: v for p in parts for k, v in p.items()})


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache, by mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        anchor = ctypes.c_char.from_buffer(mapping)
        try:
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del anchor
            mapping.close()
    return sum(v & 1 for v in vec)


def test_verifying_does_not_fill_the_page_cache(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    path = store.write({"w": torch.randn(256, 1024)})["w"].path
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    before = resident_pages(path)
    if before:
        pytest.skip("this filesystem keeps files in the page cache (tmpfs?)")
    store.locations()
    assert store.verify() == []
    assert resident_pages(path) == 0


def test_source_checksums_read_contiguous_tensors_in_place() -> None:
    tensor = torch.randn(8, 8).to(torch.bfloat16)
    view = safetensors_io._tensor_bytes("t", tensor)
    assert len(view) == 128
    assert np.frombuffer(view, dtype=np.uint8).ctypes.data == tensor.data_ptr()


def test_a_manifest_whose_checksums_do_not_cover_a_tensor_is_refused(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "store")
    store.write({"big": torch.randn(3, 2**16)})  # 768 KiB: three checksum blocks
    path = store.directory / "manifest.json"
    manifest = json.loads(path.read_text())
    assert len(manifest["tensors"]["big"]["sums"]) == 3
    manifest["tensors"]["big"]["sums"].pop()
    path.write_text(json.dumps(manifest))
    with pytest.raises(OffloadCorruptError, match="does not cover its bytes"):
        store.locations(verify=False)


def test_a_dense_tensor_of_another_memory_format_is_stored_as_it_is_in_memory(
    tmp_path: Path,
) -> None:
    """A ``channels_last`` weight (and a 1x1 one, row-major for ``is_contiguous()`` but not
    in its strides) is stored in its memory order and read back with its strides, which
    Dynamo's guards compare (a transposed one too); the file is a valid safetensors file of
    the permuted tensor, and the manifest keeps the strides."""
    g = torch.Generator().manual_seed(0)
    weights = {
        "conv": torch.randn(8, 3, 2, 5, generator=g).to(memory_format=torch.channels_last),
        "conv1x1": torch.randn(8, 4, 1, 1, generator=g).to(memory_format=torch.channels_last),
        "transposed": torch.randn(6, 4, generator=g).t(),
    }
    store = OffloadStore(tmp_path / "store")
    written = store.write(weights)
    assert written["conv"].strides == weights["conv"].stride() == (30, 1, 15, 3)
    assert written["conv1x1"].strides == (4, 1, 4, 4)
    assert written["transposed"].strides == (1, 4)
    assert OffloadStore(tmp_path / "store").locations() == written
    for key, tensor in read_all(written).items():
        assert tensor.stride() == weights[key].stride(), key
        assert torch.equal(tensor, weights[key]), key
    (path,) = shards(store)
    loaded = safetensors.torch.load_file(path)
    assert torch.equal(loaded["conv"], weights["conv"].permute(0, 2, 3, 1))
    # written again as they are: nothing to write; row-major now: written again
    assert store.write(weights) == written
    moved = store.write({"conv": weights["conv"].contiguous()})
    assert moved["conv"].strides is None


def test_a_manifest_whose_strides_overlap_is_refused(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "store")
    store.write({"conv": torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last)})
    path = store.directory / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["tensors"]["conv"]["strides"] == [12, 1, 6, 3]
    manifest["tensors"]["conv"]["strides"] = [12, 1, 6, 1]
    path.write_text(json.dumps(manifest))
    with pytest.raises(OffloadCorruptError, match="do not lay out its bytes densely"):
        store.locations(verify=False)


_HOLDS_A_STORE = """
import sys
import torch
from tensortorrent_dynamo.io.store import OffloadStore
OffloadStore(sys.argv[1]).write({"w": torch.ones(8)}, hold=True)
print("held", flush=True)
sys.stdin.readline()
"""


def test_remove_unused_deletes_only_the_stores_no_process_holds(tmp_path: Path) -> None:
    """A store written without a lease is deleted, whole; one this process holds, or
    another process holds, stays until its holder is gone; a store deleted is made anew by
    the next write."""
    loose = OffloadStore(tmp_path / "loose")
    loose.write(model_weights())
    held = OffloadStore(tmp_path / "held")
    held.write(model_weights(), hold=True)
    other = tmp_path / "other"
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDS_A_STORE, str(other)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        stores = [loose.directory, held.directory, other, tmp_path / "not-a-store"]
        assert store_io.remove_unused(stores) == [loose.directory]
        assert not loose.directory.exists()
        assert held.locations() and OffloadStore(other).locations()
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
    assert store_io.remove_unused([other]) == [other] and not other.exists()
    # written again from nothing where it was deleted
    assert sorted(loose.write(model_weights())) == sorted(model_weights())
    assert_holds(loose, model_weights())
