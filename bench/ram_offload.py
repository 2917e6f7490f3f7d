"""ram_offload: a DeepMLP whose parameters are twice a RAM budget, on the CPU and the disk.

The model is ``--layers`` blocks of ``nn.Linear(width, width)`` + ReLU in float32 (16 x 4096:
1 GiB of parameters), built from a fixed seed; the RAM budget is half its parameter bytes.
Two regimes: batch 16 (disk-bound) and batch 256 (compute-bound). Competitors, each in its
own fresh process: eager with no budget (the reference), Accelerate
(``infer_auto_device_map`` with ``max_memory={"cpu": budget, "disk": ...}`` then
``load_checkpoint_and_dispatch``), TensorTorrent from the checkpoint on a meta model (the
main figure) and TensorTorrent given the real model. What each holds in RAM, how RSS and the
page cache are handled, and the lower bound: see ``bench/offload/__init__.py``.

Figures: per regime and competitor, median ms with a cold page cache and with a warm one
(over every call of every round, and per round), peak RSS, max abs difference from eager,
setup and compile seconds; TensorTorrent / Accelerate (cold and warm) and TensorTorrent /
lower bound, where the lower bound is max(eager's warm time, streamed bytes / the highest
disk read bandwidth measured in the same run); TensorTorrent's call over the time its reader
takes to read the call's disk bytes alone just before it; the headline ratios are medians
over rounds of each round's ratio. About 7.5 minutes on the 2-core development machine (3 rounds).

    python -m bench.ram_offload [--layers 16 --width 4096 --repeats 3 --rounds 3 --quick
                                 --out-dir DIR]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from tests.models import mlp

from .offload.runner import DEFAULT_REPEATS, add_arguments, run_bench
from .offload.workload import fp32_quality

SEED = 0
COMPETITORS = ("eager", "accelerate", "tensortorrent", "tensortorrent_in_memory")


class DeepMLP:
    """The workload: ``layers`` x Linear(width, width) + ReLU, float32, one regime per batch."""

    name = "ram_offload"
    dtype = torch.float32
    no_split_module_classes: list[str] = []

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.layers = int(params["layers"])
        self.width = int(params["width"])
        self.batches = {f"batch{b}": int(b) for b in params["batches"]}
        self.regimes = list(self.batches)

    def build(self) -> torch.nn.Module:
        return mlp(self.width, self.layers, seed=SEED)

    def build_meta(self) -> torch.nn.Module:
        with torch.device("meta"):
            return mlp(self.width, self.layers, seed=SEED)

    def inputs(self, regime: str) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(SEED + self.batches[regime])
        return (torch.randn(self.batches[regime], self.width, generator=generator),)

    def quality(self, got: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
        return fp32_quality(got, expected)


def make_workload(params: Mapping[str, Any]) -> DeepMLP:
    return DeepMLP(params)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=None, help="default 16 (8 with --quick)")
    parser.add_argument("--width", type=int, default=None, help="default 4096 (2048 with --quick)")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    add_arguments(parser)
    args = parser.parse_args(argv)
    params = {
        "layers": args.layers or (8 if args.quick else 16),
        "width": args.width or (2048 if args.quick else 4096),
        "batches": args.batches,
    }
    repeats = args.repeats or DEFAULT_REPEATS
    run_bench(
        "ram_offload",
        "bench.ram_offload:make_workload",
        params,
        args,
        repeats,
        COMPETITORS,
        disk_mib=64 if args.quick else 256,
    )


if __name__ == "__main__":
    main()
