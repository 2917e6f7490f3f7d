from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from tensortorrent_dynamo.errors import VirtualDeviceOutOfMemory
from tensortorrent_dynamo.run.ops import reload, spill, wait
from tensortorrent_dynamo.run.record import Recorder
from tensortorrent_dynamo.run.runtime import Runtime
from tensortorrent_dynamo.run.virtual import VirtualDevice, VirtualEngine


def test_ledger_follows_tensor_lifetimes() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    a = dev.copy_in(torch.ones(100), "a")  # 400 bytes
    view = a[:10]
    dev.adopt(view, "view")  # same storage: no new bytes
    assert dev.ledger.live == 400
    b = dev.copy_in(torch.ones(200), "b")
    assert dev.ledger.live == 1200 and dev.ledger.peak == 1200
    del a
    gc.collect()
    assert dev.ledger.live == 1200, "the view still holds the storage"
    del view
    gc.collect()
    assert dev.ledger.live == 800
    del b
    gc.collect()
    assert dev.ledger.live == 0 and dev.ledger.peak == 1200


def test_copies_are_real_and_owned() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    src = torch.arange(10.0)
    copy = dev.copy_in(src, "x")
    assert copy.data_ptr() != src.data_ptr()
    assert dev.owns(copy) and not dev.owns(src)
    torch.testing.assert_close(copy, src)
    recorder = Recorder()
    handle = VirtualEngine(dev, recorder).prefetch(lambda: src, src, "y")
    torch.testing.assert_close(handle.result(), src)
    assert dev.owns(handle.result())
    (event,) = recorder.events
    assert (event.resource, event.label) == ("h2d virtual:0", "y")
    assert 0 <= event.start_s <= event.end_s


def test_outputs_of_ops_are_accounted_while_executing() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    x = dev.copy_in(torch.ones(100), "x")
    with dev.executing():
        y = x * 2
        z = y + 1
    assert dev.ledger.live == 1200
    del y, z
    gc.collect()
    assert dev.ledger.live == 400


def test_over_capacity_fails_like_an_oom() -> None:
    dev = VirtualDevice("virtual:0", capacity=1000)
    keep = dev.copy_in(torch.ones(200), "a")
    with pytest.raises(VirtualDeviceOutOfMemory, match="virtual:0"):
        dev.copy_in(torch.ones(200), "b")
    assert dev.ledger.live == 800 and keep.numel() == 200


def test_streamed_buffers_are_reused_not_reallocated() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    engine = VirtualEngine(dev, Recorder())
    first = engine.prefetch(lambda: torch.ones(100), torch.ones(100), "w")
    ptr = first.result().data_ptr()
    first.release()
    assert dev.ledger.live == 400, "an idle buffer stays on the device, in the pool"
    second = engine.prefetch(lambda: torch.zeros(10, 10), torch.zeros(10, 10), "w")
    assert second.result().data_ptr() == ptr and second.result().shape == (10, 10)
    torch.testing.assert_close(second.result(), torch.zeros(10, 10))
    assert dev.ledger.live == 400 and dev.ledger.peak == 400
    assert dev.in_use() == "400 B w", "a reused buffer is named for what it now holds"
    with pytest.raises(AssertionError, match="out of order"):
        second.release()
        second.result()


@pytest.mark.parametrize("modes", [("inference", "no_grad"), ("no_grad", "inference")])
def test_streamed_buffers_take_copies_under_inference_mode_and_after_it(
    modes: tuple[str, str],
) -> None:
    """A buffer the pool lends under ``torch.inference_mode()`` is written by the copy
    thread, which is outside inference mode, and again by a later call under
    ``torch.no_grad()`` (and the other way round): the pool's buffers are normal tensors."""
    contexts = {"inference": torch.inference_mode, "no_grad": torch.no_grad}
    dev = VirtualDevice("virtual:0", capacity=10_000)
    engine = VirtualEngine(dev, Recorder())
    for i, mode in enumerate(modes):
        with contexts[mode]():
            source = torch.full((10, 10), float(i))
            handle = engine.prefetch(lambda s=source: s, source, "w")
            got = handle.result()
            assert not got.is_inference()
            torch.testing.assert_close(got, source)
            del got
            handle.release()


def test_idle_buffers_are_dropped_before_running_out_of_memory() -> None:
    dev = VirtualDevice("virtual:0", capacity=1000)
    handle = VirtualEngine(dev, Recorder()).prefetch(lambda: torch.ones(200), torch.ones(200), "w")
    handle.release()
    assert dev.ledger.live == 800
    other = dev.copy_in(torch.ones(100), "x")  # needs 400: the idle 800 go first
    assert dev.ledger.live == 400 and other.numel() == 100


