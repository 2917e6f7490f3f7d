"""Released tensors: a meta-device model bound to its safetensors checkpoint, and the
registry of where each released tensor's bytes are."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from tensortorrent_dynamo.errors import CheckpointError, ReplacedWeightError
from tensortorrent_dynamo.io import pagemap
from tensortorrent_dynamo.io.locations import TensorLocation
from tensortorrent_dynamo.io.safetensors import write_safetensors
from tensortorrent_dynamo.io.store import OffloadStore
from tensortorrent_dynamo.weights import released
from tensortorrent_dynamo.weights.released import bind_checkpoint, release, released_location
from tests.mapped import holds_its_file


class Tied(nn.Module):
    """An embedding whose weight the output head shares, a linear layer and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.lin = nn.Linear(4, 3)
        self.head = nn.Linear(4, 5, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.linspace(1.0, 2.0, 3))


def _real() -> Tied:
    torch.manual_seed(0)
    return Tied()


def _meta() -> Tied:
    with torch.device("meta"):
        return Tied()


def _checkpoint(path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, TensorLocation]:
    return write_safetensors(path, {k: v.detach().contiguous() for k, v in tensors.items()})


def _unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with a tied tensor stored once, under its first name."""
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            state[name] = tensor
    return state


def _file_bytes(location: TensorLocation) -> bytes:
    with open(location.path, "rb") as f:
        f.seek(location.offset)
        return f.read(location.nbytes)


def test_every_meta_tensor_is_bound_to_its_bytes_in_the_file_mapped(tmp_path: Path) -> None:
    real = _real()
    written = _checkpoint(tmp_path / "model.safetensors", _unique_state(real))
    model = _meta()
    expected = {name: (t.shape, t.dtype) for name, t in model.state_dict(keep_vars=True).items()}

    # emb.weight (tied with head.weight), lin.weight, lin.bias, scale
    assert bind_checkpoint(model, tmp_path / "model.safetensors") == 4

    state = model.state_dict(keep_vars=True)
    assert set(state) == set(expected)
    for name, tensor in state.items():
        assert tensor.device.type == "cpu", name
        assert (tensor.shape, tensor.dtype) == expected[name], name
        assert holds_its_file(tensor), name
        location = released_location(tensor)
        assert location is not None, name
        stored = written["emb.weight" if name == "head.weight" else name]
        assert (location.key, location.offset, location.nbytes) == (
            stored.key,
            stored.offset,
            stored.nbytes,
        )
        assert location.path == (tmp_path / "model.safetensors").resolve()
        assert tuple(location.shape) == tuple(tensor.shape) and location.dtype == tensor.dtype
        # the location points at this tensor's own bytes in the file
        source = real.state_dict()[name].contiguous()
        assert _file_bytes(location) == source.numpy().tobytes(), name
    # parameters stay parameters (with their requires_grad), buffers stay plain tensors
    assert isinstance(model.lin.weight, nn.Parameter) and model.lin.weight.requires_grad
    assert not isinstance(model.scale, nn.Parameter)
    assert model.scale in list(model.buffers())


def _sharded(directory: Path, state: dict[str, torch.Tensor], shards: int = 2) -> Path:
    """``state`` written over ``shards`` files with an index, as ``save_pretrained`` writes a
    large model; returns the index's path."""
    directory.mkdir()
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[i::shards]}
        _checkpoint(directory / file, part)
        weight_map |= dict.fromkeys(part, file)
    index = directory / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


@pytest.mark.parametrize("given", ["index", "directory"])
def test_a_sharded_checkpoint_is_bound_by_its_index_or_directory(
    tmp_path: Path, given: str
) -> None:
    real = _real()
    index = _sharded(tmp_path / "saved", _unique_state(real))
    model = _meta()
    assert bind_checkpoint(model, index if given == "index" else index.parent) == 4
    files = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        location = released_location(tensor)
        assert location is not None and holds_its_file(tensor), name
        files.add(location.path.name)
        torch.testing.assert_close(tensor, real.state_dict()[name])
    assert len(files) == 2


