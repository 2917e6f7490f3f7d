"""The disk tier end to end: weights larger than the host budget live on disk and are read
back each run; a meta-device model runs from its safetensors checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import tensortorrent as tt
from tensortorrent_dynamo.io.pool import read_buffer_bytes
from tests.mapped import holds_its_file
from tests.models import mlp, param_bytes

FAST_VIRTUAL = {"virtual:0": {"flops": "2T", "bandwidth": "16GB", "latency": 1e-6}}


def _host_budget(model: torch.nn.Module) -> int:
    return param_bytes(model) // 2


def _compile(model: torch.nn.Module, x: torch.Tensor, tmp_path: Path, **options: Any) -> Any:
    return tt.compile(
        model, (x,), offload_dir=str(tmp_path / "offload"), compiler="eager", **options
    )


@pytest.mark.parametrize("through_data", [False, True], ids=["in_place", "through_data"])
@pytest.mark.parametrize("chunk", [0, 2**16])
def test_a_weight_written_in_place_after_it_was_moved_to_disk_is_read_as_written(
    tmp_path: Path, chunk: int, through_data: bool
) -> None:
    """A released weight maps its stored bytes copy-on-write, so a write to it (as the
    model's own ``load_state_dict`` makes it, or through ``.data`` as an adapter merged in
    place, which moves no version counter) never reaches the store the compiled graphs read:
    the next call sees it, gives the weight RAM of its own holding its bytes as written, and
    plans again, so that it computes with them. Whole weights and weights read in row chunks
    alike."""
    model, x = mlp(256, 8), torch.randn(16, 256)
    compiled = _compile(
        model, x, tmp_path, budgets={"cpu": _host_budget(model)}, stream_chunk_bytes=chunk
    )
    with torch.no_grad():
        compiled(x)
    weight = next(p for p in model.parameters() if holds_its_file(p))
    with torch.no_grad():
        (weight.data if through_data else weight).mul_(2.0)
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))


def test_weights_beyond_the_host_budget_stream_from_disk(tmp_path: Path) -> None:
    model, x = mlp(256, 8), torch.randn(16, 256)
    with torch.no_grad():
        expected = model(x)
    budget = _host_budget(model)
    compiled = _compile(model, x, tmp_path, budgets={"cpu": budget})
    plan = compiled.graphs[0].plan
    assert all(r.on_disk for r in plan.residency)
    # with or without reads ahead (which costs a weight kept): the disk's per-read cost
    # decides, at these small weights
    assert plan.native.chosen.startswith("all-on-cpu/knapsack")
    assert plan.predicted_peak("cpu") <= budget
    streamed = [i for i in range(len(plan.cost.params)) if plan.residency[i].streams]
    kept = [i for i in range(len(plan.cost.params)) if not plan.residency[i].streams]
    assert streamed and kept, "half the weights fit: some stay in RAM, the others stream"

    # the streamed weights left RAM; the model's tensors map their bytes in the store now
    params = dict(model.named_parameters())
    for i in streamed:
        assert holds_its_file(params[plan.cost.params[i].fqn])
    assert (tmp_path / "offload").is_dir()

    with torch.no_grad():
        for _ in range(2):  # the second call reuses the pooled host buffers
            torch.testing.assert_close(compiled(x), expected)
            assert compiled.disk_bytes_read() == sum(plan.cost.params[i].nbytes for i in streamed)
    # every read landed in the block reserved for the plan's reads in flight, within the
    # budget, plus the largest read (what wrapping around it may leave unused)
    pool = compiled.graphs[0].runtime.disk.pool
    largest = max(read_buffer_bytes(plan.cost.params[i].nbytes) for i in streamed)
    assert 0 < plan.disk_buffer_peak() < budget
    assert pool.reserved_bytes == plan.disk_buffer_peak() + largest == pool.held_bytes
    assert pool.lent_buffers == 0
    assert "prefetch" in compiled.graphs[0].module.code
    text = compiled.explain()
    assert "disk tier:" in text and "RSS" in text


def test_disk_feeds_a_virtual_accelerator(tmp_path: Path) -> None:
    model, x = mlp(192, 6), torch.randn(32, 192)
    with torch.no_grad():
        expected = model(x)
    size = param_bytes(model)
    device_budget = size // 2
    compiled = _compile(
        model,
        x,
        tmp_path,
        # three eighths of the weights: room for two weights' read buffers at once, the next
        # weight is read while the one before it is copied on
        budgets={"cpu": size * 3 // 8, "virtual:0": device_budget},
        virtual_devices=FAST_VIRTUAL,
        devices=["virtual:0"],
    )
    plan = compiled.graphs[0].plan
    assert any(r.on_disk for r in plan.residency)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), expected)
    assert compiled.disk_bytes_read() > 0
    assert 0 < compiled.measured_peaks()["virtual:0"] <= device_budget


def test_offload_store_is_written_once_and_repaired_from_the_weights(tmp_path: Path) -> None:
    model, x = mlp(128, 6), torch.randn(8, 128)
    with torch.no_grad():
        expected = model(x)
    budget = _host_budget(model)
    _compile(mlp(128, 6), x, tmp_path, budgets={"cpu": budget})
    shards = sorted((tmp_path / "offload").rglob("*.safetensors"))
    assert shards
    before = {p: p.stat().st_mtime_ns for p in shards}

    # the same weights compiled again: nothing is written
    torch._dynamo.reset()
    tt.tensortorrent_backend.reset()
    _compile(mlp(128, 6), x, tmp_path, budgets={"cpu": budget})
    assert {p: p.stat().st_mtime_ns for p in shards} == before

    # a shard damaged on disk is found by its checksum and written again from the weights
    data = bytearray(shards[0].read_bytes())
    data[-1] ^= 0xFF
    shards[0].write_bytes(bytes(data))
    torch._dynamo.reset()
    tt.tensortorrent_backend.reset()
    compiled = _compile(model, x, tmp_path, budgets={"cpu": budget})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)


# Runs in a fresh process so that its peak RSS is its own: builds the model on the meta
# device, binds it to the checkpoint and runs it with a RAM budget of a quarter of it.
_CHECKPOINT_RUN = """
import json, resource, sys
import torch
import tensortorrent as tt
from tests.models import mlp

