"""Faults, injected: a damaged, truncated or missing file, a full or read-only disk, an I/O
error or an exception mid-call, a stuck read, several threads at once. Each ends in the right
answer or in a clear TensorTorrent error, never in a wrong answer, and the call after it is
right."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.backend import CompiledGraph
from tensortorrent_dynamo.io.locations import VERIFY_BLOCK_BYTES, TensorLocation
from tensortorrent_dynamo.io.store import OffloadStore
from tensortorrent_dynamo.run.residents import DiskTier
from tensortorrent_dynamo.weights.released import released_location
from tests.models import mlp, param_bytes

FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _expected(model: torch.nn.Module, *xs: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in xs]


def _streamed_from_disk(tmp_path: Path, width: int = 256, depth: int = 8, **options: Any) -> Any:
    """An MLP whose host budget is half its weights: half of them live in the offload store."""
    model, x = mlp(width, depth), torch.randn(16, width)
    expected = _expected(model, x)[0]
    compiled = tt.compile(
        model,
        (x,),
        offload_dir=str(tmp_path / "offload"),
        compiler="eager",
        budgets={"cpu": param_bytes(model) // 2},
        **options,
    )
    return compiled, x, expected


def _graph(compiled: Any) -> CompiledGraph:
    graph: CompiledGraph = compiled.graphs[0]
    return graph


def _disk(compiled: Any) -> DiskTier:
    disk = _graph(compiled).runtime.disk
    assert disk is not None, "the plan reads weights from disk"
    return disk


def _streamed_location(compiled: Any) -> TensorLocation:
    """Where the largest weight the plan reads from disk on every call is."""
    plan = _graph(compiled).plan
    disk = _disk(compiled)
    keys = [
        p.fqn
        for i, p in enumerate(plan.cost.params)
        if plan.residency[i].on_disk and plan.residency[i].streams and p.fqn in disk.locations
    ]
    assert keys, "some weight streams from disk"
    return max((disk.locations[k] for k in keys), key=lambda loc: loc.nbytes)


def _overwrite(path: Path, offset: int, data: bytes, keep_mtime: bool) -> None:
    """Write ``data`` at ``offset`` of ``path`` in place (same inode); with ``keep_mtime``
    the modification time is put back, as bit rot would leave it."""
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _no_buffers_lent(compiled: Any) -> None:
    """Every pooled host read buffer is back in the pool."""
    graph = _graph(compiled)
    disk = graph.runtime.disk
    if disk is not None:
        assert not disk.pool.lent_buffers, "a pooled read buffer was not handed back"


def test_a_damaged_shard_is_never_computed_on(tmp_path: Path) -> None:
    compiled, x, expected = _streamed_from_disk(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    loc = _streamed_location(compiled)
    # 4 KiB near the end of a streamed weight, the file's time kept: only checksums see it
    _overwrite(loc.path, loc.offset + loc.nbytes - 5000, os.urandom(4096), keep_mtime=True)
    with (
        pytest.raises(tt.OffloadCorruptError, match="fail their checksum") as raised,
        torch.no_grad(),
    ):
        compiled(x)
    message = str(raised.value)
    assert str(loc.path) in message and repr(loc.key) in message and "delete" in message
    assert loc.key in raised.value.keys
    _no_buffers_lent(compiled)
    # the damage is still there: every later call says so too, none computes on it
    with pytest.raises(tt.OffloadCorruptError), torch.no_grad():
        compiled(x)


def test_a_shard_written_since_planning_is_refused_before_any_read(tmp_path: Path) -> None:
    compiled, x, _ = _streamed_from_disk(tmp_path)
    loc = _streamed_location(compiled)
    _overwrite(loc.path, loc.offset, b"\0" * 16, keep_mtime=False)
    before = _disk(compiled).reader.bytes_read
    with pytest.raises(tt.OffloadCorruptError, match="was written since"), torch.no_grad():
        compiled(x)
    assert _disk(compiled).reader.bytes_read == before, "nothing was read"


def test_a_truncated_shard_is_refused(tmp_path: Path) -> None:
    compiled, x, _ = _streamed_from_disk(tmp_path)
    loc = _streamed_location(compiled)
    os.truncate(loc.path, loc.offset + 10)
    with pytest.raises(tt.OffloadCorruptError, match="bytes then and"), torch.no_grad():
        compiled(x)


def test_a_deleted_shard_is_refused(tmp_path: Path) -> None:
    compiled, x, _ = _streamed_from_disk(tmp_path)
    loc = _streamed_location(compiled)
    loc.path.unlink()
    with pytest.raises(tt.OffloadCorruptError, match="is missing"), torch.no_grad():
        compiled(x)


def test_a_bad_first_read_is_read_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Damage that the second read no longer sees (a flaky disk or cable) costs one more
    read, not the call."""
    compiled, x, expected = _streamed_from_disk(tmp_path)
    loc = _streamed_location(compiled)
    good = loc.path.read_bytes()[loc.offset : loc.offset + 4096]
    _overwrite(loc.path, loc.offset, os.urandom(4096), keep_mtime=True)
    reads = []

    def heal_after_first_read(read: TensorLocation) -> None:
        if read.key == loc.key:
            reads.append(read.key)
            if len(reads) == 2:  # the reader's second read of the damaged weight
                _overwrite(loc.path, loc.offset, good, keep_mtime=True)

    _disk(compiled).reader.before_read = heal_after_first_read
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    assert len(reads) >= 2
    assert "reading it again" in caplog.text