def test_a_checkpoint_that_cannot_be_read_as_one_says_why(tmp_path: Path) -> None:
    state = _unique_state(_real())
    index = _sharded(tmp_path / "saved", state)
    # a tensor in two shards
    _checkpoint(tmp_path / "saved" / "model-00002-of-00002.safetensors", state)
    with pytest.raises(CheckpointError, match="is in two of its files"):
        bind_checkpoint(_meta(), index)
    # a shard missing
    (tmp_path / "saved" / "model-00001-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"1 of its 2 shards are not beside it"):
        bind_checkpoint(_meta(), index)
    # not an index
    index.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="not a safetensors index"):
        bind_checkpoint(_meta(), index)
    # a directory of several files and no index
    index.unlink()
    _checkpoint(tmp_path / "saved" / "other.safetensors", state)
    with pytest.raises(CheckpointError, match=r"must hold one .*found model-00002"):
        bind_checkpoint(_meta(), tmp_path / "saved")


def test_tied_weights_share_one_placeholder(tmp_path: Path) -> None:
    # stored under the head's name only: the embedding finds it by its other name
    state = _unique_state(_real())
    state["head.weight"] = state.pop("emb.weight")
    written = _checkpoint(tmp_path / "model.safetensors", state)
    model = _meta()
    assert bind_checkpoint(model, tmp_path / "model.safetensors") == 4
    assert model.head.weight is model.emb.weight
    assert len(list(model.parameters())) == 3  # the tie survived: one parameter, two names
    location = released_location(model.emb.weight)
    assert location is not None and location.key == "head.weight"
    assert location.offset == written["head.weight"].offset


class TiedLater(Tied):
    """Built untied, as transformers' models are under ``accelerate.init_empty_weights``:
    ``tie_weights()`` ties them, as ``from_pretrained`` would."""

    def __init__(self) -> None:
        super().__init__()
        self.head.weight = nn.Parameter(self.emb.weight.detach().clone())

    def tie_weights(self) -> None:
        self.head.weight = self.emb.weight


def test_a_model_tied_only_by_tie_weights_is_tied_before_it_is_bound(tmp_path: Path) -> None:
    """The checkpoint holds the tied weight once (the embedding's): the head, untied on the
    meta device, is tied to it rather than refused as missing from the file."""
    _checkpoint(tmp_path / "model.safetensors", _unique_state(_real()))
    with torch.device("meta"):
        model = TiedLater()
    assert model.head.weight is not model.emb.weight
    assert bind_checkpoint(model, tmp_path / "model.safetensors") == 4
    assert model.head.weight is model.emb.weight
    torch.testing.assert_close(model.head.weight, _real().emb.weight, rtol=0, atol=0)


def test_tensors_already_real_are_left_alone(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "model.safetensors", _unique_state(_real()))
    model = _meta()
    kept = torch.nn.Parameter(torch.full((3,), 7.0))
    model.lin.bias = kept
    assert bind_checkpoint(model, tmp_path / "model.safetensors") == 3
    assert model.lin.bias is kept and released_location(kept) is None
    assert torch.equal(model.lin.bias.detach(), torch.full((3,), 7.0))


def test_a_meta_tensor_missing_from_the_checkpoint_is_named(tmp_path: Path) -> None:
    state = _unique_state(_real())
    del state["lin.bias"]
    _checkpoint(tmp_path / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=r"no tensor named 'lin\.bias'"):
        bind_checkpoint(_meta(), tmp_path / "model.safetensors")


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        (torch.zeros(2, 4), r"lin\.weight is torch\.float32 \[2, 4\] in the file"),
        (torch.zeros(3, 4, dtype=torch.float16), r"lin\.weight is torch\.float16 \[3, 4\]"),
    ],
    ids=["shape", "dtype"],
)
def test_a_shape_or_dtype_mismatch_is_named(
    tmp_path: Path, stored: torch.Tensor, words: str
) -> None:
    state = _unique_state(_real())
    state["lin.weight"] = stored
    _checkpoint(tmp_path / "model.safetensors", state)
    with pytest.raises(CheckpointError, match=words):
        bind_checkpoint(_meta(), tmp_path / "model.safetensors")


