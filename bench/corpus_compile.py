"""Compile time of the third-party corpus, with and without the backend.

For every entry of ``tests/integration/corpus`` (tiny configs, random weights), the
first call (capture plus compile plus one run) through Dynamo with its ``eager``
backend, with ``aot_eager`` (the functional graph alone, what the backend plans), and
through TensorTorrent at no budget on a virtual device, each in the same process one
after the other, entries in the registry's order, after one untimed eager call. Writes
``bench/results/corpus_compile.json`` with the seconds and the ratios of the totals.

    python -m bench.corpus_compile [--entries NAME ...]
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


def _first_call(how: str, model: torch.nn.Module, inputs: dict[str, Any]) -> float:
    torch._dynamo.reset()
    tt.tensortorrent_backend.reset()
    start = time.perf_counter()
    if how == "tensortorrent":
        compiled: Any = tt.compile(model, **options("none", model))
    else:
        compiled = torch.compile(model, backend=how)
    with torch.no_grad():
        compiled(**inputs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", nargs="+", default=None, help="a subset, by name")
    args = parser.parse_args()
    rows = []
    for entry in ENTRIES:
        if args.entries and entry.name not in args.entries:
            continue
        model, inputs = entry.build(), entry.inputs(0)
        with torch.no_grad():  # untimed: the model's own lazy set-up is no one's compile time
            model(**inputs)
        row: dict[str, Any] = {"entry": entry.name}
        for how in ("eager", "aot_eager", "tensortorrent"):
            row[f"{how}_s"] = _first_call(how, model, inputs)
        rows.append(row)
        print(
            f"{entry.name:12s} eager {row['eager_s']:6.2f} s  aot_eager {row['aot_eager_s']:6.2f} s"
            f"  tensortorrent {row['tensortorrent_s']:6.2f} s",
            flush=True,
        )
    totals = {k: sum(r[k] for r in rows) for k in ("eager_s", "aot_eager_s", "tensortorrent_s")}
    summary = {
        "what": "first call (capture, compile, one run) of each corpus entry, seconds",
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "entries": rows,
        "totals": totals,
        "tensortorrent_over_eager": totals["tensortorrent_s"] / totals["eager_s"],
        "tensortorrent_over_aot_eager": totals["tensortorrent_s"] / totals["aot_eager_s"],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k != "entries"}, indent=1))


if __name__ == "__main__":
    main()
