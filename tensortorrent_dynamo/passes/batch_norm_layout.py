"""The pass that gives a batch norm's output the layout the graph was traced with.

Over an input that is neither contiguous nor channels-last (a transposed sequence, as
PatchTST normalizes its patches), torch's CPU batch norm returns a contiguous output where
its meta function, which traced the graph, keeps the input's strides
(pytorch/pytorch#192668). The graph's later ops were traced against those strides: a
``view`` that the traced layout allows fails at run time on the real one ("view size is not
compatible with input tensor's size and stride"; plain ``torch.compile`` with
``backend="aot_eager"`` fails the same way), and a layout read anywhere else would be
wrong. After each such batch norm the pass copies its output into a tensor laid out like
its input (``empty_like`` keeps a dense input's strides), so that what runs is what was
traced, eager or compiled. Inputs that are contiguous or channels-last, where the kernel
and its meta function agree, are left as they are.

Run on the functional graph before costing: the copy is costed and placed like any op.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from .logged import dump

aten = torch.ops.aten

# the batch norms of a functional graph whose first output is the normalized input
BATCH_NORMS = frozenset(
    {
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit_functional.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten.native_batch_norm.default,
    }
)


def _kernels_agree(value: object) -> bool:
    """Whether the batch norm's kernel lays its output out as its meta function does for
    an input like ``value`` (contiguous, or channels-last where that exists)."""
    if not isinstance(value, torch.Tensor):
        return True
    if value.is_contiguous():
        return True
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return value.dim() in formats and value.is_contiguous(memory_format=formats[value.dim()])


class BatchNormLayout(PassBase):
    """The pass (see the module's docstring)."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        # each normalized output not yet laid out (its only reader this pass's copy), and
        # the batch norm's input
        outputs = [
            (out, n.args[0])
            for n in graph.nodes
            if n.op == "call_function"
            and n.target in BATCH_NORMS
            and not _kernels_agree(n.args[0].meta.get("val"))
            for out in n.users
            if out.target is operator.getitem
            and out.args[1] == 0
            and not all(u.target is aten.copy.default for u in out.users)
        ]
        if not outputs:
            return PassResult(graph_module, False)
        dump("batch_norm_layout", "before", graph_module)
        for out, source in outputs:
            with graph.inserting_after(out):
                like = graph.call_function(aten.empty_like.default, (source,))
            with graph.inserting_after(like):
                laid = graph.call_function(aten.copy.default, (like, out))
            like.meta = dict(out.meta)
            laid.meta = dict(out.meta)
            out.replace_all_uses_with(laid, delete_user_cb=lambda user, laid=laid: user is not laid)
        graph.lint()
        graph_module.recompile()
        dump("batch_norm_layout", "after", graph_module)
        return PassResult(graph_module, True)
