"""Small models the tests run: an MLP, a transformer block, a model with two graph breaks."""

from __future__ import annotations

import torch
from torch import nn


def mlp(width: int = 64, depth: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).eval()


class TransformerBlock(nn.Module):
    """Pre-norm attention + MLP block, written out so every op is visible to Dynamo."""

    def __init__(self, dim: int = 64, heads: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TwoBreaks(nn.Module):
    """Three graphs under Dynamo: two explicit graph breaks between MLP stages."""

    def __init__(self, width: int = 64, depth: int = 2, seed: int = 0) -> None:
        super().__init__()
        self.a = mlp(width, depth, seed)
        self.b = mlp(width, depth, seed + 1)
        self.c = mlp(width, depth, seed + 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        torch._dynamo.graph_break()
        x = self.b(x)
        torch._dynamo.graph_break()
        return self.c(x)


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class LongSkip(nn.Module):
    """A skip connection around a stack of layers: the input, doubled (or, with
    ``from_first_layer``, the first layer's output), is added back after the last layer.
    The middle layer is four times as wide, so that the accelerator's peak is there,
    while the skip waits."""

    def __init__(
        self, width: int = 256, depth: int = 5, seed: int = 0, from_first_layer: bool = False
    ) -> None:
        super().__init__()
        torch.manual_seed(seed)
        widths = [width] * (depth + 1)
        widths[depth // 2] = 4 * width
        self.layers = nn.ModuleList(nn.Linear(widths[k], widths[k + 1]) for k in range(depth))
        self.from_first_layer = from_first_layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = list(self.layers)
        skip = torch.relu(layers.pop(0)(x)) if self.from_first_layer else x * 2
        h = skip
        for layer in layers:
            h = torch.relu(layer(h))
        return h + skip
