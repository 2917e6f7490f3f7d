"""The ops the rewritten graph calls, and :class:`Segment`, the module each compiled
subgraph runs in.

The rewritten parent graph calls :func:`transfer`, :func:`resident`, :func:`state`,
:func:`prefetch`, :func:`wait`, :func:`evict`, :func:`spill`, :func:`landed` and
:func:`reload` on the
:class:`~.runtime.Runtime` it holds as ``self.tt_runtime``; ``print(gm.code)`` therefore
reads as the schedule.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.nn.modules import module as _nn_module
from torch.utils._pytree import tree_map

from .handles import PrefetchHandle
from .record import Recorder
from .runtime import Runtime
from .virtual import VirtualDevice


def transfer(rt: Runtime, value: Any, device: str) -> Any:
    """Copy every tensor in ``value`` to ``device`` (a no-op for tensors already there)."""

    def one(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and rt.owner(leaf) != device:
            return rt.move(leaf, device, "activation")
        return leaf

    return tree_map(one, value)


def resident(rt: Runtime, param: torch.Tensor, key: str, device: str) -> torch.Tensor:
    """The copy of ``param`` kept on ``device`` for the whole run."""
    return rt.resident_copy(key, param, device)


def state(rt: Runtime, tensor: torch.Tensor, name: str, device: str) -> torch.Tensor:
    """An input the graph writes in place (a KV cache buffer), held on ``device`` from now
    on, between calls too: no copy per call."""
    return rt.hold_state(tensor, name, device)


def prefetch(rt: Runtime, param: torch.Tensor, key: str, device: str) -> PrefetchHandle:
    """Start copying a streamed parameter to ``device``; returns at once."""
    return rt.prefetch(param, key, device)


def wait(handle: Any) -> Any:
    """The prefetched parameter (or reloaded activation), once its copy has landed; for
    a tuple or list of handles (an activation made of several tensors), each one's."""
    if isinstance(handle, PrefetchHandle):
        return handle.result()
    return tree_map(lambda h: h.result() if isinstance(h, PrefetchHandle) else h, handle)


def evict(handle: PrefetchHandle) -> None:
    """Hand a streamed parameter's buffer back for reuse after its last use."""
    handle.release()


def spill(rt: Runtime, value: Any, what: str) -> Any:
    """Start copying an activation (each tensor of it) to host memory, so its device can
    drop it."""
    return tree_map(lambda t: rt.spill(t, what) if isinstance(t, torch.Tensor) else t, value)


def landed(spilled: Any) -> None:
    """Wait until a spill (each tensor of it) has reached host memory, so that its device
    holds the value no longer: where the plan counts it gone, before the device goes on."""
    tree_map(lambda h: h.landed() if isinstance(h, PrefetchHandle) else h, spilled)


def reload(rt: Runtime, spilled: Any, what: str, device: str) -> Any:
    """Start copying a spilled activation (each tensor of it) back to ``device`` for its
    next use."""

    def one(h: Any) -> Any:
        return rt.reload(h, device, what) if isinstance(h, PrefetchHandle) else h

    return tree_map(one, spilled)


for _op in (state, prefetch, evict, landed):
    torch.fx.node.has_side_effect(_op)


@dataclasses.dataclass(frozen=True)
class DirectCall:
    """How a rewritten graph that only calls its one segment is called as that segment:
    the graph's arguments at ``order`` (``None``: all of them, in order), and the result
    wrapped in a 1-tuple when ``wrapped``."""

    segment: Segment
    order: tuple[int, ...] | None
    wrapped: bool

    def __call__(self, args: Sequence[Any]) -> Any:
        out = self.segment(*(args if self.order is None else [args[i] for i in self.order]))
        return (out,) if self.wrapped else out


def direct_segment(parent: torch.fx.GraphModule) -> DirectCall | None:
    """The one :class:`Segment` of a rewritten graph that only passes its inputs to that
    segment (any of them, in any order) and returns what it returns; ``None`` for any
    other schedule. Such a graph is called as its segment, without the parent module's
    own call."""
    placeholders: list[torch.fx.Node] = []
    calls: list[torch.fx.Node] = []
    output: torch.fx.Node | None = None
    for node in parent.graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node)
        elif node.op == "call_module":
            calls.append(node)
        elif node.op == "output":
            output = node
        elif node.op != "get_attr" or node.users:
            return None
    if len(calls) != 1 or output is None:
        return None
    (call,) = calls
    segment = getattr(parent, str(call.target))
    index = {node: i for i, node in enumerate(placeholders)}
    args = [a for a in call.args if isinstance(a, torch.fx.Node) and a in index]
    if not isinstance(segment, Segment) or call.kwargs or len(args) != len(call.args):
        return None
    order = tuple(index[a] for a in args)
    kept = None if order == tuple(range(len(placeholders))) else order
    (result,) = output.args
    if result is call:
        return DirectCall(segment, kept, wrapped=False)
    if isinstance(result, tuple) and len(result) == 1 and result[0] is call:
        return DirectCall(segment, kept, wrapped=True)
    return None


def global_hooks() -> bool:
    """Whether forward hooks for every module are registered
    (``torch.nn.modules.module.register_module_forward_hook`` and its pre-hook)."""
    return bool(_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks)


class Segment(torch.nn.Module):
    """One device's compiled subgraph, run inside that device's accounting."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        device: str,
        virtual: VirtualDevice | None,
        compiler: str,
        recorder: Recorder,
    ) -> None:
        super().__init__()
        self.fn = fn
        self.name = name
        self.device = device
        self.virtual = virtual
        self.compiler = compiler
        self.recorder = recorder
        # the uncompiled subgraph, and whether to run it instead of ``fn`` (when it was
        # measured faster)
        self.eager_fn: Callable[..., Any] = fn
        self.use_eager = False

    def __call__(self, *args: Any) -> Any:
        # nn.Module's call machinery costs microseconds a call: only a segment with hooks
        # (``verify`` records outputs with them) needs it
        if self._forward_hooks or self._forward_pre_hooks or global_hooks():
            return super().__call__(*args)
        return self.forward(*args)

    def forward(self, *args: Any) -> Any:
        start = self.recorder.now()
        fn = self.eager_fn if self.use_eager else self.fn
        try:
            if self.virtual is None:
                out = fn(*args)
            else:
                with self.virtual.executing():
                    out = fn(*args)
        except Exception as exc:
            if sys.version_info >= (3, 11):
                exc.add_note(f"in TensorTorrent segment {self.name} on {self.device}")
            raise
        self.recorder.add(f"compute {self.device}", "segment", self.name, start)
        return out
