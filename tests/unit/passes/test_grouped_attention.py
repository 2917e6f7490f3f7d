"""The grouped-attention pass: a decode step's attention over key/value heads repeated per
query head attends the unrepeated heads instead (no copy of the cache per head), with the
same result; any other attention is left as traced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tensortorrent_dynamo.functional import capture

aten = torch.ops.aten
ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Hugging Face's repeat of each key/value head for its query heads."""
    b, g, length, d = x.shape
    return x[:, :, None, :, :].expand(b, g, n_rep, length, d).reshape(b, g * n_rep, length, d)


class Attention(nn.Module):
    """Attention of ``heads`` query heads over ``groups`` key/value heads, repeated."""

    def __init__(self, heads: int = 4, groups: int = 2) -> None:
        super().__init__()
        self.n_rep = heads // groups

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        k, v = repeat_kv(k * 1.0, self.n_rep), repeat_kv(v * 1.0, self.n_rep)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _inputs(
    queries: int = 1, mask_heads: int = 1, batch: int = 2
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, queries, 4, 8, generator=g).transpose(1, 2)  # as a model makes it
    k, v = (torch.randn(batch, 2, 6, 8, generator=g) for _ in range(2))
    mask = torch.zeros(batch, mask_heads, queries, 6)
    mask[..., 4:] = float("-inf")  # positions not yet written, as in a static cache
    return q, k, v, mask


def _attention_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target == ATTENTION]


def _expands(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == aten.expand.default)


@pytest.mark.parametrize("mask", [True, False])
def test_one_query_attends_the_unrepeated_keys_and_values_with_the_same_result(
    mask: bool,
) -> None:
    q, k, v, m = _inputs()
    args = (q, k, v, m if mask else None)
    ((gm, inputs),) = capture(Attention(), *args)
    (call,) = _attention_calls(gm)
    key, value = (arg.meta["val"] for arg in call.args[1:3])
    assert key.shape == value.shape == (2, 2, 6, 8), "the key/value heads, not repeated"
    assert call.args[0].meta["val"].shape == (2, 2, 2, 8), "query heads as query positions"
    assert _expands(gm) == 0, "the repeats are gone"
    with torch.no_grad():
        expected = Attention()(*args)
        (got,) = gm(*inputs.values)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    "why, queries, mask_heads",
    [("several query positions (a prefill)", 3, 1), ("a mask per head", 1, 4)],
)
def test_other_attention_is_left_as_traced(why: str, queries: int, mask_heads: int) -> None:
    args = _inputs(queries=queries, mask_heads=mask_heads)
    ((gm, inputs),) = capture(Attention(), *args)
    (call,) = _attention_calls(gm)
    assert call.args[1].meta["val"].shape[1] == 4, why
    assert _expands(gm) == 2, why
    with torch.no_grad():
        expected = Attention()(*args)
        (got,) = gm(*inputs.values)
    torch.testing.assert_close(got, expected)
