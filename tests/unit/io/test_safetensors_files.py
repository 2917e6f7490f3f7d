"""Our safetensors writer and header reader agree with the safetensors package."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import safetensors.torch
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensortorrent_dynamo.errors import CheckpointError
from tensortorrent_dynamo.io.pool import HostBufferPool
from tensortorrent_dynamo.io.reader import DiskReader
from tensortorrent_dynamo.io.safetensors import (
    TensorLocation,
    safetensors_locations,
    write_safetensors,
)

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint64,
    torch.uint32,
    torch.uint16,
    torch.uint8,
    torch.complex64,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Arbitrary bytes of ``dtype``: every bit pattern, NaNs included, must survive."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (``torch.equal`` would call NaN unequal to itself)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


@pytest.fixture
def reader() -> Iterator[DiskReader]:
    with DiskReader(HostBufferPool(), chunk_bytes=8192) as r:
        yield r


def read(reader: DiskReader, loc: TensorLocation) -> torch.Tensor:
    result = reader.submit(loc).result()
    tensor = result.tensor.clone()
    reader.pool.give(result.buffer)
    return tensor


def test_every_dtype_round_trips_and_loads_with_safetensors(
    tmp_path: Path, reader: DiskReader
) -> None:
    tensors = {f"t{i}": sample(dtype, (3, 5), seed=i) for i, dtype in enumerate(DTYPES)}
    tensors["strided"] = sample(torch.bfloat16, (6, 8))[::2, 1::3]  # not contiguous
    tensors["transposed"] = sample(torch.float32, (4, 3)).t()
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float16)
    tensors["empty"] = torch.empty(0, 4)
    path = tmp_path / "model.safetensors"
    written = write_safetensors(path, tensors)
    assert list(tmp_path.iterdir()) == [path], "a temporary file was left behind"
    loaded = safetensors.torch.load_file(path)
    indexed = safetensors_locations(path)
    assert written == indexed
    for key, tensor in tensors.items():
        assert same_bytes(loaded[key], tensor), key
        assert same_bytes(read(reader, indexed[key]), tensor), key
        assert indexed[key].offset % tensor.element_size() == 0, "tensors start aligned"
    assert (8 + int.from_bytes(path.read_bytes()[:8], "little")) % 64 == 0


def test_tensors_whose_size_allows_start_where_torch_would_allocate_them(
    tmp_path: Path, reader: DiskReader
) -> None:
    # odd sizes first, in model order: the writer still puts every tensor of a size that is a
    # multiple of 64 bytes at a multiple of 64, so the buffer it is read into views it at the
    # alignment of torch's own allocations
    tensors = {
        "bias": sample(torch.float32, (5,)),
        "weight": sample(torch.float32, (16, 16), seed=1),
        "flag": sample(torch.bool, (3,), seed=2),
        "half": sample(torch.float16, (32, 8), seed=3),
    }
    path = tmp_path / "aligned.safetensors"
    written = write_safetensors(path, tensors)
    assert safetensors_locations(path) == written
    loaded = safetensors.torch.load_file(path)
    for key in ("weight", "half"):
        assert written[key].offset % 64 == 0, key
        result = reader.submit(written[key]).result()
        assert result.tensor.data_ptr() % 64 == 0, key
        assert same_bytes(result.tensor, tensors[key]), key
        reader.pool.give(result.buffer)
        assert same_bytes(loaded[key], tensors[key]), key


def test_locations_of_a_file_from_safetensors_save_file(tmp_path: Path, reader: DiskReader) -> None:
    tensors = {
        "embed.weight": sample(torch.bfloat16, (17, 9)),
        "norm.bias": sample(torch.float32, (9,), seed=1),
        "mask": sample(torch.bool, (3, 3), seed=2),
        "ids": sample(torch.int64, (5,), seed=3),
    }
    path = tmp_path / "hf.safetensors"
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt"})
    locations = safetensors_locations(path)
    assert set(locations) == set(tensors), "__metadata__ is not a tensor"
    for key, tensor in tensors.items():
        loc = locations[key]
        assert (loc.dtype, loc.shape, loc.nbytes) == (
            tensor.dtype,
            tuple(tensor.shape),
            tensor.numel() * tensor.element_size(),
        )
        assert same_bytes(read(reader, loc), tensor), key


def test_write_replaces_a_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"a": torch.zeros(3)})
    write_safetensors(path, {"b": torch.ones(2, dtype=torch.int8)})
    assert set(safetensors.torch.load_file(path)) == {"b"}
    assert list(tmp_path.iterdir()) == [path]


def header_file(
    tmp_path: Path, header: object, data: bytes = b"", raw: bytes | None = None
) -> Path:
    text = raw if raw is not None else json.dumps(header).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "problem"),
    [
        ([1, 2], b"", "not an object"),
        ({"x": {"dtype": "F4", "shape": [1], "data_offsets": [0, 8]}}, bytes(8), "'F4'"),
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4), "needs 8"),
        ({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "truncated"),
        ({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), "malformed"),
        ({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4), "malformed"),
        ({"x": {"dtype": "F32", "shape": [1]}}, bytes(4), "data_offsets"),
        ({"x": "F32"}, b"", "data_offsets"),
    ],
)
def test_malformed_headers_raise_checkpoint_error(
    tmp_path: Path, header: object, data: bytes, problem: str
) -> None:
    path = header_file(tmp_path, header, data)
    with pytest.raises(CheckpointError, match=problem) as info:
        safetensors_locations(path)
    assert str(path) in str(info.value)


def test_missing_truncated_and_foreign_files_raise_checkpoint_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file"):
        safetensors_locations(tmp_path / "absent.safetensors")
    with pytest.raises(CheckpointError, match="is a directory"):
        safetensors_locations(tmp_path)
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="too short"):
        safetensors_locations(short)
    with pytest.raises(CheckpointError, match="not JSON"):
        safetensors_locations(header_file(tmp_path, None, raw=b"\xff\xfe{garbage"))
    with pytest.raises(CheckpointError, match="header claims"):
        text = b'{"x": 1}'
        (tmp_path / "cut.safetensors").write_bytes((len(text) + 100).to_bytes(8, "little") + text)
        safetensors_locations(tmp_path / "cut.safetensors")


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(DTYPES),
            st.lists(st.integers(0, 5), max_size=3),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_random_tensors_round_trip(specs: list[tuple[torch.dtype, list[int], bool]]) -> None:
    tensors = {}
    for i, (dtype, shape, transpose) in enumerate(specs):
        tensor = sample(dtype, tuple(shape), seed=i)
        tensors[f"t{i}"] = tensor.mT if transpose and tensor.dim() >= 2 else tensor
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "p.safetensors"
        write_safetensors(path, tensors)
        loaded = safetensors.torch.load_file(path)
        with DiskReader(HostBufferPool(), chunk_bytes=4096) as r:
            for key, loc in safetensors_locations(path).items():
                assert same_bytes(loaded[key], tensors[key])
                assert same_bytes(read(r, loc), tensors[key])
