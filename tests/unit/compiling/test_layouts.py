"""One layout rule: every copy lands as ``landing`` lays it out, and segments are
compiled for the layout they receive."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from tensortorrent_dynamo.compiling.segments import fake_inputs
from tensortorrent_dynamo.run.copies import landing
from tensortorrent_dynamo.run.ops import transfer
from tensortorrent_dynamo.run.runtime import Runtime
from tensortorrent_dynamo.run.virtual import VirtualDevice


def _values() -> dict[str, torch.Tensor]:
    base = torch.randn(4, 6, 8)
    return {
        "slice": base[..., :3],  # a rotary half: not dense
        "transposed": base.transpose(1, 2),  # dense, permuted: kept so
        "expanded": torch.randn(1, 1, 8).expand(4, 6, 8),  # a stride-0 mask
        "contiguous": base,
    }


@pytest.mark.parametrize("kind", list(_values()))
def test_every_copy_lands_in_the_layout_of_landing(kind: str) -> None:
    value = _values()[kind]
    want = landing(value).stride()
    device = VirtualDevice("virtual:0", 1 << 20)
    runtime = Runtime({"virtual:0": device})
    on_device = runtime.move(value, "virtual:0", "activation")
    back = runtime.move(on_device, "cpu", "activation")
    pooled = device.take(value, "streamed")
    for copy in (on_device, back, pooled):
        assert copy.stride() == want
    torch.testing.assert_close(back, value)
    if kind == "expanded":
        assert 0 not in want, "a stride-0 tensor lands contiguous"
    if kind == "transposed":
        assert want == value.stride()


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_segment_is_compiled_for_the_layout_a_transfer_gives_it(device: str) -> None:
    # cuda:0 needs no GPU: the inputs are fake tensors
    mode = FakeTensorMode()
    values = _values()
    with mode:
        fakes = {k: mode.from_tensor(v) for k, v in values.items()}

    sub_graph = torch.fx.Graph()
    received = [sub_graph.placeholder(k) for k in fakes]
    sub_graph.output(tuple(received))
    sub = torch.fx.GraphModule(torch.nn.Module(), sub_graph)
    for node, fake in zip(received, fakes.values(), strict=True):
        node.meta["example_value"] = fake

    # the parent: "slice" and "transposed" arrive by transfer, the others as they are
    parent_graph = torch.fx.Graph()
    rt = parent_graph.placeholder("rt")
    args = []
    for name in fakes:
        x = parent_graph.placeholder(name)
        if name in ("slice", "transposed"):
            x = parent_graph.call_function(transfer, (rt, x, device))
        args.append(x)
    parent_graph.output(parent_graph.call_module("submod_0", tuple(args)))
    root = torch.nn.Module()
    root.submod_0 = sub
    parent = torch.fx.GraphModule(root, parent_graph)

    got = dict(zip(fakes, fake_inputs(parent, "submod_0", torch.device(device)), strict=True))
    assert all(g.device == torch.device(device) for g in got.values())
    assert got["slice"].stride() == landing(values["slice"]).stride()  # made contiguous
    assert got["slice"].stride() != values["slice"].stride()
    assert got["transposed"].stride() == values["transposed"].stride()  # dense: kept
    # not copies: as traced (made on the segment's device by an earlier segment)
    assert got["expanded"].stride() == values["expanded"].stride()
    assert got["contiguous"].stride() == values["contiguous"].stride()
    if device == "cpu":
        assert got["expanded"] is fakes["expanded"]
