"""Where each parameter of a plan lives: one :class:`Residency` per parameter, built once
from the native plan. Every stage after planning (weights, rewrite, runtime, explain,
saved plans) reads it; none re-derives it from the plan's arrays.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence


class Tier(enum.Enum):
    """Where a parameter's bytes live between runs (the native planner's ``param_home``)."""

    HOST = "host"  # host RAM, as the model holds it
    DISK = "disk"  # a file: the model's checkpoint or the offload store


@dataclasses.dataclass(frozen=True)
class Residency:
    """Where one parameter lives and how its bytes reach the nodes that use it.

    ``device`` is the device whose nodes use it (``"cpu"`` when only host nodes do);
    ``streams`` says it is copied there for each run and released after its last use
    there, instead of kept there across runs; ``tier`` is where its bytes are between
    runs; ``rows`` are the rows of its weight it stands for, when the plan cut the
    weight into row chunks (``passes.chunk_weights``).
    """

    device: str
    streams: bool
    tier: Tier
    rows: tuple[int, int] | None = None

    @property
    def on_disk(self) -> bool:
        return self.tier is Tier.DISK

    @property
    def keeps_copy(self) -> bool:
        """Whether a copy of it is kept across runs apart from the model's tensor: on an
        accelerator, or in RAM for a parameter whose tier is disk."""
        return not self.streams and (self.device != "cpu" or self.tier is Tier.DISK)

    @property
    def reads_from_disk(self) -> bool:
        """Whether each run reads it from disk (streamed from its disk tier)."""
        return self.streams and self.tier is Tier.DISK

    @property
    def pinned(self) -> bool:
        """Whether it streams from host RAM to a CUDA device (then from pinned memory)."""
        return self.streams and self.tier is Tier.HOST and self.device.startswith("cuda")


def residencies(
    device_names: Sequence[str],
    param_device: Sequence[int],
    param_streamed: Sequence[bool],
    param_home: Sequence[str],
    rows: Sequence[tuple[int, int] | None] | None = None,
) -> tuple[Residency, ...]:
    """Each parameter's residency from the native plan's arrays (indices into
    ``device_names``) and, for a graph cut into row chunks, each parameter's rows."""
    return tuple(
        Residency(
            device=device_names[device],
            streams=streams,
            tier=Tier(home),
            rows=rows[i] if rows is not None else None,
        )
        for i, (device, streams, home) in enumerate(
            zip(param_device, param_streamed, param_home, strict=True)
        )
    )