ckpt, offload, x_path = sys.argv[1:4]
x = torch.load(x_path)
with torch.no_grad():  # warm Dynamo and the backend up on a tiny model first
    tt.compile(mlp(8, 1), (torch.randn(2, 8),), compiler="eager")(torch.randn(2, 8))
torch._dynamo.reset()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with torch.device("meta"):
    model = mlp(1024, 16)
budget = 16 * 1024 * 1024
compiled = tt.compile(model, (x,), checkpoint=ckpt, budgets={"cpu": budget},
                      offload_dir=offload, compiler="eager")
with torch.no_grad():
    out = compiled(x)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
torch.save(out, x_path + ".out")
print(json.dumps({"growth": peak - base, "read": compiled.disk_bytes_read(),
                  "chosen": compiled.graphs[0].plan.native.chosen}))
"""


def test_meta_model_runs_from_its_checkpoint_without_holding_its_weights(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model, x = mlp(1024, 16), torch.randn(4, 1024)
    size = param_bytes(model)  # 64 MiB
    with torch.no_grad():
        expected = model(x)
    ckpt = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(ckpt))
    del model
    torch.save(x, tmp_path / "x.pt")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            *(sys.executable, "-c", textwrap.dedent(_CHECKPOINT_RUN)),
            *(str(ckpt), str(tmp_path / "offload"), str(tmp_path / "x.pt")),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.load(tmp_path / "x.pt.out"), expected)
    assert result["read"] > 0
    # never all the weights at once: the budget (a quarter) plus room for the process
    assert result["growth"] < size // 2, result


def test_meta_parameters_without_a_checkpoint_are_refused() -> None:
    with torch.device("meta"):
        model = mlp(16, 2)
    with pytest.raises(tt.TensorTorrentError, match="meta"):
        tt.compile(model, (torch.randn(2, 16),), compiler="eager")


def test_checkpoint_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = mlp(16, 2).state_dict()
    state.pop("2.bias")
    save_file(state, str(tmp_path / "partial.safetensors"))
    with torch.device("meta"):
        model = mlp(16, 2)
    with pytest.raises(tt.CheckpointError, match=r"2\.bias"):
        tt.bind_checkpoint(model, tmp_path / "partial.safetensors")


def test_recompiled_graphs_share_the_weights_they_keep_in_ram(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = mlp(256, 8)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    budget = _host_budget(model)
    with torch.device("meta"):
        empty = mlp(256, 8)
    x16, x32 = torch.randn(16, 256), torch.randn(32, 256)
    compiled = _compile(
        empty,
        x16,
        tmp_path,
        checkpoint=str(tmp_path / "model.safetensors"),
        budgets={"cpu": budget},
    )
    with torch.no_grad():
        torch.testing.assert_close(compiled(x32), model(x32))  # a second graph
        torch.testing.assert_close(compiled(x16), model(x16))
    # the static graph for 16 rows, then the dynamic one, planned for 16 < rows <= 32 and,
    # when 16 rows come back through it, for 8 < rows <= 16
    assert len(compiled.graphs) == 3
    runtime = compiled.graphs[0].runtime
    assert all(g.runtime.resident is runtime.resident for g in compiled.graphs)
    kept = [
        {p.fqn for i, p in enumerate(g.plan.cost.params) if not g.plan.residency[i].streams}
        for g in compiled.graphs
    ]
    assert all(kept)
    # the graphs are alternatives (one frame): the copies in RAM are those of the one that
    # ran last, each read once and shared where an alternative keeps the same weight
    held = runtime.resident_bytes("cpu")
    assert held == sum(p.nbytes for p in compiled.graphs[2].plan.cost.params if p.fqn in kept[2])
    assert held <= budget


def test_damaged_shard_with_no_weights_left_is_a_clear_error(tmp_path: Path) -> None:
    model, x = mlp(128, 6), torch.randn(8, 128)
    compiled = _compile(model, x, tmp_path, budgets={"cpu": _host_budget(model)})
    # the streamed weights now exist only on disk; damage their shard
    (shard,) = sorted((tmp_path / "offload").rglob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with torch.no_grad(), pytest.raises(tt.OffloadCorruptError, match="corrupt"):
        compiled(torch.randn(3, 128))  # another shape: a recompile relies on the shard


def test_a_tight_budget_reads_each_weight_when_its_layer_starts(tmp_path: Path) -> None:
    # room for 4 weights and one read buffer: reading synchronously keeps one more
    # weight in RAM than a double buffer would, and little compute hides no reads (the
    # weights large enough that each read's fixed cost matters little)
    model, x = mlp(1024, 8), torch.randn(1, 1024)
    with torch.no_grad():
        expected = model(x)
    weight = 1024 * 1024 * 4 + 4096
    compiled = _compile(model, x, tmp_path, budgets={"cpu": 5 * weight + 64 * 1024})
    plan = compiled.graphs[0].plan
    assert plan.native.chosen.endswith("-sync") and plan.native.prefetch_depth == 0
    code = compiled.graphs[0].module.code
    # each prefetch is waited for right away, before the segment that issued it
    lines = [
        line.strip()
        for line in code.splitlines()
        if "_run_ops_prefetch" in line or "_run_ops_wait" in line
    ]
    for issue, wait in zip(lines[::2], lines[1::2], strict=True):
        handle = issue.split(" = ")[0]
        assert "_run_ops_prefetch" in issue and f"_run_ops_wait({handle})" in wait
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), expected)


# mlp(256, 8): weights of 256 KiB; chunks of 64 KiB split each into 4 of 64 rows
CHUNK = 64 * 1024


def test_large_weights_stream_in_row_chunks_and_read_less(tmp_path: Path) -> None:
    x = torch.randn(16, 256)
    with torch.no_grad():
        expected = mlp(256, 8)(x)
    budget = _host_budget(mlp(256, 8))
    read: dict[int, int] = {}
    for chunk in (0, CHUNK):
        torch._dynamo.reset()
        model = mlp(256, 8)
        compiled = _compile(model, x, tmp_path, budgets={"cpu": budget}, stream_chunk_bytes=chunk)
        with torch.no_grad():
            for _ in range(2):
                torch.testing.assert_close(compiled(x), expected)
        read[chunk] = compiled.disk_bytes_read()
    # whole weights: two 256 KiB read buffers out of a 1 MiB budget; chunks: two of 64 KiB
    assert 0 < read[CHUNK] < read[0], read

    plan = compiled.graphs[0].plan
    assert plan.predicted_peak("cpu") <= budget
    names = [p.fqn for p in plan.cost.params]
    assert "0.weight[0:64]" in names and "0.weight" not in names and "0.bias" in names
    streamed = [i for i in range(len(names)) if plan.residency[i].streams]
    assert read[CHUNK] == sum(plan.cost.params[i].nbytes for i in streamed)
    # a weight with a chunk read from disk was written whole and left RAM
    params = dict(model.named_parameters())
    for i in streamed:
        whole = params[names[i].partition("[")[0]]
        assert holds_its_file(whole)
    text = compiled.explain()
    assert "0.weight[" in text and "8 large weights planned as 32 row chunks" in text


def test_chunked_weights_from_a_checkpoint_of_a_meta_model(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model, x = mlp(256, 8), torch.randn(16, 256)
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        empty = mlp(256, 8)
    budget = _host_budget(model)
    compiled = _compile(
        empty,
        x,
        tmp_path,
        checkpoint=str(tmp_path / "model.safetensors"),
        budgets={"cpu": budget},
        stream_chunk_bytes=CHUNK,
    )
    plan = compiled.graphs[0].plan
    assert any("[" in p.fqn for p in plan.cost.params)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x))
    assert compiled.disk_bytes_read() > 0
    # the chunks kept in RAM were read once from the checkpoint, within the budget
    held = compiled.graphs[0].runtime.resident_bytes("cpu")
    assert 0 < held <= budget
    assert not (tmp_path / "offload").exists()  # nothing written: the checkpoint is read


def test_chunked_weights_feed_a_virtual_accelerator(tmp_path: Path) -> None:
    model, x = mlp(256, 6), torch.randn(32, 256)
    with torch.no_grad():
        expected = model(x)
    size = param_bytes(model)
    compiled = _compile(
        model,
        x,
        tmp_path,
        budgets={"cpu": size // 3, "virtual:0": size // 2},
        virtual_devices=FAST_VIRTUAL,
        devices=["virtual:0"],
        stream_chunk_bytes=CHUNK,
    )
    plan = compiled.graphs[0].plan
    assert any("[" in p.fqn for p in plan.cost.params)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), expected)
    assert compiled.disk_bytes_read() > 0
    assert 0 < compiled.measured_peaks()["virtual:0"] <= size // 2


def test_a_plan_with_chunked_weights_is_saved_and_reproduced(tmp_path: Path) -> None:
    x = torch.randn(16, 256)
    options = {"budgets": {"cpu": _host_budget(mlp(256, 8))}, "stream_chunk_bytes": "64KiB"}
    compiled = _compile(mlp(256, 8), x, tmp_path, **options)
    path = tmp_path / "plan.json"
    compiled.save(path)
    residency = json.loads(path.read_text())["graphs"][0]["residency"]
    assert "0.weight[0:64]" in residency
    hashes = compiled.plan_hashes()
    torch._dynamo.reset()
    model = mlp(256, 8)
    with torch.no_grad():
        expected = model(x)
    reloaded = tt.load(path, model, example_inputs=(x,))  # a changed plan would raise
    assert reloaded.plan_hashes() == hashes
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), expected)


def test_a_model_of_several_graphs_fits_the_host_budget_as_a_whole(tmp_path: Path) -> None:
    from tests.models import TwoBreaks

    model, x = TwoBreaks(256, depth=4), torch.randn(16, 256)
    with torch.no_grad():
        expected = model(x)
    per_graph = param_bytes(model.a)
    budget = per_graph * 3 // 2  # one graph's weights fit in RAM, not two
    compiled = _compile(model, x, tmp_path, budgets={"cpu": budget})
    graphs = compiled.graphs
    assert len(graphs) == 3
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), expected)
    # the first graph keeps its weights in RAM; the others plan with what it leaves
    assert not any(r.on_disk for r in graphs[0].plan.residency)
    assert all(any(r.on_disk for r in g.plan.residency) for g in graphs[1:])
    in_ram = sum(
        p.nbytes
        for g in graphs
        for i, p in enumerate(g.plan.cost.params)
        if not g.plan.residency[i].on_disk
    )
    held = in_ram + graphs[0].runtime.resident_bytes("cpu")
    assert held <= budget, f"{held} bytes held in RAM over a {budget} budget"


_FORKED_RUN = """
import multiprocessing, sys, tempfile, torch
import tensortorrent as tt
from tests.models import mlp, param_bytes

