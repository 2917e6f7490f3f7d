"""Progress of a long measurement on stderr, drawn by tqdm."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm


class ProgressBar:
    """Shows ``[#####.....] 3/8 cpu matmul bfloat16 (1.2 s)`` as steps advance (redrawn in
    place on a terminal). Called as a :data:`~tensortorrent_dynamo.profile.measure.Progress`:
    ``(done, total, label)``."""

    FORMAT = "[{bar:20}] {n_fmt}/{total_fmt} {desc} ({elapsed_s:.1f} s)"

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bar: tqdm[Any] | None = None

    def __call__(self, done: int, total: int, label: str) -> None:
        bar = self.bar
        if bar is None:
            bar = self.bar = tqdm(
                total=total,
                desc=label,
                file=self.stream,
                bar_format=self.FORMAT,
                ascii=".#",
                mininterval=0,  # every step is shown: there are a few dozen at most
            )
        bar.set_description_str(label, refresh=False)
        bar.update(done - bar.n)
        if done == total:
            bar.close()
            self.bar = None
