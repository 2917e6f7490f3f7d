"""A one-line progress display on stderr, redrawn in place on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    """Shows ``[#####.....] 3/8 cpu matmul bfloat16 (1.2 s)`` as steps advance.

    On a terminal the line is redrawn in place; otherwise (a log, a pipe) each step gets
    its own line. Called as a :data:`~tensortorrent_dynamo.profile.measure.Progress`.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 20) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = self.stream.isatty()
        self.started = time.perf_counter()
        self.shown = 0

    def __call__(self, done: int, total: int, label: str) -> None:
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.started
        text = f"[{bar}] {done}/{total} {label} ({elapsed:.1f} s)"
        if self.tty:
            self.stream.write("\r" + text.ljust(self.shown))
            self.shown = len(text)
            if done == total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
