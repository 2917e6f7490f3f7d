"""Counting the FLOPs of ops as they run, on fake or real tensors, with torch's formulas.

``torch.utils.flop_counter.FlopCounterMode`` also tracks which module each op runs in:
while it is entered, it registers *global* module hooks, which every thread's module
calls then run. A plan can be made while other threads run the model (a call that falls
in a new range of sizes plans at call time, a first call compiles while another model
runs): another thread's module, called under Dynamo, then traces those hooks and fails
(``UnspecializedNNModuleVariable ... is already tracked for mutation``). :class:`FlopCount`
counts the same FLOPs, with the same formulas (``flop_registry``), and touches nothing
outside the thread it runs in.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class FlopCount(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """FLOPs of the ops run under it (``total``), as ``FlopCounterMode`` counts them: an op
    torch has a formula for is counted by it; an op without one is counted as the ops it
    decomposes into, or as none. A higher-order op is counted only by a formula of its own
    (``flex_attention``); any other raises, as ``FlopCounterMode`` does."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.total = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            formula = flop_registry.get(func)
            if formula is None:
                return NotImplemented
        else:
            formula = flop_registry.get(func._overloadpacket)
            if formula is None and func is not torch.ops.prim.device.default:
                with self:  # count the ops it decomposes into
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        out = func(*args, **kwargs)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out
