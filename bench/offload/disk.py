"""The disk's read bandwidth, measured from the parent: ``DiskBench`` at the offload
directory, ``DiskReader`` on the checkpoint, and the figure the lower bound uses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .measure import evict_files, read_all


def measure_disk(directory: Path, mib: int) -> dict[str, Any]:
    """Read (and write) bandwidth at ``directory``, by the project's ``DiskBench``."""
    from tensortorrent_dynamo.profile.disk import BLOCK_BYTES, DiskBench

    directory.mkdir(parents=True, exist_ok=True)
    try:
        bench = DiskBench(directory, max(mib << 20, 2 * BLOCK_BYTES), 5, 50, 20.0)
        try:
            write, read = bench.write(), bench.read()
        finally:
            bench.close()
    except OSError as exc:
        return {"read_bytes_per_s": None, "error": str(exc)}
    return {"read_bytes_per_s": read.value, "read": read.to_dict(), "write": write.to_dict()}


def measure_reader(checkpoint: Path, drop: bool) -> dict[str, Any]:
    """Read the whole checkpoint cold with the project's own ``DiskReader``; bytes per second.

    Every tensor is submitted at once to one reader (its default threads and chunks) and all
    are waited for. Two passes, the checkpoint's directory evicted from the page cache
    before each (``evict_files``; unless ``drop`` is false): the first allocates the
    buffers (``fresh``), the second reuses them from the pool (``pooled``), as a reader
    streaming the same model call after call does. The figure is the faster pass.
    """
    from tensortorrent_dynamo.io.pool import HostBufferPool
    from tensortorrent_dynamo.io.reader import DEFAULT_CHUNK_BYTES, DEFAULT_READ_THREADS, DiskReader
    from tensortorrent_dynamo.io.safetensors import safetensors_locations

    passes: list[dict[str, Any]] = []
    try:
        locations = list(safetensors_locations(checkpoint).values())
        pool = HostBufferPool()
        for buffers in ("fresh", "pooled"):
            note = (
                evict_files(checkpoint.parent) if drop else "page cache kept: --no-drop was given"
            )
            with DiskReader(pool) as reader:
                seconds = read_all(reader, locations)
                nbytes = reader.bytes_read
            passes.append(
                {
                    "buffers": buffers,
                    "bytes": nbytes,
                    "seconds": seconds,
                    "bytes_per_s": nbytes / seconds if seconds > 0 else None,
                    "page_cache": note or "evicted",
                }
            )
        pool.trim()
    except Exception as exc:  # a failed measurement is recorded; the bench goes on
        return {"read_bytes_per_s": None, "passes": passes, "error": f"{type(exc).__name__}: {exc}"}
    rates = [p["bytes_per_s"] for p in passes if p["bytes_per_s"]]
    return {
        "read_bytes_per_s": max(rates) if rates else None,
        "tensors": len(locations),
        "tensor_bytes": sum(loc.nbytes for loc in locations),
        "threads": DEFAULT_READ_THREADS,
        "chunk_bytes": DEFAULT_CHUNK_BYTES,
        "passes": passes,
    }


def disk_figures(
    before: dict[str, Any], after: dict[str, Any], reader: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Every read bandwidth measured in the run, and the one the lower bound uses: the
    highest (a shared machine only ever makes the disk look slower)."""
    measured = [("diskbench_before", before), ("diskbench_after", after)]
    measured += [(f"disk_reader_round_{m.get('round', i + 1)}", m) for i, m in enumerate(reader)]
    rates = [(m["read_bytes_per_s"], source) for source, m in measured if m.get("read_bytes_per_s")]
    best = max(rates) if rates else (None, None)
    return {
        "read_bytes_per_s": best[0],
        "source": best[1],
        "method": "the highest read bandwidth measured in this run at the bench's disk: "
        "tensortorrent_dynamo.profile.disk.DiskBench (one stream of O_DIRECT reads at the "
        "offload directory) before and after the competitors, and "
        "tensortorrent_dynamo.io.reader.DiskReader (every tensor of model.safetensors submitted "
        "at once, its default threads, its directory evicted from the page cache) at the start of "
        "every round",
        "before": before,
        "after": after,
        "reader": list(reader),
    }
