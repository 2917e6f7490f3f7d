"""Small files written whole: the one atomic JSON writer, the one JSON reader of files we
wrote, and the one digest.

A JSON file (a plan, a plan cache entry, a profile) is written to a temporary file of its
own beside the target, then renamed over it: a reader sees the old file or the new one,
never half of one, and two processes writing one file never share a temporary file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, NoReturn


def digest(data: Any, length: int = 16) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``data`` as canonical JSON (keys
    sorted; a value JSON cannot hold is written as its ``repr``)."""
    text = json.dumps(data, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def write_json(path: str | os.PathLike[str], data: Any, indent: int | None = None) -> None:
    """Write ``data`` to ``path`` as JSON, atomically (see :func:`write_text`)."""
    write_text(path, json.dumps(data, indent=indent))


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically; the directory is made if missing. Raises
    ``OSError`` when it cannot be written (nothing is left behind)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def read_json(path: str | os.PathLike[str], error: type[Exception], what: str, again: str) -> Any:
    """The JSON in ``path`` (a file :func:`write_json` wrote); ``error`` naming ``what`` it
    holds when it cannot be read, or is not JSON (then with ``again``: how to write it anew).
    """

    def fail(exc: BaseException, advice: str = "") -> NoReturn:
        raise error(f"cannot read {what} from {path}: {exc}{advice}") from exc

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        fail(exc)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8, or nested too deep
        fail(exc, f"; {again}")
