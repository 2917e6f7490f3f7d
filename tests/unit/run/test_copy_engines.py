"""The copy engines: what each one copies, accounts and hands back."""

from __future__ import annotations

import gc

import pytest
import torch

from tensortorrent_dynamo.run.copies import CudaEngine, HostEngine, landing
from tensortorrent_dynamo.run.handles import PrefetchHandle
from tensortorrent_dynamo.run.record import Recorder
from tensortorrent_dynamo.run.runtime import Runtime
from tensortorrent_dynamo.run.virtual import VirtualDevice, VirtualEngine


def test_the_runtime_picks_one_engine_per_device() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    rt = Runtime({"virtual:0": dev})
    virtual, host, cuda = rt.engine("virtual:0"), rt.engine("cpu"), rt.engine("cuda:0")
    assert isinstance(virtual, VirtualEngine) and virtual.virtual is dev
    assert isinstance(host, HostEngine)
    assert isinstance(cuda, CudaEngine), "made without touching CUDA: streams come on first use"
    assert rt.engine("virtual:0") is virtual and rt.engine("cpu") is host
    assert all(e.recorder is rt.recorder for e in (virtual, host, cuda))


def test_a_virtual_copy_is_accounted_until_it_is_gone() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    engine = VirtualEngine(dev, Recorder())
    src = torch.arange(100.0)  # 400 bytes
    copy = engine.copy_in(src, "x", HostEngine("cpu", Recorder()))
    assert dev.owns(copy) and copy.data_ptr() != src.data_ptr()
    assert dev.ledger.live == 400
    torch.testing.assert_close(copy, src)
    back = engine.hand_to(copy, "cpu")
    assert back.data_ptr() != copy.data_ptr() and not dev.owns(back), "leaving it is a copy"
    del copy
    gc.collect()
    assert dev.ledger.live == 0 and dev.ledger.peak == 400
    torch.testing.assert_close(back, src)


def test_a_virtual_prefetch_lands_in_a_pooled_buffer_given_back_on_release() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    recorder = Recorder()
    engine = VirtualEngine(dev, recorder)
    src = torch.ones(10, 10)
    ran: list[str] = []
    handle = engine.prefetch(lambda: src, src, "w", after=lambda: ran.append("after"))
    got = handle.result()
    assert dev.owns(got) and got.stride() == landing(src).stride()
    torch.testing.assert_close(got, src)
    assert ran == ["after"], "after runs once the copy is done"
    handle.release()
    del got
    gc.collect()
    assert dev.ledger.live == 400, "the buffer is idle in the pool, still on the device"
    assert dev.trim() == 1 and dev.ledger.live == 0
    assert [(e.resource, e.kind, e.label) for e in recorder.events] == [
        ("h2d virtual:0", "prefetch", "w")
    ]


def test_a_transposed_buffer_goes_back_to_the_pool_and_is_reused() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    engine = VirtualEngine(dev, Recorder())
    src = torch.arange(12.0).reshape(3, 4).t()  # dense, column-major
    handle = engine.prefetch(lambda: src, src, "w")
    got = handle.result()
    assert got.stride() == src.stride()
    torch.testing.assert_close(got, src)
    pointer = got.data_ptr()
    handle.release()
    del got
    gc.collect()
    assert dev.ledger.live == 48, "idle in the pool"
    again = engine.prefetch(lambda: src, src, "w")
    assert again.result().data_ptr() == pointer and dev.ledger.live == 48
    torch.testing.assert_close(again.result(), src)


def test_a_virtual_spill_leaves_the_device_and_its_reload_is_a_fresh_copy() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    recorder = Recorder()
    engine = VirtualEngine(dev, recorder)
    value = dev.copy_in(torch.arange(10.0), "value")
    made_at = value.data_ptr()
    spilled = engine.spill(value, "value")
    reloading = engine.reload(spilled, "value")
    assert spilled.copies and reloading.copies
    del value
    reloaded = reloading.result()
    gc.collect()
    assert dev.owns(reloaded) and reloaded.data_ptr() != made_at
    assert dev.ledger.live == 40  # the spilled value is gone, its reload is here
    torch.testing.assert_close(reloaded, torch.arange(10.0))
    assert [(e.resource, e.kind) for e in recorder.events] == [
        ("d2h virtual:0", "spill"),
        ("h2d virtual:0", "reload"),
    ]
    # the runtime holds its handles to the end of a call: they must not hold the copies
    del reloaded
    gc.collect()
    assert dev.ledger.live == 0
    with pytest.raises(AssertionError, match="read once"):
        reloading.result()


