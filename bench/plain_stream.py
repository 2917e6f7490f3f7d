"""plain_stream: TensorTorrent's disk plan beside a plain streaming loop written for the model.

``bench.ram_offload``'s lower bound (its streamed bytes at the fastest disk rate measured)
is not a rate any program reaches: reads land in memory the call then computes on, and a
budget that holds the reads' buffers holds that much less of the weights. This bench asks
what a plain program reaches on the same machine at the same moment, under the same budget:
a loop written for this model (``--layers`` x ``Linear(width, width)`` + ReLU, float32, the
ram_offload workload) that keeps the weights' row chunks in RAM but for as many of the last
ones as the plan reads from disk each call, which it reads with ``O_DIRECT`` (buffered reads
where the filesystem has none) into a ring of three chunk buffers on two threads, unchecked
(the reads of the next two chunks queued while it waits for one: each chunk computed issues
the read of the chunk two after it), then multiplies each chunk as it lands. The
chunks are the plan's own row chunks (``stream_chunk_bytes``), so both read the same bytes
in reads of the same size and hold the same buffers.

Per batch: TensorTorrent (the plan's predicted time, its bytes read) and the plain loop, each
called ``--pairs`` times in turn (the order alternating), the files of each evicted from the
page cache before each call (cold); the figure is the median over pairs of TensorTorrent's
time over the loop's, with its quartiles. Every call's output is checked against eager's.

    python -m bench.plain_stream [--layers 16 --width 4096 --batches 16 256 --pairs 8
                                  --quick --dir DIR --results DIR]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import tensortorrent_dynamo as tt
from tensortorrent_dynamo.io.pool import direct_io_memory
from tensortorrent_dynamo.io.reader import DEFAULT_CHUNK_BYTES, _open_direct
from tests.models import mlp, param_bytes

from .common import write_results
from .offload.measure import evict_files

SEED = 0
RING = 3
"""Chunk buffers of the plain loop: the one computed on and two read ahead."""
AHEAD = 2
THREADS = 2


class PlainStream:
    """The plain loop: ``model``'s row chunks of ``rows`` rows, the last ``streamed`` of them
    read from ``path`` (written here, in the order they are used) each call."""

    def __init__(self, model: torch.nn.Sequential, rows: int, streamed: int, path: Path) -> None:
        linears = [m for m in model if isinstance(m, torch.nn.Linear)]
        self.biases = [lin.bias.detach().clone() for lin in linears]
        self.width = linears[0].in_features
        self.chunks = [
            (i, r) for i, lin in enumerate(linears) for r in range(0, lin.out_features, rows)
        ]
        self.rows = rows
        self.streamed = min(streamed, len(self.chunks))
        first = len(self.chunks) - self.streamed
        self.index = {chunk: k for k, chunk in enumerate(self.chunks[first:])}
        self.resident = {
            (i, r): linears[i].weight[r : r + rows].detach().clone() for i, r in self.chunks[:first]
        }
        self.chunk_bytes = rows * self.width * 4
        with open(path, "wb") as f:
            for i, r in self.chunks[first:]:
                f.write(linears[i].weight[r : r + rows].detach().contiguous().numpy().tobytes())
        self.path = path
        fd = _open_direct(path)  # as the runtime's reader opens: refused on open or 1st read
        self.direct = fd is not None
        # no O_DIRECT here: buffered, the file evicted before each call
        self.fd = fd if fd is not None else os.open(path, os.O_RDONLY)
        self.ring = [direct_io_memory(self.chunk_bytes) for _ in range(RING)]
        self.pool = concurrent.futures.ThreadPoolExecutor(THREADS)

    def close(self) -> None:
        self.pool.shutdown()
        os.close(self.fd)

    def _read(self, k: int) -> concurrent.futures.Future[int]:
        buffer = self.ring[k % RING].numpy().data
        return self.pool.submit(os.preadv, self.fd, [buffer], k * self.chunk_bytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flight = {k: self._read(k) for k in range(min(AHEAD, self.streamed))}
        h = x
        parts: list[torch.Tensor] = []
        for i, r in self.chunks:
            k = self.index.get((i, r))
            if k is None:
                weight = self.resident[(i, r)]
            else:
                if flight.pop(k).result() != self.chunk_bytes:
                    raise OSError(f"a short read of chunk {k} from {self.path}")
                weight = self.ring[k % RING].view(torch.float32).view(self.rows, self.width)
            parts.append(torch.addmm(self.biases[i][r : r + self.rows], h, weight.t()))
            if k is not None and k + AHEAD < self.streamed:
                flight[k + AHEAD] = self._read(k + AHEAD)  # into chunk k - 1's buffer
            if r + self.rows >= self.biases[i].numel():
                h = torch.relu(torch.cat(parts, dim=1))
                parts = []
        return h


def paired(
    calls: dict[str, tuple[Callable[[], torch.Tensor], Path]], pairs: int, expected: torch.Tensor
) -> dict[str, list[float]]:
    """Seconds of each call, cold (its files evicted first), the calls taken in turn, the
    order reversed every other pair; each output checked against ``expected``."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for p in range(pairs):
        for name in names if p % 2 == 0 else names[::-1]:
            call, files = calls[name]
            evict_files(files)
            start = time.perf_counter()
            out = call()
            times[name].append(time.perf_counter() - start)
            torch.testing.assert_close(out, expected)
    return times


