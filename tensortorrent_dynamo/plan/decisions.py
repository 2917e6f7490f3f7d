"""A plan as a value: the decisions the native planner made for one graph, in the one form
the plan cache and saved plans both store. Replaying them (``planner.replay``) gives the same
plan, and its hash, without searching again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .. import _planner

# field -> the type of each element of its list
_LISTS: dict[str, type] = {
    "node_device": int,
    "param_streamed": bool,
    "value_spilled": bool,
    "param_home": str,
}


@dataclasses.dataclass(frozen=True)
class Decisions:
    """What the search chose: the candidate's name (a label), each node's device, which
    parameters stream, which values spill, the prefetch depth and window, each parameter's
    home tier, whether the graph cut into row chunks was planned, and the plan's hash (empty
    for a saved plan's decisions for the same graph at other sizes, ``plan.files``: they
    make a plan of another hash)."""

    chosen: str
    node_device: tuple[int, ...]
    param_streamed: tuple[bool, ...]
    value_spilled: tuple[bool, ...]
    prefetch_depth: int
    prefetch_window_bytes: int
    param_home: tuple[str, ...]
    split: bool
    plan_hash: str
    # the most bytes of a row chunk of the split graph planned (0: not recorded, as before
    # the planner chose among chunk sizes; the setting's size, or 16 MiB, then applies)
    chunk_bytes: int = 0

    @classmethod
    def of(cls, native: _planner.Plan, split: bool, chunk_bytes: int | None = None) -> Decisions:
        """The decisions of ``native``, a plan of the split graph when ``split``, in row
        chunks of at most ``chunk_bytes``."""
        made = cls._of(native, native.chosen, native, split)
        return dataclasses.replace(made, chunk_bytes=chunk_bytes or 0) if split else made

    @classmethod
    def of_candidate(cls, native: _planner.Plan, name: str, split: bool) -> Decisions:
        """The decisions of ``native``'s candidate ``name`` (one the search simulated, the
        chosen one or another): replaying them plans that candidate. ``KeyError`` when
        ``native`` lists no candidate of that name."""
        for c in native.candidates:
            if c.name == name:
                return cls._of(c, c.name, native, split)
        raise KeyError(f"the plan lists no candidate {name!r}")

    @classmethod
    def _of(
        cls,
        made: _planner.Plan | _planner.Candidate,
        name: str,
        native: _planner.Plan,
        split: bool,
    ) -> Decisions:
        """The decisions ``made`` carries (a plan or one of its candidates, named ``name``),
        with the homes of ``native``, the plan of the split graph when ``split``."""
        return cls(
            chosen=name,
            node_device=tuple(made.node_device),
            param_streamed=tuple(made.param_streamed),
            value_spilled=tuple(made.value_spilled),
            prefetch_depth=made.prefetch_depth,
            prefetch_window_bytes=made.prefetch_window_bytes,
            param_home=tuple(native.param_home),
            split=split,
            plan_hash=made.plan_hash,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_json(cls, data: object) -> Decisions:
        """Read :meth:`to_json`'s form; ``ValueError`` naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"decisions are {type(data).__name__}, not an object")
        optional = {"chunk_bytes"}  # files written before it was recorded lack it
        missing = sorted({f.name for f in dataclasses.fields(cls)} - set(data) - optional)
        if missing:
            raise ValueError(f"decisions lack {', '.join(missing)}")
        for key, kind in _LISTS.items():
            values = data[key]
            if not isinstance(values, list) or not all(type(v) is kind for v in values):
                raise ValueError(f"decisions.{key} is not a list of {kind.__name__}")
        if not all(0 <= v < 2**31 for v in data["node_device"]):
            raise ValueError("decisions.node_device holds a device index out of range")
        # the native planner's types: a u32 depth, a u64 window
        for key, bits in (("prefetch_depth", 32), ("prefetch_window_bytes", 64)):
            if type(data[key]) is not int or not 0 <= data[key] < 2**bits:
                raise ValueError(f"decisions.{key} is not an integer in [0, 2**{bits})")
        for key, kind in (("chosen", str), ("plan_hash", str), ("split", bool)):
            if type(data[key]) is not kind:
                raise ValueError(f"decisions.{key} is not a {kind.__name__}")
        chunk_bytes = data.get("chunk_bytes", 0)
        if type(chunk_bytes) is not int or not 0 <= chunk_bytes < 2**63:
            raise ValueError("decisions.chunk_bytes is not an integer in [0, 2**63)")
        return cls(
            chosen=data["chosen"],
            node_device=tuple(data["node_device"]),
            param_streamed=tuple(data["param_streamed"]),
            value_spilled=tuple(data["value_spilled"]),
            prefetch_depth=data["prefetch_depth"],
            prefetch_window_bytes=data["prefetch_window_bytes"],
            param_home=tuple(data["param_home"]),
            split=data["split"],
            plan_hash=data["plan_hash"],
            chunk_bytes=chunk_bytes,
        )
