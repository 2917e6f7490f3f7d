"""Compile time of the third-party corpus, with and without the backend.

For every entry of ``tests/integration/corpus`` (tiny configs, random weights), the
first call (capture plus compile plus one run) through Dynamo with its ``eager``
backend, with ``aot_eager`` (the functional graph alone, what the backend plans), and
through TensorTorrent at no budget on a virtual device, each in the same process one
after the other, entries in the registry's order, after one untimed eager call. Writes
``bench/results/corpus_compile.json`` with the seconds and the ratios of the totals.

With ``--every-output`` the models are asked for every layer's hidden states and
attention maps, which breaks the graph in each layer (dozens of graphs per model: the
compile of a graph-break-heavy model), and the second call is timed too (graphs first
called then compile then); results in ``corpus_compile_every_output.json``.

    python -m bench.corpus_compile [--entries NAME ...] [--every-output]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TENSORTORRENT_PLAN_CACHE", "0")  # every plan is searched

import torch

import tensortorrent as tt
from tests.integration.corpus.harness import options
from tests.integration.corpus.models import ENTRIES

RESULTS = Path(__file__).parent / "results" / "corpus_compile.json"


def _first_calls(
    how: str, model: torch.nn.Module, inputs: dict[str, Any]
) -> tuple[float, float, int]:
    """Seconds of the first and the second call through ``how``, and how many graphs the
    backend compiled (0 for Dynamo's own backends)."""
    torch._dynamo.reset()
    tt.tensortorrent_backend.reset()
    start = time.perf_counter()
    if how == "tensortorrent":
        compiled: Any = tt.compile(model, **options("none", model))
    else:
        compiled = torch.compile(model, backend=how)
    with torch.no_grad():
        compiled(**inputs)
        first = time.perf_counter()
        compiled(**inputs)
    second = time.perf_counter()
    graphs = len(compiled.graphs) if how == "tensortorrent" else 0
    return first - start, second - first, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", nargs="+", default=None, help="a subset, by name")
    parser.add_argument(
        "--every-output",
        action="store_true",
        help="ask for every layer's hidden states and attention maps (a graph break per layer)",
    )
    args = parser.parse_args()
    every = {"output_attentions": True, "output_hidden_states": True}
    rows = []
    for entry in ENTRIES:
        if args.entries and entry.name not in args.entries:
            continue
        model, inputs = entry.build(), entry.inputs(0)
        if args.every_output:
            inputs = {**inputs, **every}
        with torch.no_grad():  # untimed: the model's own lazy set-up is no one's compile time
            model(**inputs)
        row: dict[str, Any] = {"entry": entry.name}
        for how in ("eager", "aot_eager", "tensortorrent"):
            first, second, graphs = _first_calls(how, model, inputs)
            row[f"{how}_s"] = first
            row[f"{how}_second_call_s"] = second
        row["tensortorrent_graphs"] = graphs
        rows.append(row)
        print(
            f"{entry.name:12s} eager {row['eager_s']:6.2f} s  aot_eager {row['aot_eager_s']:6.2f} s"
            f"  tensortorrent {row['tensortorrent_s']:6.2f} s",
            flush=True,
        )
    totals = {k: sum(r[k] for r in rows) for k in ("eager_s", "aot_eager_s", "tensortorrent_s")}
    summary = {
        "what": "first call (capture, compile, one run) of each corpus entry, seconds"
        + (", every layer's outputs asked for" if args.every_output else ""),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "entries": rows,
        "totals": totals,
        "tensortorrent_over_eager": totals["tensortorrent_s"] / totals["eager_s"],
        "tensortorrent_over_aot_eager": totals["tensortorrent_s"] / totals["aot_eager_s"],
    }
    results = (
        RESULTS.with_name("corpus_compile_every_output.json") if args.every_output else RESULTS
    )
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "entries"}, indent=1))


if __name__ == "__main__":
    main()
