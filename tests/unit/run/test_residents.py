"""The copies of parameters kept on a device between calls: valid only while their
parameter is unchanged."""

from __future__ import annotations

import torch

from tensortorrent_dynamo.run.residents import ResidentCopies


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