def test_an_ordinary_tensor_has_no_location() -> None:
    assert released_location(torch.ones(3)) is None
    assert released_location(nn.Parameter(torch.ones(3))) is None


def test_release_keeps_the_tensor_object_and_maps_its_bytes(tmp_path: Path) -> None:
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    (location,) = write_safetensors(tmp_path / "t.safetensors", {"t": tensor.clone()}).values()
    before = id(tensor)
    release(tensor, location)
    assert id(tensor) == before and tensor.shape == (3, 4) and tensor.dtype == torch.float32
    assert released_location(tensor) == location
    # eager code still reads it (through the page cache), and writes stay out of the file
    assert holds_its_file(tensor)
    torch.testing.assert_close(tensor, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    tensor.data.mul_(0)
    assert _file_bytes(location) == torch.arange(12, dtype=torch.float32).numpy().tobytes()


def test_a_file_that_cannot_be_mapped_leaves_a_tensor_with_no_bytes(tmp_path: Path) -> None:
    """A location past the end of its file (truncated since it was written) is not mapped:
    the tensor holds nothing, and the runtime's verified reads say what is wrong."""
    tensor = torch.ones(4)
    (location,) = write_safetensors(tmp_path / "t.safetensors", {"t": tensor.clone()}).values()
    os.truncate(location.path, location.offset + 4)
    release(tensor, location)
    assert released_location(tensor) == location and tensor.shape == (4,)
    assert tensor.untyped_storage().nbytes() == 0


def test_released_tensors_of_one_file_do_not_share_a_storage(tmp_path: Path) -> None:
    """Each released tensor has a storage of its own over the file's one mapping: the graph
    capture does not take them for views of one another."""
    tensors = {"a": torch.ones(1024), "b": torch.zeros(1024)}
    written = write_safetensors(
        tmp_path / "t.safetensors", {k: t.clone() for k, t in tensors.items()}
    )
    for key, tensor in tensors.items():
        release(tensor, written[key])
    a, b = tensors["a"], tensors["b"]
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert a.untyped_storage().nbytes() == b.untyped_storage().nbytes() == 4096
    assert torch.equal(a, torch.ones(1024)) and torch.equal(b, torch.zeros(1024))


def test_the_registry_does_not_keep_a_tensor_alive(tmp_path: Path) -> None:
    gc.collect()
    before = len(released._released)
    _checkpoint(tmp_path / "model.safetensors", _unique_state(_real()))
    model = _meta()
    bind_checkpoint(model, tmp_path / "model.safetensors")
    assert len(released._released) == before + 4
    tensor = torch.ones(2)
    (location,) = write_safetensors(tmp_path / "t.safetensors", {"t": tensor.clone()}).values()
    release(tensor, location)
    assert len(released._released) == before + 5

    del model, tensor
    gc.collect()
    assert len(released._released) == before


def test_a_disk_read_is_only_for_the_tensor_released_there(tmp_path: Path) -> None:
    """A plan reads a weight from where its tensor was released: given a tensor holding
    its own bytes, or one released elsewhere, the read is refused, not made for it."""
    tensors = {"a": torch.ones(8), "b": torch.zeros(8)}
    written = write_safetensors(
        tmp_path / "t.safetensors", {k: t.clone() for k, t in tensors.items()}
    )
    for key, tensor in tensors.items():
        release(tensor, written[key])
    released.check_released(tensors["a"], written["a"])
    for other in (tensors["b"], torch.ones(8)):
        with pytest.raises(ReplacedWeightError, match="holds other bytes than those its plan"):
            released.check_released(other, written["a"])
    tensors["a"].add_(1)
    with pytest.raises(ReplacedWeightError, match="written in place"):
        released.check_released(tensors["a"], written["a"])
    # it now holds its new bytes in RAM of its own: a plan made now plans it where it is
    assert released_location(tensors["a"]) is None
    assert torch.equal(tensors["a"], torch.full((8,), 2.0))
    assert released_location(tensors["b"]) == written["b"]


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="Linux's page map")
def test_a_write_through_data_is_seen_where_its_bytes_differ_from_the_file(
    tmp_path: Path,
) -> None:
    """``p.data += delta`` (an adapter merged in place) moves no version counter and keeps
    the address; the pages it wrote are copied out of the file's mapping, and their bytes
    differ from the file's: seen for the weight and for rows of it that were written, not
    for rows that were not, nor for a neighbour sharing a written page, nor for a weight
    written over with its own values. Once seen, every weight written so gets RAM of its
    own holding its bytes as the model sees them (planned again with them); the others stay
    released."""
    tensors = {
        "small": torch.arange(6, dtype=torch.float32),
        "big": torch.randn(256, 64),
        "next": torch.arange(5, dtype=torch.float32),
    }
    written = write_safetensors(
        tmp_path / "t.safetensors", {k: t.clone() for k, t in tensors.items()}
    )
    for key, tensor in tensors.items():
        release(tensor, written[key])
        released.check_released(tensor, written[key])
    big, location = tensors["big"], written["big"]
    top, bottom = released.released_rows(big, 0, 128), released.released_rows(big, 128, 256)
    assert top is not None and bottom is not None
    expected = {k: t.clone() for k, t in tensors.items()}

    big.data.mul_(1.0)  # every page copied, every byte as it was
    released.check_released(big, location)
    big.data[200:] += 1.0  # the last rows only: moves no version counter
    expected["big"][200:] += 1.0
    assert big._version == 0 and released_location(big) == location
    released.check_released(top, location.rows(0, 128))
    # "small" and "next" follow "big" in the file, on its last page, which was copied:
    # their bytes are the file's
    assert pagemap.copied_ranges(tensors["small"].data_ptr(), 24)
    released.check_released(tensors["small"], written["small"])
    released.check_released(tensors["next"], written["next"])
    tensors["small"].data[5] = -1.0
    expected["small"][5] = -1.0
    with pytest.raises(ReplacedWeightError, match=r"written in place.*through ``\.data``"):
        released.check_released(bottom, location.rows(128, 256))
    assert released_location(big) is None and released_location(tensors["small"]) is None
    assert released_location(tensors["next"]) == written["next"]
    for key, tensor in tensors.items():
        assert torch.equal(tensor, expected[key]), key


