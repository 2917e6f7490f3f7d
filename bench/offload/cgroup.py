"""A process as on a machine with that much RAM: run it in a memory cgroup of its own.

The cgroup's limit covers the process's memory and the page cache its reads fill, so a
competitor cannot read weights from a warm cache beyond the limit, and a process that goes
over it is killed by the kernel, as it would be on a smaller machine. Both cgroup versions
are handled: v2 (``memory.max``) where the unified hierarchy has the memory controller, else
v1 (``memory.limit_in_bytes`` under ``/sys/fs/cgroup/memory``). Swap is kept out of the limit
(``memory.swap.max`` 0, or the v1 ``memsw`` limit equal to the memory limit) where the kernel
allows it.

:func:`limited_run` runs a command so and says whether the limit killed it;
:class:`CgroupUnavailable` says why no cgroup could be made (not root, nothing mounted).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
_names = itertools.count()


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here; the message says why."""


@dataclasses.dataclass(frozen=True)
class MemoryCgroup:
    """A memory cgroup of this process's making, with a limit."""

    path: Path
    version: int
    limit_bytes: int

    @classmethod
    def create(cls, limit_bytes: int, root: Path = CGROUP_ROOT) -> MemoryCgroup:
        """A new cgroup limited to ``limit_bytes``; raises :class:`CgroupUnavailable`."""
        name = f"tensortorrent-bench-{os.getpid()}-{next(_names)}"
        controllers = root / "cgroup.controllers"
        v2 = controllers.is_file() and "memory" in controllers.read_text().split()
        parent = root if v2 else root / "memory"
        if not v2 and not (parent / "memory.limit_in_bytes").is_file():
            raise CgroupUnavailable(f"no memory cgroup controller is mounted under {root}")
        path = parent / name
        try:
            path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create the cgroup {path}: {exc.strerror}") from exc
        group = cls(path, 2 if v2 else 1, limit_bytes)
        try:
            if v2:
                group._write("memory.max", limit_bytes)
                group._write("memory.swap.max", 0, optional=True)
            else:
                group._write("memory.limit_in_bytes", limit_bytes)
                group._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)
        except OSError as exc:
            group.remove()
            raise CgroupUnavailable(f"cannot set the limit of {path}: {exc.strerror}") from exc
        return group

    def _write(self, name: str, value: int, optional: bool = False) -> None:
        target = self.path / name
        if optional and not target.exists():
            return
        target.write_text(str(value))

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def enter(self) -> None:
        """Move the calling process into the cgroup (run in the child before it execs)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        """The most memory the cgroup held (page cache included); ``None`` where the kernel
        does not say."""
        text = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def oom_kills(self) -> int:
        """How many processes the limit killed."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control") or ""
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def remove(self) -> None:
        """Remove the cgroup (once its processes are gone)."""
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, root: Path = CGROUP_ROOT) -> Iterator[MemoryCgroup]:
    """A cgroup limited to ``limit_bytes`` for the length of the block."""
    group = MemoryCgroup.create(limit_bytes, root)
    try:
        yield group
    finally:
        group.remove()


@dataclasses.dataclass(frozen=True)
class LimitedRun:
    """How a command run under a memory limit ended."""

    returncode: int
    limit_bytes: int
    peak_bytes: int | None
    # the kernel killed it for going over the limit (not a crash of its own)
    over_limit: bool

    def describe(self) -> str:
        peak = f"; its peak was {self.peak_bytes} bytes" if self.peak_bytes is not None else ""
        if self.over_limit:
            return f"killed by its memory limit of {self.limit_bytes} bytes{peak}"
        return (
            f"exit status {self.returncode} under a memory limit of {self.limit_bytes} bytes{peak}"
        )


def limited_run(
    command: Sequence[str | os.PathLike[str]],
    limit_bytes: int,
    root: Path = CGROUP_ROOT,
    **kwargs: Any,
) -> LimitedRun:
    """Run ``command`` (``subprocess.run``'s other arguments in ``kwargs``) in a memory cgroup
    of its own limited to ``limit_bytes``; raises :class:`CgroupUnavailable` when none can be
    made, ``subprocess.TimeoutExpired`` as ``subprocess.run`` does."""
    with memory_cgroup(limit_bytes, root) as group:
        proc = subprocess.run(command, preexec_fn=group.enter, check=False, **kwargs)
        killed = proc.returncode == -signal.SIGKILL and group.oom_kills() > 0
        return LimitedRun(proc.returncode, limit_bytes, group.peak_bytes(), killed)
