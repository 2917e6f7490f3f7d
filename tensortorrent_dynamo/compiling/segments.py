"""Compile each segment's subgraph for its device: Inductor where it can run, else eager
(each ATen op called straight through the dispatcher: :mod:`.direct`).

Inductor is not always faster than eager (a few large matmuls gain nothing from fusion
and can lose to its layout choices), so when a graph is cheap to run, both versions are
timed on the example inputs and the faster one is kept (:func:`keep_faster`).
"""

from __future__ import annotations

import copy
import logging
import re
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from typing import Any, cast

import torch
import torch.fx
from torch._dispatch.python import no_python_dispatcher

from ..errors import TensorTorrentError, TensorTorrentWarning
from ..passes.rewrite import Rewritten
from ..run import ops
from ..run.copies import landing
from ..run.ops import Segment
from ..run.runtime import Runtime, torch_device
from ..settings import Settings
from .direct import direct_calls

log = logging.getLogger(__name__)


# the runtime ops whose value is a copy, in the layout of ``landing``
_COPIES = (ops.transfer, ops.wait, ops.resident)


def fake_inputs(parent: torch.fx.GraphModule, name: str, device: torch.device) -> list[Any]:
    """The example inputs segment ``name`` is compiled for: each as the segment receives
    it, on ``device`` (where it runs), with the layout of :func:`landing` where the value
    is a copy (a transfer, a prefetched or resident parameter, a reload), else the layout
    it was traced with."""
    sub = getattr(parent, name)
    call = next(n for n in parent.graph.nodes if n.op == "call_module" and n.target == name)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    fakes = []
    for placeholder, arg in zip(placeholders, call.args, strict=True):
        fake = placeholder.meta.get("example_value")
        copied = isinstance(arg, torch.fx.Node) and arg.op == "call_function"
        if isinstance(fake, torch.Tensor) and copied and arg.target in _COPIES:
            with fake.fake_mode:  # type: ignore[attr-defined]
                fake = landing(fake, device=device)
        elif isinstance(fake, torch.Tensor) and fake.device != device:
            # made by an earlier segment on ``device``, in the layout it was traced with
            with fake.fake_mode:  # type: ignore[attr-defined]
                fake = torch.empty_strided(
                    fake.size(), fake.stride(), dtype=fake.dtype, device=device
                )
        fakes.append(fake)
    return fakes


def _inductor(
    sub: torch.fx.GraphModule, fakes: list[Any], name: str, strict: bool
) -> Callable[..., Any] | None:
    # Inductor rewrites the graph it is given (a single output becomes a tuple): it gets
    # a copy, so that ``sub`` stays the eager version
    own = torch.fx.GraphModule(sub, copy.deepcopy(sub.graph))
    try:
        with torch.no_grad():
            compiled = _compile_functional(own, fakes)
            if compiled is None:
                from torch._inductor.compile_fx import compile_fx

                compiled = cast(Callable[..., Any], compile_fx(own, fakes))
    except Exception as exc:  # Inductor failures must not lose the run: fall back to eager
        if strict:
            raise TensorTorrentError(f"Inductor failed on segment {name}: {exc}") from exc
        warnings.warn(
            f"Inductor failed on segment {name} ({type(exc).__name__}: {exc}); running it eager",
            TensorTorrentWarning,
            stacklevel=2,
        )
        return None
    return compiled


def _compile_functional(gm: torch.fx.GraphModule, fakes: list[Any]) -> Callable[..., Any] | None:
    """``gm``, a segment of the functional graph, compiled by Inductor without a second
    AOTAutograd: decomposed as Inductor expects (``compile_fx`` would trace it through
    AOTAutograd again for that, whose per-call wrapper, 5-10 us a call, a graph already
    functional does not need), then given to Inductor's inner compiler. ``None`` where
    that does not apply (symbolic sizes among the inputs) or fails: ``compile_fx`` then."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    if not fakes or not all(isinstance(f, FakeTensor) for f in fakes):
        return None
    fake_mode = fakes[0].fake_mode
    try:
        with fake_mode, torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
            decomposed = make_fx(gm, decomposition_table=select_decomp_table())(*fakes)
            output = next(n for n in decomposed.graph.nodes if n.op == "output")
            single = not isinstance(output.args[0], (tuple, list))
            if single:
                output.args = ((output.args[0],),)
                decomposed.recompile()
            keep_output_strides(decomposed)
            inner = compile_fx_inner(decomposed, fakes)
    except Exception as exc:  # the usual path still may work
        log.debug("Inductor's inner compiler failed (%s: %s); compile_fx then", type(exc), exc)
        return None

    def call(*args: Any) -> Any:
        out = inner(list(args))
        return out[0] if single else tuple(out)

    return call


def keep_output_strides(gm: torch.fx.GraphModule) -> None:
    """Have Inductor return each output of ``gm`` in the layout it was traced with, as
    ``compile_fx`` has it for a graph's outputs (``compile_fx_inner`` alone does not): the
    next segment was compiled for that layout, and asserts it. Left free, Inductor may
    return a convolution's output channels-last (its layout optimization), and the next
    segment failed on its input's strides."""
    from torch._inductor.compile_fx import record_original_output_strides

    output = next(n for n in gm.graph.nodes if n.op == "output")
    returned = output.args[0]
    output.meta["user_visible_output_idxs"] = [
        i for i, value in enumerate(returned) if isinstance(value, torch.fx.Node)
    ]
    record_original_output_strides(gm)


