"""Compile each segment's subgraph for its device: Inductor where it can run, else eager."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx

from .errors import TensorTorrentError, TensorTorrentWarning
from .rewrite import Rewritten
from .run import Runtime, Segment
from .settings import Settings

log = logging.getLogger(__name__)


def _fake_inputs(sub: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("example_value") for n in sub.graph.nodes if n.op == "placeholder"]


def _inductor(sub: torch.fx.GraphModule, name: str, strict: bool) -> Callable[..., Any] | None:
    from torch._inductor.compile_fx import compile_fx

    try:
        with torch.no_grad():
            compiled = compile_fx(sub, _fake_inputs(sub))
    except Exception as exc:  # Inductor failures must not lose the run: fall back to eager
        if strict:
            raise TensorTorrentError(f"Inductor failed on segment {name}: {exc}") from exc
        warnings.warn(
            f"Inductor failed on segment {name} ({type(exc).__name__}: {exc}); running it eager",
            TensorTorrentWarning,
            stacklevel=2,
        )
        return None
    return cast(Callable[..., Any], compiled)


def compile_segments(rewritten: Rewritten, runtime: Runtime, settings: Settings) -> dict[str, str]:
    """Replace each segment submodule by its compiled form; returns segment -> compiler used."""
    parent = rewritten.module
    used: dict[str, str] = {}
    for name, device in rewritten.segments.items():
        sub = getattr(parent, name)
        virtual = runtime.virtual.get(device)
        fn: Callable[..., Any] | None = None
        if virtual is None and settings.compiler == "inductor" and device == "cpu":
            fn = _inductor(sub, name, settings.strict)
        used[name] = "inductor" if fn is not None else "eager"
        log.debug("segment %s on %s: %s", name, device, used[name])
        segment = Segment(fn or sub, name, device, virtual, used[name], runtime.recorder)
        setattr(parent, name, segment)
    return used