def run_batch(
    width: int, layers: int, batch: int, pairs: int, work: Path, options: dict[str, Any]
) -> dict[str, Any]:
    model = mlp(width, layers, seed=SEED)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        expected = model(x)
        budget = param_bytes(model) // 2
        offload = work / f"offload-{batch}"
        plain_dir = work / f"plain-{batch}"
        plain_dir.mkdir()
        # the loop's copies first: compiling moves the model's weights to disk
        keep = mlp(width, layers, seed=SEED)
        torch._dynamo.reset()
        settings = {"compiler": "eager", "budgets": {"cpu": budget}, "offload_dir": str(offload)}
        compiled = tt.compile(model, **{**settings, **options})
        torch.testing.assert_close(compiled(x), expected)
        compiled(x)  # the first call read the weights kept resident too: this one a call's
        plan = compiled.graphs[0].plan
        chunk_bytes = plan.chunk_bytes or DEFAULT_CHUNK_BYTES
        rows = max(1, min(width, chunk_bytes // (width * 4)))
        read = compiled.disk_bytes_read()
        streamed = -(-read // (rows * width * 4))
        loop = PlainStream(keep, rows, streamed, plain_dir / "chunks.bin")
        del keep
        try:
            torch.testing.assert_close(loop(x), expected)
            times = paired(
                {
                    "tensortorrent": (lambda: compiled(x), offload),
                    "plain": (lambda: loop(x), plain_dir),
                },
                pairs,
                expected,
            )
        finally:
            loop.close()
    ratios = sorted(a / b for a, b in zip(times["tensortorrent"], times["plain"], strict=True))
    quarter = len(ratios) // 4
    return {
        "batch": batch,
        "budget_bytes": budget,
        "chunk_bytes": rows * width * 4,
        "tensortorrent": {
            "ms": statistics.median(times["tensortorrent"]) * 1e3,
            "calls_ms": [t * 1e3 for t in times["tensortorrent"]],
            "predicted_ms": plan.predicted_time_s * 1e3,
            "disk_bytes_read": read,
        },
        "plain": {
            "ms": statistics.median(times["plain"]) * 1e3,
            "calls_ms": [t * 1e3 for t in times["plain"]],
            "disk_bytes_read": loop.streamed * loop.chunk_bytes,
            "o_direct": loop.direct,
            "buffer_bytes": RING * loop.chunk_bytes,
        },
        "tensortorrent_over_plain": statistics.median(ratios),
        "tensortorrent_over_plain_quartiles": [ratios[quarter], ratios[-1 - quarter]],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="8 x 1024, 4 pairs, batch 16")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go")
    parser.add_argument("--results", type=Path, default=None)
    parser.add_argument(
        "--options", type=json.loads, default={}, help="TensorTorrent's options, as JSON"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.batches, args.pairs = 8, 1024, [16], 4
    regimes = []
    with tempfile.TemporaryDirectory(prefix="tt-plain-", dir=args.dir) as work:
        for batch in args.batches:
            regime = run_batch(args.width, args.layers, batch, args.pairs, Path(work), args.options)
            print(
                f"batch {batch}: TensorTorrent {regime['tensortorrent']['ms']:.1f} ms "
                f"(predicted {regime['tensortorrent']['predicted_ms']:.1f}), plain loop "
                f"{regime['plain']['ms']:.1f} ms, {regime['tensortorrent_over_plain']:.3f}x "
                f"({regime['tensortorrent_over_plain_quartiles'][0]:.3f}-"
                f"{regime['tensortorrent_over_plain_quartiles'][1]:.3f}), each reading "
                f"{regime['plain']['disk_bytes_read'] / 2**20:.0f} MiB",
                flush=True,
            )
            regimes.append(regime)
    path = write_results(
        "plain_stream",
        {
            "params": {
                "layers": args.layers,
                "width": args.width,
                "pairs": args.pairs,
                "options": args.options,
            },
            "method": (
                "one process; per batch, TensorTorrent (eager segments, budget half the "
                "weights, default options or those of --options) and a plain loop reading as "
                "many bytes of the same row chunks (O_DIRECT, 3 chunk buffers, reads 2 deep, "
                "2 threads, unchecked), "
                "called in turn with their files evicted from the page cache before each "
                "call; the ratio is the median over pairs of TensorTorrent's time over the "
                "loop's"
            ),
            "regimes": regimes,
        },
        args.results,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