def test_a_tensor_given_other_bytes_holds_its_own_again(tmp_path: Path) -> None:
    """``.data = ...`` (``module.to(dtype)`` does it too) moves no version counter: the
    tensor is no longer released (a plan made now plans it where it is), and a plan that
    reads it from disk is refused. Rows of it alike."""
    tensor = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    (location,) = write_safetensors(tmp_path / "t.safetensors", {"t": tensor.clone()}).values()
    release(tensor, location)
    rows = released.released_rows(tensor, 0, 2)
    assert rows is not None
    released.check_released(rows, location.rows(0, 2))
    tensor.data = tensor.data * 2
    assert released_location(tensor) is None and released_location(rows) is None
    assert released.released_rows(tensor, 0, 2) is None
    with pytest.raises(ReplacedWeightError, match="given them after the plan was made"):
        released.check_released(tensor, location)
    with pytest.raises(ReplacedWeightError):
        released.check_released(rows, location.rows(0, 2))


@pytest.mark.parametrize("mapped", [True, False])
def test_a_released_tensor_keeps_its_strides(tmp_path: Path, mapped: bool) -> None:
    """Dynamo guards on a weight's strides: released, a ``channels_last`` weight keeps them,
    mapped over its bytes as the offload store keeps them (as they are in memory), or
    holding none (a file that cannot be mapped)."""
    tensor = torch.randn(4, 3, 2, 2).to(memory_format=torch.channels_last)
    values = tensor.clone()
    (location,) = OffloadStore(tmp_path / "store").write({"t": tensor.clone()}).values()
    if not mapped:
        os.truncate(location.path, location.offset + 4)
    release(tensor, location)
    strides = tensor.stride()
    assert strides == (12, 1, 6, 3)
    if mapped:
        assert torch.equal(tensor, values)
