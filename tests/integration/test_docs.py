"""Every Python block of docs/quickstart.md runs, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import torch

QUICKSTART = Path(__file__).resolve().parents[2] / "docs" / "quickstart.md"


def test_quickstart_code_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", QUICKSTART.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(QUICKSTART), "exec"), namespace)
    peaks = namespace["compiled"]
    assert isinstance(peaks, torch.nn.Module)