def test_the_host_copies_nothing_already_in_host_memory() -> None:
    recorder = Recorder()
    engine = HostEngine("cpu", recorder)
    x = torch.randn(3, 4)
    assert engine.copy_in(x, "x", engine) is x
    spilled = engine.spill(x, "x")
    assert spilled.result() is x and not spilled.copies
    assert engine.reload(spilled, "x") is spilled
    given: list[str] = []
    handle = engine.prefetch(lambda: x, x, "w", after=lambda: given.append("back"))
    assert handle.result() is x
    assert not given, "the host computes from the read buffer: it goes back on release"
    handle.release()
    assert given == ["back"]
    assert not recorder.events


def test_leaving_a_virtual_device_for_the_host_is_a_copy_accounted_nowhere() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    rt = Runtime({"virtual:0": dev})
    on_device = rt.move(torch.ones(10), "virtual:0", "x")
    back = rt.move(on_device, "cpu", "x")
    assert back.data_ptr() != on_device.data_ptr() and not dev.owns(back)
    assert dev.ledger.live == 40
    assert [e.resource for e in rt.recorder.events] == [
        "copy cpu->virtual:0",
        "copy virtual:0->cpu",
    ]


def test_a_copy_between_virtual_devices_is_accounted_on_the_destination() -> None:
    a, b = VirtualDevice("virtual:0", 10_000), VirtualDevice("virtual:1", 10_000)
    rt = Runtime({"virtual:0": a, "virtual:1": b})
    x = rt.move(torch.ones(10), "virtual:0", "x")
    y = rt.move(x, "virtual:1", "x")
    assert b.owns(y) and not a.owns(y) and a.ledger.live == b.ledger.live == 40


def test_only_handles_with_a_copy_behind_them_are_tracked() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    rt = Runtime({"virtual:0": dev})
    on_host = rt.spill(torch.ones(4), "host value")
    assert rt.reload(on_host, "cpu", "host value") is on_host
    assert not rt._handles
    spilled = rt.spill(dev.copy_in(torch.ones(4), "v"), "v")
    reloaded = rt.reload(spilled, "virtual:0", "v")
    streamed = rt.prefetch(torch.ones(4), "w", "virtual:0")
    assert rt._handles == [spilled, reloaded, streamed]
    back = reloaded.result()
    assert isinstance(back, torch.Tensor) and dev.owns(back)
    streamed.release()


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_a_cuda_prefetch_lands_on_the_device_and_after_runs_once_copied() -> None:
    recorder = Recorder()
    engine = CudaEngine("cuda:0", recorder)
    src = torch.randn(64, 32).pin_memory()
    given: list[str] = []
    handle = engine.prefetch(lambda: src, src, "w", after=lambda: given.append("back"))
    got = handle.result()
    assert got.device == torch.device("cuda:0")
    torch.testing.assert_close(got.cpu(), src)
    assert given == ["back"]
    assert [(e.resource, e.kind) for e in recorder.events] == [("h2d cuda:0", "prefetch")]
    plain = engine.prefetch(lambda: src, src, "w2").result()
    torch.testing.assert_close(plain.cpu(), src)
    assert len(recorder.events) == 1, "a prefetch from host RAM records no span"


@cuda
def test_a_cuda_spill_lands_in_pinned_host_memory_and_reloads() -> None:
    recorder = Recorder()
    rt = Runtime({})
    engine = CudaEngine("cuda:0", recorder)
    value = torch.randn(16, 8, device="cuda:0").t()
    spilled = engine.spill(value, "v")
    host = spilled.result()
    assert host.device.type == "cpu" and host.is_pinned()
    assert host.stride() == value.stride()
    torch.testing.assert_close(host, value.cpu())
    back = engine.reload(spilled, "v").result()
    assert back.device == torch.device("cuda:0")
    torch.testing.assert_close(back, value)
    assert [(e.resource, e.kind) for e in recorder.events] == [("d2h cuda:0", "spill")]
    assert isinstance(rt.engine("cuda:0"), CudaEngine)
    assert isinstance(rt.spill(value, "v"), PrefetchHandle) and len(rt._handles) == 1