def traced_layouts(gm: torch.fx.GraphModule) -> str:
    """The sizes and strides of ``gm``'s tensor inputs as traced, each symbol named by its
    first appearance (``s87`` and ``s15`` alike): what Inductor's segments assert of the
    inputs they get. Two recompiles of one graph that differ only there (a KV cache passed
    as a transposed view, then as a contiguous tensor) need segments of their own."""
    symbols: dict[str, str] = {}

    def canonical(match: re.Match[str]) -> str:
        return symbols.setdefault(match.group(), f"z{len(symbols)}")

    shapes = []
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if node.op == "placeholder" and isinstance(value, torch.Tensor):
            shapes.append(f"{tuple(value.shape)}{value.stride()}")
    return re.sub(r"\b[a-z]+[0-9]+\b", canonical, ";".join(shapes))


def compile_segments(rewritten: Rewritten, runtime: Runtime, settings: Settings) -> dict[str, str]:
    """Replace each segment submodule by its compiled form; returns segment -> compiler used."""
    parent = rewritten.module
    used: dict[str, str] = {}
    for name, device in rewritten.segments.items():
        sub = getattr(parent, name)
        virtual = runtime.virtual.get(device)
        fn: Callable[..., Any] | None = None
        if virtual is None and settings.compiler == "inductor":
            fakes = fake_inputs(parent, name, torch_device(device))
            fn = _inductor(sub, fakes, name, settings.strict)
        used[name] = "inductor" if fn is not None else "eager"
        log.debug("segment %s on %s: %s", name, device, used[name])
        eager = direct_calls(sub)
        segment = Segment(fn or eager, name, device, virtual, used[name], runtime.recorder)
        segment.eager_fn = eager
        setattr(parent, name, segment)
    return used


# A graph whose forward takes longer than this is not run again just to time it.
RACE_LIMIT_S = 0.5
# Each way runs at least this many times, alternating, and more while the race has taken
# less than RACE_TIME_S (up to RACE_MAX_RUNS): the best of many calls of a small graph
# tells apart what the best of five did not (eager 2.7% faster than Inductor on an MLP of
# 1.6 ms calls, both best-of-five 1.64 ms).
RACE_RUNS = 5
RACE_MAX_RUNS = 100
RACE_TIME_S = 0.25
# Inductor was asked for: eager replaces it only when faster by more than this fraction
# (closer timings are noise at compile time, and the choice would flip between runs).
RACE_MARGIN = 0.01


def copy_of(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` with its exact layout (strides, offset, even stride 0), which
    the compiled segments may assert: a copy of its whole storage, viewed the same way."""
    storage = tensor.untyped_storage().clone()  # type: ignore[no-untyped-call]
    copy = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return copy.set_(storage, tensor.storage_offset(), tensor.size(), tensor.stride())


def keep_faster(
    parent: torch.fx.GraphModule,
    used: dict[str, str],
    example_inputs: Sequence[Any],
    weights: Collection[int],
) -> str | None:
    """Time the graph with its Inductor segments and with them eager (the best of at least
    ``RACE_RUNS`` calls each, alternating, more while the race takes under
    ``RACE_TIME_S``) and keep Inductor unless eager is faster by more than
    ``RACE_MARGIN``; returns what was measured, or ``None`` when there was nothing to
    compare or one forward is too slow to repeat. ``weights``: the positions of the
    inputs the graph only reads (the plan's parameters), which it is timed with as they
    are; it gets a copy of every other one."""
    inductor = [getattr(parent, n) for n, c in used.items() if c == "inductor"]
    if not inductor:
        return None
    if not all(isinstance(a, torch.Tensor) for a in example_inputs):
        # after a dynamic-shape recompile some inputs are SymInts: nothing to time with
        return "Inductor kept: not timed (the graph has symbolic sizes)"
    # The graph may write to its inputs (a KV cache, BatchNorm's running statistics, a
    # parameter its forward updates in place): it is timed on copies of them, so that
    # compiling never changes the user's tensors. The weights it only reads are not copied
    # (that would double them in memory); a parameter it writes is not among them.
    inputs = [a if i in weights else copy_of(a) for i, a in enumerate(example_inputs)]

    # a CUDA segment returns before its kernels finish: the time is taken once they have
    cuda = sorted({s.device for s in inductor if torch_device(s.device).type == "cuda"})

    def timed(eager: bool) -> float:
        for segment in inductor:
            segment.use_eager = eager
        start = time.perf_counter()
        # as the calls run: the compile this runs in has the Python dispatcher on, which
        # costs each eager op 2.4x (not the Inductor code's fused kernels)
        with torch.no_grad(), no_python_dispatcher():
            parent(*inputs)
        for device in cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    if timed(False) > RACE_LIMIT_S:
        return None
    timed(True)  # warm-up of the eager version
    best = {False: float("inf"), True: float("inf")}
    runs, started = 0, time.perf_counter()
    while runs < RACE_RUNS or (
        runs < RACE_MAX_RUNS and time.perf_counter() - started < RACE_TIME_S
    ):
        for eager in (False, True):
            best[eager] = min(best[eager], timed(eager))
        runs += 1
    use_eager = best[True] < best[False] * (1 - RACE_MARGIN)
    for segment in inductor:
        segment.use_eager = use_eager
    if use_eager:
        for segment in inductor:
            used[segment.name] = "eager"
    faster, slower = ("eager", "Inductor") if use_eager else ("Inductor", "eager")
    note = (
        f"{faster} kept: {best[use_eager] * 1e3:.3g} ms against {slower} "
        f"{best[not use_eager] * 1e3:.3g} ms on the example inputs (best of {runs}; "
        f"eager must win by {RACE_MARGIN:.0%})"
    )
    log.debug("compiler choice: %s", note)
    return note