def test_a_checkpoint_damaged_after_binding_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model, x = mlp(256, 8), torch.randn(16, 256)
    (expected,) = _expected(model, x)
    ckpt = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(ckpt))
    with torch.device("meta"):
        empty = mlp(256, 8)
    compiled = tt.compile(
        empty,
        (x,),
        checkpoint=str(ckpt),
        budgets={"cpu": param_bytes(model) // 2},
        offload_dir=str(tmp_path / "offload"),
        compiler="eager",
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)  # records the blocks' checksums
    loc = _streamed_location(compiled)
    assert loc.path == ckpt
    _overwrite(ckpt, loc.offset + VERIFY_BLOCK_BYTES // 2, os.urandom(64), keep_mtime=True)
    with pytest.raises(tt.OffloadCorruptError, match="checkpoint"), torch.no_grad():
        compiled(x)
    _overwrite(ckpt, loc.offset, b"\0" * 8, keep_mtime=False)
    with pytest.raises(tt.OffloadCorruptError, match="was written since"), torch.no_grad():
        compiled(x)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount(size, readonly=False)``: a fresh tmpfs of ``size`` bytes; skips the test where
    this process may not mount one."""
    mounted: list[Path] = []

    def mount(size: int, readonly: bool = False) -> Path:
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        options = f"size={size}" + (",ro" if readonly else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def _compile_to(offload: Path, model: torch.nn.Module, x: torch.Tensor) -> Any:
    return tt.compile(
        model,
        (x,),
        offload_dir=str(offload),
        compiler="eager",
        budgets={"cpu": param_bytes(model) // 2},
    )


def test_a_full_offload_dir_says_what_to_do_and_keeps_the_weights(
    small_tmpfs: Callable[..., Path],
) -> None:
    model, x = mlp(256, 8), torch.randn(16, 256)
    (expected,) = _expected(model, x)
    offload = small_tmpfs(256 * 1024)
    with pytest.raises(tt.OffloadError, match="not enough free space") as raised:
        _compile_to(offload, model, x)
    message = str(raised.value)
    assert str(offload) in message and "offload_dir" in message and "free" in message
    assert all(released_location(p) is None for p in model.parameters())
    torch.testing.assert_close(_expected(model, x)[0], expected)
    assert not list(offload.rglob("*.safetensors")), "nothing half-written stays"


def test_a_write_that_runs_out_of_space_leaves_nothing(
    small_tmpfs: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The free-space check can be wrong (another writer, a quota): a write that fails with
    ENOSPC midway removes what it wrote and explains itself."""
    model, x = mlp(256, 8), torch.randn(16, 256)
    (expected,) = _expected(model, x)
    offload = small_tmpfs(512 * 1024)
    monkeypatch.setattr(OffloadStore, "_free_bytes", lambda self: 2**40)
    monkeypatch.setattr(OffloadStore, "__init__", _small_shards)
    with pytest.raises(tt.OffloadError, match="No space left on device"):
        _compile_to(offload, model, x)
    assert not [p for p in offload.rglob("*") if p.is_file() and p.name != ".lock"]
    assert all(released_location(p) is None for p in model.parameters())
    torch.testing.assert_close(_expected(model, x)[0], expected)


def _small_shards(self: OffloadStore, directory: str | os.PathLike[str], **_: Any) -> None:
    self.directory = Path(os.path.abspath(directory))
    self.shard_bytes = 128 * 1024  # several shards, so some are complete when space runs out


def test_a_read_only_offload_dir_says_what_to_do(small_tmpfs: Callable[..., Path]) -> None:
    model, x = mlp(256, 8), torch.randn(16, 256)
    (expected,) = _expected(model, x)
    offload = small_tmpfs(64 * 2**20, readonly=True)
    with pytest.raises(tt.OffloadError, match="Read-only file system") as raised:
        _compile_to(offload / "store", model, x)
    assert "offload_dir" in str(raised.value)
    torch.testing.assert_close(_expected(model, x)[0], expected)


def test_an_io_error_fails_the_call_and_the_next_call_is_right(tmp_path: Path) -> None:
    compiled, x, expected = _streamed_from_disk(tmp_path)
    disk = _disk(compiled)
    failed = []

    def fail_once(loc: TensorLocation) -> None:
        if not failed:
            failed.append(loc.key)
            raise OSError(errno.EIO, "Input/output error")

    disk.reader.before_read = fail_once
    with pytest.raises(tt.OffloadError, match="Input/output error"), torch.no_grad():
        compiled(x)
    _no_buffers_lent(compiled)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    _no_buffers_lent(compiled)


def test_a_stuck_read_times_out_naming_it(tmp_path: Path) -> None:
    compiled, x, expected = _streamed_from_disk(tmp_path, io_timeout_s=0.5)
    disk = _disk(compiled)
    release = threading.Event()
    disk.reader.before_read = lambda loc: release.wait(10) and None
    started = time.perf_counter()
    stuck = r"reading '.*' from .* has not finished"
    with pytest.raises(tt.CopyTimeout, match=stuck), torch.no_grad():
        compiled(x)
    assert time.perf_counter() - started < 5, "the caller did not hang on the read"
    disk.reader.before_read = None
    release.set()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)


def _on_virtual(tmp_path: Path) -> tuple[Any, torch.nn.Module, int]:
    """An MLP streamed to a virtual accelerator with room for a third of its weights."""
    model, x = mlp(128, 8), torch.randn(8, 128)
    budget = param_bytes(model) // 3
    compiled = tt.compile(
        model,
        (x,),
        compiler="eager",
        budgets={"virtual:0": budget},
        virtual_devices=FAST_VIRTUAL,
        devices=["virtual:0"],
    )
    plan = _graph(compiled).plan
    assert any(plan.residency[i].streams for i in range(len(plan.cost.params)))
    return compiled, model, budget


class _Broken(torch.nn.Module):
    def forward(self, *args: Any) -> Any:
        raise RuntimeError("injected")


def test_an_exception_in_a_segment_names_it_and_the_next_call_is_right(tmp_path: Path) -> None:
    compiled, model, budget = _on_virtual(tmp_path)
    x = torch.randn(8, 128)
    (expected,) = _expected(model, x)
    graph = _graph(compiled)
    device = graph.runtime.virtual["virtual:0"]
    live = device.ledger.live
    name = next(n for n, d in graph.compilers_by_device() if d == "virtual:0")
    segment = getattr(graph.module, name)
    original = segment.fn, segment.eager_fn
    segment.fn = segment.eager_fn = _Broken()
    with pytest.raises(RuntimeError, match="injected") as raised, torch.no_grad():
        compiled(x)
    assert any(name in note for note in getattr(raised.value, "__notes__", []))
    del raised  # its traceback's frames hold the call's activations
    gc.collect()
    assert not graph.runtime._handles
    assert device.ledger.live <= live, "the failed call's buffers went back"
    segment.fn, segment.eager_fn = original
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    assert device.ledger.peak <= budget


def test_four_threads_calling_one_streamed_model_all_get_their_answer(tmp_path: Path) -> None:
    compiled, model, budget = _on_virtual(tmp_path)
    inputs = [torch.randn(8, 128, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    expected = _expected(model, *inputs)
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            with torch.no_grad():
                for _ in range(3):
                    results[i] = compiled(inputs[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for i in range(4):
        torch.testing.assert_close(results[i], expected[i])
    assert 0 < compiled.measured_peaks()["virtual:0"] <= budget


def test_a_plan_made_at_call_time_leaves_another_threads_compiled_model_alone() -> None:
    """A call in a new range of sizes plans at call time, while another thread runs a
    compiled model. Counting the plan's FLOPs must not reach into that thread: with
    ``FlopCounterMode``'s global module hooks, its module calls, under Dynamo, traced them
    and failed."""
    model = mlp(128, 8)
    compiled = torch.compile(
        model,
        backend="tensortorrent",
        dynamic=True,
        options={
            "compiler": "eager",
            "budgets": {"virtual:0": param_bytes(model) // 2},
            "virtual_devices": FAST_VIRTUAL,
            "devices": ["virtual:0"],
        },
    )
    other, y = torch.compile(mlp(32, 4, seed=1), backend="eager"), torch.randn(4, 32)
    with torch.no_grad():
        compiled(torch.randn(3, 128))
        other(y)
    stop = threading.Event()
    errors: list[BaseException] = []
    calls = 0

    def run_other() -> None:
        nonlocal calls
        try:
            with torch.no_grad():
                while not stop.is_set():
                    other(y)
                    calls += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run_other)
    thread.start()
    try:
        for rows in (8, 16, 32, 64):  # each in a range of sizes not planned yet
            x = torch.randn(rows, 128)
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), model(x))
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert calls > 0
    assert len(tt.tensortorrent_backend.graphs) == 5, "each range was planned at its call"


@pytest.mark.parametrize(
    ("option", "value"),
    [("budgets", {"cuda:7": "1GiB"}), ("devices", ["cuda:3"])],
)
def test_a_device_this_machine_lacks_is_refused(option: str, value: Any) -> None:
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has that many CUDA devices")
    with pytest.raises(tt.OptionsError, match="does not have; the devices here are 'cpu'"):
        tt.compile(mlp(16, 2), (torch.randn(2, 16),), compiler="eager", **{option: value})