def work(x):
    torch.set_num_threads(1)  # OpenMP's threads are not forked: a parallel op would hang
    with torch.no_grad():
        return compiled(x), compiled.disk_bytes_read()

model, x = mlp(512, 8), torch.randn(4, 512)
with torch.no_grad():
    expected = model(x)
compiled = tt.compile(
    model, (x,), budgets={"cpu": param_bytes(model) // 3}, offload_dir=sys.argv[1],
    compiler="eager", io_timeout_s=20,
)
with torch.no_grad():
    compiled(x)
with multiprocessing.get_context("fork").Pool(1) as pool:
    got, read = pool.apply_async(work, (x,)).get(timeout=60)
torch.testing.assert_close(got, expected)
assert read > 2**20, read  # whole weights of 1 MiB, on the reader's threads
got, read = work(x)  # and the parent's threads still read
torch.testing.assert_close(got, expected)
assert read > 2**20, read
print("ok")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method")
def test_a_forked_worker_reads_the_weights_on_threads_of_its_own(tmp_path: Path) -> None:
    """A model compiled, then used in a ``multiprocessing`` worker forked from the process
    (how a pool starts on Linux): the worker reads the weights on disk on reader threads
    of its own, the parent's not being there; it used to wait for them until the read's
    timeout."""
    _run_ok(_FORKED_RUN, str(tmp_path / "offload"))


def _run_ok(script: str, *args: str) -> None:
    """Run ``script`` in a fresh Python process from the repository; it prints "ok" last."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.split()[-1:] == ["ok"], done.stderr[-3000:]


_OTHER_PROCESS_COMPILES = """
import sys
import torch
import tensortorrent as tt
from tests.models import mlp, param_bytes

model, x = mlp(256, 8, seed=int(sys.argv[2])), torch.randn(16, 256)
with torch.no_grad():
    expected = model(x)
compiled = tt.compile(
    model, (x,), offload_dir=sys.argv[1], compiler="eager",
    budgets={"cpu": param_bytes(model) // 2},
)
with torch.no_grad():
    torch.testing.assert_close(compiled(x), expected)
print("ok")
"""


def test_models_of_one_architecture_share_an_offload_dir_without_losing_weights(
    tmp_path: Path,
) -> None:
    """Two models of the same layers and shapes but other weights (a base model and its
    fine-tune), compiled into one offload directory (the default one is shared by every
    model), here and in another process: each keeps its own weights on disk. They used to
    share one store keyed by names and shapes, the second's writing replaced the first's
    shards, and the first, whose RAM was released to them, failed (its only copy gone)."""
    first, x = mlp(256, 8, seed=1), torch.randn(16, 256)
    second = mlp(256, 8, seed=2)
    with torch.no_grad():
        expected = first(x), second(x)
    budget = {"cpu": _host_budget(first)}
    compiled = [_compile(m, x, tmp_path, budgets=budget) for m in (first, second)]
    with torch.no_grad():
        for _ in range(2):
            for model, want in zip(compiled, expected, strict=True):
                torch.testing.assert_close(model(x), want)
                assert model.disk_bytes_read() > 0
    _compile_in_another_process(tmp_path / "offload", seed=3)
    with torch.no_grad():
        for model, want in zip(compiled, expected, strict=True):
            torch.testing.assert_close(model(x), want)
    assert len(list((tmp_path / "offload").iterdir())) == 3, "each model's weights apart"


def _compile_in_another_process(offload: Path, seed: int) -> None:
    _run_ok(_OTHER_PROCESS_COMPILES, str(offload), str(seed))


def test_weights_no_process_uses_are_deleted_when_their_model_changes(tmp_path: Path) -> None:
    """The same model compiled again reuses its store; once its weights change (a new
    fine-tune of one architecture), the store of the old ones, which no process holds any
    more, is deleted, so the offload directory does not grow with every version."""
    offload = tmp_path / "offload"
    _compile_in_another_process(offload, seed=1)
    (first,) = offload.iterdir()
    shards = sorted(first.glob("*.safetensors"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    _compile_in_another_process(offload, seed=1)
    assert list(offload.iterdir()) == [first]
    assert [p.stat().st_mtime_ns for p in sorted(first.glob("*.safetensors"))] == stamps
    _compile_in_another_process(offload, seed=2)
    (second,) = offload.iterdir()
    assert second != first and list(second.glob("*.safetensors"))
