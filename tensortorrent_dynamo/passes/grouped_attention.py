"""The pass that attends a single query per key/value head group instead of copying the keys
and values once per query head.

With grouped-query attention (fewer key/value heads than query heads) a model traced for
the backend repeats each key/value head for its query heads before attention (Hugging Face's
``repeat_kv``: ``unsqueeze``, ``expand``, ``clone``, ``_unsafe_view``). In a decode step
that is a copy of the whole KV cache, ``n_rep`` times over, per layer and per step: at
batch 16 more bytes than the step's matmuls read. Eager Hugging Face avoids it for one query
position (its ``pack_gqa``, skipped under compilation): the ``n_rep`` query heads of a group
become ``n_rep`` query positions against the group's own keys and values, which gives the
same attention when no causal mask applies (one query sees every key it is not masked from)
and the mask is the same for every head.

So where attention is ``_scaled_dot_product_flash_attention_for_cpu`` with one query
position, no causal flag, no dropout, a mask (if any) with one head and one query row, and
both keys and values are such repeats of ``n_rep``, the pass reshapes the query to
``[batch, kv_heads, n_rep, dim]``, attends the unrepeated keys and values, and reshapes the
output back. The repeats' copies then have no reader and are dropped. Run on the functional
graph before costing, so that the cost graph and the planner see the graph that runs.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from .logged import dump

aten = torch.ops.aten

_ATTENTION = aten._scaled_dot_product_flash_attention_for_cpu.default


def _value(node: Any) -> Any:
    return (
        node.meta.get("val", node.meta.get("example_value"))
        if isinstance(node, torch.fx.Node)
        else None
    )


def _static(*tensors: torch.Tensor) -> bool:
    """Whether every size of ``tensors`` is a plain int (the pass leaves symbolic shapes
    alone rather than guard on them)."""
    return all(isinstance(size, int) for t in tensors for size in t.shape)


def _unrepeated(node: Any) -> tuple[torch.fx.Node, int] | None:
    """``(kv, n_rep)`` where ``node`` is ``kv`` ``[b, g, l, d]`` with each head repeated
    ``n_rep`` times: ``_unsafe_view(clone(expand(unsqueeze(kv, 2), [b, g, n_rep, l, d])),
    [b, g * n_rep, l, d])``; else ``None``."""
    if not isinstance(node, torch.fx.Node) or node.target not in (
        aten._unsafe_view.default,
        aten.view.default,
    ):
        return None
    clone = node.args[0]
    if not isinstance(clone, torch.fx.Node) or clone.target != aten.clone.default:
        return None
    expand = clone.args[0]
    if not isinstance(expand, torch.fx.Node) or expand.target != aten.expand.default:
        return None
    unsqueeze = expand.args[0]
    if (
        not isinstance(unsqueeze, torch.fx.Node)
        or unsqueeze.target != aten.unsqueeze.default
        or unsqueeze.args[1] != 2
    ):
        return None
    kv = unsqueeze.args[0]
    source, repeated = _value(kv), _value(node)
    if not isinstance(source, torch.Tensor) or not isinstance(repeated, torch.Tensor):
        return None
    if source.dim() != 4 or repeated.dim() != 4 or not _static(source, repeated):
        return None
    b, g, length, d = source.shape
    heads = repeated.shape[1]
    if heads % g or tuple(repeated.shape) != (b, heads, length, d):
        return None
    sizes = expand.args[1]
    if not isinstance(sizes, (list, tuple)) or tuple(sizes) != (b, g, heads // g, length, d):
        return None
    assert isinstance(kv, torch.fx.Node)
    return kv, heads // g


def _add(graph: torch.fx.Graph, like: Any, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
    """A new node calling ``target``, its value computed on the fakes of its inputs."""
    node = graph.call_function(target, args, kwargs)
    fakes = torch.fx.node.map_arg((args, kwargs), _value)
    with like.fake_mode:
        node.meta["val"] = node.meta["example_value"] = target(*fakes[0], **fakes[1])
    return node


def _rewrite(graph: torch.fx.Graph, attention: torch.fx.Node) -> bool:
    """Attend one group's query heads as query positions at ``attention``, if it is such a
    decode step's attention; whether it was."""
    if attention.args[3:] not in ((), (0.0,), (0.0, False)):  # dropout, is_causal
        return False
    if set(attention.kwargs) - {"attn_mask", "scale"}:
        return False
    query, keys, values = attention.args[:3]
    q = _value(query)
    if not isinstance(q, FakeTensor) or q.dim() != 4 or not _static(q) or q.shape[2] != 1:
        return False
    k, v = _unrepeated(keys), _unrepeated(values)
    if k is None or v is None or k[1] != v[1]:
        return False
    mask = _value(attention.kwargs.get("attn_mask"))
    if mask is not None and (mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1):
        return False
    users = list(attention.users)
    # only the output is read (the log-sum-exp is not)
    if not users or any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return False
    expected = _value(users[0])
    (key_node, n_rep), value_node = k, v[0]
    b, heads, _, d = q.shape
    with graph.inserting_before(attention):
        contiguous = _add(
            graph, q, aten.clone.default, query, memory_format=torch.contiguous_format
        )
        packed = _add(graph, q, aten.view.default, contiguous, [b, heads // n_rep, n_rep, d])
        grouped = _add(graph, q, _ATTENTION, packed, key_node, value_node, **attention.kwargs)
        output = _add(graph, q, operator.getitem, grouped, 0)
        flat = _add(graph, q, aten.clone.default, output, memory_format=torch.contiguous_format)
        result = _add(graph, q, aten.view.default, flat, [b, heads, 1, d])
    got = result.meta["val"]
    if (
        got.shape != expected.shape
        or got.dtype != expected.dtype
        or not _same_strides(got, expected)
    ):
        for node in (result, flat, output, grouped, packed, contiguous):
            graph.erase_node(node)
        return False
    for user in users:
        user.replace_all_uses_with(result)
        graph.erase_node(user)
    graph.erase_node(attention)
    for repeated in dict.fromkeys((keys, values)):  # the repeats, now unread
        _erase_unread(graph, repeated)
    return True


def _erase_unread(graph: torch.fx.Graph, node: Any) -> None:
    """Erase ``node`` if nothing reads it, then each input of it that nothing reads any more
    (a repeat's chain: view, clone, expand, unsqueeze)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and not node.users:
        source = node.args[0]
        graph.erase_node(node)
        node = source


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal strides on every dimension longer than one (a size-1 dimension's stride is never
    read)."""
    return all(s == t for n, s, t in zip(a.shape, a.stride(), b.stride(), strict=True) if n != 1)


class GroupedAttention(PassBase):
    """The pass (see the module's docstring)."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        candidates = [n for n in graph.nodes if n.op == "call_function" and n.target == _ATTENTION]
        if not candidates:
            return PassResult(graph_module, False)
        dump("grouped_attention", "before", graph_module)
        changed = [n for n in candidates if _rewrite(graph, n)]
        if not changed:
            return PassResult(graph_module, False)
        graph.lint()
        graph_module.recompile()
        dump("grouped_attention", "after", graph_module)
        return PassResult(graph_module, True)
