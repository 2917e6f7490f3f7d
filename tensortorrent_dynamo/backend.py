"""The registered backend: options → settings → functional graph → :mod:`.pipeline` →
compiled graph.

``torch.compile(model, backend="tensortorrent")`` finds :data:`tensortorrent_backend`
through the ``torch_dynamo_backends`` entry point. Dynamo calls it once per
captured graph; graphs compiled with the same settings share one :class:`.Session`
(devices, one memory ledger per virtual device, resident copies), and each graph is
planned knowing what the others keep resident.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from ._logs import register
from .errors import OptionsError
from .functional import GraphInputs, functional
from .instances import Instances, instance_inputs
from .pipeline import Replanner, plan_and_compile
from .session import CompiledGraph, Session
from .settings import Settings, parse_options
from .shapes import SizeRanges, SymbolicSizes

register()  # torch normally did this through the entry point; cheap and idempotent


class TensorTorrentBackend:
    """The callable registered as ``"tensortorrent"``; holds one session per settings."""

    def __init__(self, default_options: Mapping[str, Any] | None = None) -> None:
        self.default_options: dict[str, Any] = dict(default_options or {})
        self.sessions: dict[str, Session] = {}

    @property
    def graphs(self) -> list[CompiledGraph]:
        return [g for s in self.sessions.values() for g in s.graphs]

    def reset(self) -> None:
        """Drop every plan, resident copy and ledger (``torch._dynamo.reset()`` calls this)."""
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        *,
        options: Mapping[str, Any] | None = None,
        mode: str | None = None,
    ) -> Callable[..., Any]:
        if mode is not None:
            raise OptionsError(
                f"tensortorrent does not use mode={mode!r}; pass options={{...}} instead "
                "(see tensortorrent_dynamo.settings.OPTION_HELP)"
            )
        settings = parse_options({**self.default_options, **(options or {})})
        return functional(gm, example_inputs, lambda g, i: self.compile_graph(g, i, settings))

    def compile_graph(
        self, gm: torch.fx.GraphModule, graph_inputs: GraphInputs, settings: Settings
    ) -> Callable[..., Any]:
        """Plan, rewrite and compile one functional graph (see :mod:`.functional`): once for
        each set of weights it is called with (:mod:`.instances`), and a graph with symbolic
        sizes once per range of sizes (:mod:`.shapes`)."""
        session = self._session(settings)
        compile_id = torch._guards.CompileContext.current_compile_id()
        dynamo_frame = compile_id.frame_id if compile_id is not None else None
        sizes = SymbolicSizes.of(gm)

        # the traced values, for the first plan only: a call's own are planned with after
        # that, so that the tensors traced with (a KV cache) are not kept alive
        traced = [graph_inputs]
        shape = dataclasses.replace(graph_inputs, values=())

        def build(weights: tuple[Any, ...], args: Sequence[Any] | None) -> Callable[..., Any]:
            """The graph of the instance ``weights`` are, planned with them (at call time,
            with ``args``, the call's arguments, under the session's lock, as no call may
            run meanwhile). What it returns holds no call's values: they would keep a
            deleted model's weights, or a KV cache the caller replaced, alive."""
            with session.lock if args is not None else contextlib.nullcontext():
                instance = session.instance_of(dynamo_frame, weights)
                inputs = instance_inputs(
                    traced.pop() if args is None else shape, args, session.weight_name
                )
                names = sorted(inputs.params.values())
                frame = session.instance_frame(dynamo_frame, instance, names)

                def hooked(
                    compiled: CompiledGraph, given: GraphInputs, bounds: dict[str, int] | None
                ) -> CompiledGraph:
                    compiled.replan = Replanner(session, gm, given, frame, bounds)
                    return compiled

                if not sizes:
                    return hooked(plan_and_compile(session, gm, inputs, frame), inputs, None)
                # the values of the first range's plan, until it is made; a later range's
                # are those of the call that asks for it
                first = [inputs]
                del inputs

                def build_range(bounds: dict[str, int], call: Sequence[Any] | None) -> Any:
                    with session.lock:
                        given = (
                            first[0] if first else instance_inputs(shape, call, session.weight_name)
                        )
                        compiled = plan_and_compile(session, gm, given, frame, bounds)
                        first.clear()
                        return hooked(compiled, given, bounds)

                return SizeRanges(sizes, build_range, args)

        if not graph_inputs.params:  # no weights: one instance, called directly
            return build((), None)
        return Instances(sorted(graph_inputs.params), graph_inputs.values, build)

    def _session(self, settings: Settings) -> Session:
        """The session of ``settings``. The sessions all of whose graphs are gone (their
        models were deleted: ``Session.forget_gone``) are closed (their disk tier's reader
        threads stop) and dropped."""
        key = settings.fingerprint()
        for other, session in list(self.sessions.items()):
            with session.lock:
                session.forget_gone()
            if other != key and session.planned and not session.graphs:
                session.close()
                del self.sessions[other]
        if key not in self.sessions:
            self.sessions[key] = Session.of(settings)
        return self.sessions[key]


tensortorrent_backend = TensorTorrentBackend()
"""The backend object the ``torch_dynamo_backends`` entry point names."""
