"""The row-chunk sizes a graph's large weights are planned in when the plan reads them from
disk (``stream_chunk_bytes``): one decision, made here.

Reads of 4 MiB run faster than reads of 16 MiB where the rate of ``O_DIRECT`` reads depends
on how much memory they land in (the profile's ``disk.stream_small`` against
``disk.stream``), while more, smaller chunks cost more segments and more reads' hand-offs.
So ``"auto"`` plans 16 MiB chunks, and 4 MiB ones too where the profile measured 4 MiB reads
faster, each costed at its reads' rate (``HostProfile.disk_read_rate``), and the pipeline
keeps the plan predicted faster (``pipeline._plan_chunked``). On the 2-core development
machine (2026-12-05) ``bench.ram_offload``'s batch-16 call, planned in 4 MiB chunks at the
small stream's 2.56 GB/s, was predicted at 275 ms and measured at 294, against 338 and 348
in 16 MiB chunks at 1.78 GB/s; at batch 256 the 16 MiB plan was predicted faster (640 ms
against 674) and measured faster (708 against 887). It is opt-in: in the fidelity bench the
quick MLP's batch-16 disk plan (8 x 2048², 16 MiB weights), planned so in 4 MiB chunks, ran
31% and 43% slower than predicted (two rounds; its 16 MiB plan within a few percent), so the
small stream's rate overstates what a small model's call reads at.
"""

from __future__ import annotations

from ..profile.host import HostProfile
from ..profile.schema import SMALL_STREAM_BYTES
from ..settings import DEFAULT_STREAM_CHUNK_BYTES, Settings


def chunk_sizes(
    settings: Settings, profile: HostProfile, pinned: bool = False, size: int | None = None
) -> list[int]:
    """The chunk sizes to plan in, in turn (the first is planned with the weights whole
    too; ``[]``: weights are never cut, ``stream_chunk_bytes=0``). Where a plan must be
    made in one size (``pinned``: a saved plan replayed, the ``plan`` option, or a plan
    keeping another graph's resident copies, which are named by chunk), that one: ``size``,
    else (``None``: not recorded, or that plan cut no weight) the setting's, else 16 MiB.
    Otherwise the setting's size where it names one, else 16 MiB, and 4 MiB too where the
    profile measured reads that size faster."""
    setting = settings.stream_chunk_bytes
    if setting == 0:
        return []
    if pinned:
        return [size or setting or DEFAULT_STREAM_CHUNK_BYTES]
    if setting is not None:
        return [setting]
    sizes = [DEFAULT_STREAM_CHUNK_BYTES]
    if profile.disk_read_rate(SMALL_STREAM_BYTES)[0] > profile.disk_read_rate(sizes[0])[0]:
        sizes.append(SMALL_STREAM_BYTES)
    return sizes
