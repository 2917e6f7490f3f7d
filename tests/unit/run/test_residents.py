"""The copies of parameters kept on a device between calls: valid only while their
parameter is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tensortorrent_dynamo.io.safetensors import write_safetensors
from tensortorrent_dynamo.run.residents import ResidentCopies
from tensortorrent_dynamo.weights.released import release


def test_a_copy_is_of_its_parameter_as_it_was_when_copied() -> None:
    param = torch.nn.Parameter(torch.ones(4))
    copies = ResidentCopies()
    copies.put("w", param, "virtual:0", param.detach().clone())
    assert copies.get(param, "virtual:0") is not None
    assert copies.get(param, "virtual:1") is None

    with torch.no_grad():
        param.mul_(2)  # written in place: its version counter moved
    assert copies.get(param, "virtual:0") is None

    copies.put("w", param, "virtual:0", param.detach().clone())
    param.data = param.data * 2  # given other bytes: no version counter moves
    assert copies.get(param, "virtual:0") is None
    assert copies.copies() == [], "the stale copy is dropped, its memory free for a new one"


def test_new_bytes_at_the_old_address_are_not_taken_for_the_old() -> None:
    """The copy holds the storage it was made from, so no other bytes can be given that
    address while it is kept."""
    param = torch.nn.Parameter(torch.ones(1 << 16))
    copies = ResidentCopies()
    copies.put("w", param, "virtual:0", param.detach().clone())
    old = param.data_ptr()
    for _ in range(8):
        param.data = torch.empty(0)  # the old bytes let go: the allocator would reuse them
        param.data = torch.full((1 << 16,), 3.0)
        assert param.data_ptr() != old
        assert copies.get(param, "virtual:0") is None
        copies.put("w", param, "virtual:0", param.detach().clone())
        old = param.data_ptr()


def test_a_write_through_data_that_changes_the_weight_is_seen() -> None:
    """``p.data += delta`` (an adapter merged in place) moves no version counter and keeps
    the address: the sampled bytes tell it. Written over with its own values, the copy
    stays."""
    param = torch.nn.Parameter(torch.randn(64, 64))
    copies = ResidentCopies()
    copies.put("w", param, "virtual:0", param.detach().clone())
    param.data.mul_(1.0)
    assert copies.get(param, "virtual:0") is not None
    param.data += 0.5 * torch.randn(64, 64)
    assert param._version == 0
    assert copies.get(param, "virtual:0") is None
    # a small tensor is sampled whole
    bias = torch.nn.Parameter(torch.zeros(3))
    copies.put("b", bias, "virtual:0", bias.detach().clone())
    bias.data[2] = 1.0
    assert copies.get(bias, "virtual:0") is None


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="Linux's page map")
def test_a_copy_of_a_released_weight_is_dropped_when_its_mapping_is_written(
    tmp_path: Path,
) -> None:
    """A weight released to disk and kept on a device: a write through ``.data`` copies
    the pages of its file's mapping, which the page map shows."""
    weight = torch.randn(1024, 64)
    (location,) = write_safetensors(tmp_path / "w.safetensors", {"w": weight.clone()}).values()
    release(weight, location)
    copies = ResidentCopies()
    copies.put("w", weight, "virtual:0", weight.detach().clone())
    assert copies.get(weight, "virtual:0") is not None
    weight.data.mul_(1.0)  # pages copied, bytes as they were
    assert copies.get(weight, "virtual:0") is not None
    weight.data += 1.0
    assert copies.get(weight, "virtual:0") is None


def test_an_inference_tensor_has_no_version_counter_and_is_sampled() -> None:
    """A weight built under ``torch.inference_mode()`` has no version counter: a write in
    place (possible under inference mode only) is told by the sampled bytes alone."""
    with torch.inference_mode():
        param = torch.randn(64, 64)
    copies = ResidentCopies()
    copies.put("w", param, "virtual:0", param.clone())
    assert copies.get(param, "virtual:0") is not None
    with torch.inference_mode():
        param.mul_(2.0)
    assert copies.get(param, "virtual:0") is None
