"""Where a tensor's bytes live: a released weight's are its file's, mapped (no RAM of its
own), which ``/proc/self/maps`` shows."""

from __future__ import annotations

from pathlib import Path

import torch

from tensortorrent_dynamo.weights.released import released_location


def mapped_file(tensor: torch.Tensor) -> Path | None:
    """The file whose mapping holds ``tensor``'s first byte; ``None`` for memory of no file
    (the heap, an anonymous mapping)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split(maxsplit=5)
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                name = rest[4].strip() if len(rest) == 5 else ""
                return Path(name) if name.startswith("/") else None
    return None


def holds_its_file(tensor: torch.Tensor) -> bool:
    """``tensor`` is released and its bytes are its file's, mapped: it takes no RAM of its
    own (pages the page cache holds while they are read)."""
    location = released_location(tensor)
    return (
        location is not None
        and tensor.untyped_storage().nbytes() == location.nbytes
        and mapped_file(tensor) == location.path
    )