def test_the_peak_counts_bytes_in_use_not_idle_buffers() -> None:
    """A pooled buffer is held (the capacity counts it) but not in use: the peak, which a
    plan predicts, leaves it out, as a caching allocator's allocated bytes do."""
    dev = VirtualDevice("virtual:0", capacity=10_000)
    engine = VirtualEngine(dev, Recorder())
    first = engine.prefetch(lambda: torch.ones(200), torch.ones(200), "w")
    first.release()
    dev.ledger.reset_peak()
    assert (dev.ledger.live, dev.ledger.idle, dev.ledger.peak) == (800, 800, 0)
    x = dev.copy_in(torch.ones(100), "x")
    assert (dev.ledger.live, dev.ledger.peak) == (1200, 400)
    second = engine.prefetch(lambda: torch.ones(200), torch.ones(200), "w")  # the idle one
    second.result()
    assert (dev.ledger.live, dev.ledger.idle, dev.ledger.peak) == (1200, 0, 1200)
    second.release()
    del x
    assert dev.trim() == 1
    assert (dev.ledger.live, dev.ledger.idle, dev.ledger.peak) == (0, 0, 1200)


def test_an_idle_buffer_is_dropped_even_while_garbage_still_refers_to_the_landed_tensor() -> None:
    """A reference cycle that outlives the call (garbage a cyclic collection has not reached
    yet) refers to the tensor a streamed parameter landed in: once its buffer is back in the
    pool, the pool alone holds the memory, and dropping idle buffers frees it."""
    dev = VirtualDevice("virtual:0", capacity=1000)
    handle = VirtualEngine(dev, Recorder()).prefetch(lambda: torch.ones(200), torch.ones(200), "w")
    cycle: list[Any] = [handle.result()]
    cycle.append(cycle)
    handle.release()
    gc.disable()
    try:
        assert "idle buffer, last w" in dev.in_use()
        other = dev.copy_in(torch.ones(100), "x")  # needs 400: the idle 800 must go
        assert dev.ledger.live == 400 and other.numel() == 100
        assert cycle[0].numel() == 0, "the stale tensor no longer holds the buffer"
    finally:
        gc.enable()
        del cycle


def test_running_out_of_memory_names_what_is_in_use() -> None:
    dev = VirtualDevice("virtual:0", capacity=1000)
    keep = [dev.copy_in(torch.ones(150), "the big one"), dev.copy_in(torch.ones(50), "small")]
    with pytest.raises(VirtualDeviceOutOfMemory) as info:
        dev.copy_in(torch.ones(100), "x")
    assert str(info.value).endswith("In use: 600 B the big one; 200 B small"), str(info.value)
    assert len(keep) == 2


def test_a_spilled_value_leaves_the_device_and_comes_back() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    rt = Runtime({"virtual:0": dev})
    value = dev.copy_in(torch.arange(100.0), "value")  # 400 bytes
    handle = spill(rt, value, "value")
    dev.d2h.submit(lambda: None).result()  # its one copy thread is past the spill
    del value
    gc.collect()
    assert dev.ledger.live == 0, "once copied out, nothing holds the device's copy"
    back = wait(reload(rt, handle, "value", "virtual:0"))
    assert dev.owns(back) and dev.ledger.live == 400
    torch.testing.assert_close(back, torch.arange(100.0))
    kinds = [(e.resource, e.kind) for e in rt.recorder.events]
    assert kinds == [("d2h virtual:0", "spill"), ("h2d virtual:0", "reload")]
    del back
    gc.collect()
    assert dev.ledger.live == 0, "the runtime's handles do not hold the reloaded copy"


def test_an_activation_of_several_tensors_is_spilled_tensor_by_tensor() -> None:
    dev = VirtualDevice("virtual:0", capacity=10_000)
    rt = Runtime({"virtual:0": dev})
    pair = (dev.copy_in(torch.ones(10), "a"), dev.copy_in(torch.zeros(20), "b"))
    handles = spill(rt, pair, "pair")
    del pair
    back = wait(reload(rt, handles, "pair", "virtual:0"))
    assert isinstance(back, tuple) and all(dev.owns(t) for t in back)
    torch.testing.assert_close(back, (torch.ones(10), torch.zeros(20)))
