"""From Dynamo's graph to the functional ATen graph that is planned (AOTAutograd).

Dynamo's graph is Python-level: it writes in place (a KV cache's ``index_copy_``,
BatchNorm's running statistics), takes views, and calls composite ops. Partitioned
across devices, an in-place write on one device lands on a copy and is lost. So the
backend plans the graph ``aot_module_simplified`` gives instead, as Inductor does: ATen
ops, functional (views and in-place ops on intermediates are gone), and each mutated
graph input returned as an output whose value AOTAutograd's runtime wrapper copies back
into the one real tensor after the call. Nothing is written on a stray copy.

The functional graph takes the same inputs as Dynamo's, in the same order (with the
module's own parameters and buffers first, where Dynamo did not lift them, and each tensor
subclass, a quantized weight, taken apart into the plain tensors it holds), so each of
its inputs is matched to the real tensor Dynamo passed: :class:`GraphInputs`.
A parameter or buffer the graph mutates is not a parameter to the planner (a resident
copy of it would go stale): it is a graph input like an activation.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from .cost_graph import dynamo_params
from .errors import TensorTorrentWarning, UnsupportedNodeError
from .passes.batch_norm_layout import BatchNormLayout
from .passes.grouped_attention import GroupedAttention
from .passes.param_views import OneReaderPerParamView

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GraphInputs:
    """What the functional graph's inputs are, position by position.

    Attributes:
        values: the real tensors (and sizes) Dynamo passed, in the functional graph's
            order.
        params: position -> fqn of each parameter or buffer the graph only reads: what
            the planner may keep resident, stream or leave on disk.
        mutated: fqns of the parameters and buffers the graph writes (their new values
            are the graph's first outputs).
        state: (placeholder name, output index, source) of every input whose data the
            graph writes (a static KV cache's buffers; the parameters and buffers in
            ``mutated``): the output that is its new value and what the caller calls it
            (``L['past_key_values'].layers[0].keys``). The planner decides where each
            lives between calls.
    """

    values: tuple[Any, ...]
    params: Mapping[int, str]
    mutated: tuple[str, ...] = ()
    state: tuple[tuple[str, int, str], ...] = ()


Compile = Callable[[torch.fx.GraphModule, GraphInputs], Callable[..., Any]]


def _source(node: torch.fx.Node) -> str:
    """The expression Dynamo read a placeholder's value from, else its name."""
    arg = node.meta.get("grapharg")
    source = getattr(arg, "source", None)
    if source is None:
        return node.name
    name = source.name  # a method in older torch, a property in newer
    return str(name() if callable(name) else name)


@dataclasses.dataclass(frozen=True)
class _Flat:
    """Dynamo's inputs as the functional graph takes them: a tensor subclass (a quantized
    weight: ``torchao``'s, say) taken apart into the plain tensors it holds, as AOTAutograd
    takes it apart (``__tensor_flatten__``, depth first), each part of a parameter a
    parameter of its own, named ``<fqn>.<attribute>``. AOTAutograd's metadata (which inputs
    are written) then counts these positions."""

    values: Sequence[Any]  # ``values`` itself when no input is a subclass
    params: dict[int, str]  # position -> fqn of each parameter or buffer (part)
    owners: Sequence[int]  # position -> the index of the Dynamo input it is (part of)
    parts: set[int]  # the positions that are parts of a subclass


def _flattened(values: Sequence[Any], names: Mapping[int, str]) -> _Flat:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not any(is_traceable_wrapper_subclass(v) for v in values):
        return _Flat(values, dict(names), range(len(values)), set())
    flat: list[Any] = []
    params: dict[int, str] = {}
    owners: list[int] = []
    parts: set[int] = set()

    def add(value: Any, owner: int, name: str | None, part: bool) -> None:
        if not is_traceable_wrapper_subclass(value):
            if name is not None:
                params[len(flat)] = name
            if part:
                parts.add(len(flat))
            owners.append(owner)
            flat.append(value)
            return
        attrs, _ = value.__tensor_flatten__()
        for attr in attrs:
            add(getattr(value, attr), owner, None if name is None else f"{name}.{attr}", True)

    for i, value in enumerate(values):
        add(value, i, names.get(i), False)
    return _Flat(flat, params, owners, parts)


def _same_meta(fake: Any, real: Any) -> bool:
    """Whether a functional graph's input and the real value matched to it agree (shape and
    dtype of a tensor; a size passes)."""
    if not isinstance(fake, torch.Tensor):
        return not isinstance(real, torch.Tensor)
    return (
        isinstance(real, torch.Tensor)
        and fake.dtype == real.dtype
        and len(fake.shape) == len(real.shape)
        and all(
            not isinstance(f, int) or f == r for f, r in zip(fake.shape, real.shape, strict=True)
        )
    )


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


def _no_backward(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
    raise UnsupportedNodeError(
        "TensorTorrent runs inference only; call the model under torch.no_grad() "
        "or torch.inference_mode()"
    )


def functional(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], compile_graph: Compile
) -> Callable[..., Any]:
    """The callable Dynamo runs for ``gm``: its functional graph, compiled by
    ``compile_graph`` (given the graph and :class:`GraphInputs`), behind AOTAutograd's
    runtime wrapper (which writes mutated inputs back)."""
    from torch._functorch._aot_autograd.utils import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    lifted = [
        *gm.named_parameters(remove_duplicate=False),
        *gm.named_buffers(remove_duplicate=False),
    ]
    values = [t for _, t in lifted] + list(example_inputs)
    names: dict[int, str] = {i: name for i, (name, _) in enumerate(lifted)}
    names.update({len(lifted) + i: fqn for i, fqn in dynamo_params(gm).items()})
    # what the user calls each input (``L['past_key_values'].layers[0].keys``), for reports
    sources = [name for name, _ in lifted] + [
        _source(n) for n in gm.graph.nodes if n.op == "placeholder"
    ]

    def fw_compiler(aten: torch.fx.GraphModule, fakes: Sequence[Any]) -> Any:
        context = torch._guards.TracingContext.try_get()
        metadata = context.fw_metadata if context is not None else None
        written: set[int] = set()
        # the inputs whose new values are outputs, in the order of those outputs
        state: list[tuple[int, int]] = []  # (input, output)
        if metadata is not None:
            written = {
                i
                for i, info in enumerate(metadata.input_info)
                if info.mutates_data or info.mutates_metadata
            }
            # AOTAutograd returns the new value of each of these as output k
            runtime = list(getattr(metadata, "mutated_inp_runtime_indices", ()))
            state = [(i, k) for k, i in enumerate(runtime) if metadata.input_info[i].mutates_data]
        flat = _flattened(values, names)
        owners = flat.owners
        if len(fakes) != len(flat.values):
            raise UnsupportedNodeError(
                f"the functional graph takes {len(fakes)} inputs where Dynamo's graph takes "
                f"{len(values)} ({len(flat.values)} with tensor subclasses taken apart): "
                "AOTAutograd merged duplicated or aliased inputs, and TensorTorrent cannot "
                "match them to the model's tensors"
            )
        for i, (fake, real) in enumerate(zip(fakes, flat.values, strict=True)):
            if not _same_meta(fake, real):
                raise UnsupportedNodeError(
                    f"input {i} of the functional graph ({sources[owners[i]]}) is "
                    f"{_described(fake)} where the value matched to it is {_described(real)}: "
                    "TensorTorrent cannot match the graph's inputs to the model's tensors"
                )
        if written & flat.parts:
            raise UnsupportedNodeError(
                "the graph writes an input that is a tensor subclass (a quantized weight or "
                "the like): TensorTorrent plans tensor subclasses only as inputs the graph "
                "reads"
            )
        placeholders = [n.name for n in aten.graph.nodes if n.op == "placeholder"]
        for node in aten.graph.nodes:  # the key the passes read, as in Dynamo's graphs
            if "val" in node.meta:
                node.meta.setdefault("example_value", node.meta["val"])
        inputs = GraphInputs(
            values=tuple(flat.values),
            params={i: fqn for i, fqn in flat.params.items() if i not in written},
            mutated=tuple(names[owners[i]] for i in sorted(written) if owners[i] in names),
            state=tuple((placeholders[i], k, sources[owners[i]]) for i, k in state),
        )
        if inputs.mutated:
            log.info(
                "the graph writes %d of its parameters and buffers (%s): they are inputs "
                "it returns, written back after each call",
                len(inputs.mutated),
                ", ".join(inputs.mutated[:4]) + (", ..." if len(inputs.mutated) > 4 else ""),
            )
        BatchNormLayout()(aten)
        GroupedAttention()(aten)
        OneReaderPerParamView(inputs.params)(aten)
        # AOTAutograd calls this under its fake mode; planning allocates, copies and runs
        # real tensors
        with unset_fake_temporarily():
            return make_boxed_func(compile_graph(aten, inputs))

    # the graph traced for inference: the backward is refused above if ever asked for
    with torch.no_grad():
        compiled = aot_module_simplified(
            gm,
            list(example_inputs),
            fw_compiler=fw_compiler,  # type: ignore[arg-type]
            bw_compiler=_no_backward,  # type: ignore[arg-type]
            keep_inference_input_mutations=False,
        )
    warned = False

    def run(*args: Any) -> Any:
        nonlocal warned
        if (
            not warned
            and torch.is_grad_enabled()
            and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        ):
            warned = True
            warnings.warn(
                "TensorTorrent runs inference only: outputs carry no autograd history. "
                "Call the model under torch.no_grad() or torch.inference_mode().",
                TensorTorrentWarning,
                stacklevel=2,
            )
        return compiled(*args)

    return run


def capture(fn: Callable[..., Any], *args: Any) -> list[tuple[torch.fx.GraphModule, GraphInputs]]:
    """The functional graph of every graph Dynamo captures from ``fn(*args)`` (one per
    graph break), with its inputs: what the backend plans. Nothing is planned or run but
    the graphs themselves, eagerly, under ``torch.no_grad()``."""
    graphs: list[tuple[torch.fx.GraphModule, GraphInputs]] = []

    def keep(gm: torch.fx.GraphModule, inputs: GraphInputs) -> Callable[..., Any]:
        graphs.append((gm, inputs))
        return gm.forward

    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return functional(gm, example_inputs, keep)

    with torch.no_grad():
        torch.compile(fn, backend=backend)(*args)
    return graphs
