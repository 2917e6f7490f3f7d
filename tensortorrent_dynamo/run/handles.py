"""Copies in flight: :class:`PrefetchHandle` (a tensor on its way, and the buffer it
lands in) and :func:`wait_for`, the bounded wait for a read or a copy."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

import torch

from ..errors import CopyTimeout
from ..settings import Settings

T = TypeVar("T")

# How long a wait for a read or a copy may take before the call is abandoned with an error
# naming it, unless the session's settings say otherwise.
DEFAULT_IO_TIMEOUT_S = Settings.io_timeout_s


def wait_for(future: concurrent.futures.Future[T], timeout_s: float, what: str) -> T:
    """``future``'s result; :class:`CopyTimeout` naming ``what`` when it takes too long."""
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise CopyTimeout(
            f"{what} has not finished after {timeout_s:g} s: the disk, its file system or the "
            "copy engine stopped answering (a failing disk, a hung network mount). The call "
            "was abandoned; if the disk is only slow, raise the option io_timeout_s"
        ) from None


class PrefetchHandle:
    """A parameter on its way to a device: :meth:`result` blocks until it landed,
    :meth:`release` hands its buffer back for reuse.

    ``copies`` is false for a handle on a tensor already at hand (:meth:`at_hand`): no
    copy stands behind it, so a failed call has nothing of it to wait for.

    With ``once`` (an activation's spill or reload: read by one consumer), :meth:`result`
    hands the tensor over and keeps no reference to it, so that the runtime, which holds
    its handles until the call ends, does not keep the copy alive past its last use.
    """

    def __init__(
        self,
        finish: Callable[[], torch.Tensor],
        release: Callable[[], None] | None = None,
        *,
        copies: bool = True,
        once: bool = False,
    ) -> None:
        self._finish: Callable[[], torch.Tensor] | None = finish
        self._release = release
        self._tensor: torch.Tensor | None = None
        self.copies = copies
        self._once = once

    @classmethod
    def at_hand(cls, tensor: torch.Tensor) -> PrefetchHandle:
        """A handle whose result is ``tensor`` itself, with no copy and no buffer."""
        return cls(finish=lambda: tensor, copies=False)

    def landed(self) -> None:
        """Block until the copy has landed, keeping its result for :meth:`result`."""
        if self._tensor is None:
            assert self._finish is not None, (
                "wait() after evict(), or twice on a copy read once: the schedule is out of order"
            )
            self._tensor = self._finish()
            if self._once:
                self._finish = None  # its closure holds the copy too

    def result(self) -> torch.Tensor:
        self.landed()
        tensor = self._tensor
        assert tensor is not None
        if self._once:
            self._tensor = None
        return tensor

    def release(self) -> None:
        if self._finish is not None and self._tensor is None:
            self.result()  # never hand back a buffer a copy is still writing
        self._tensor = None
        self._finish = None
        if self._release is not None:
            self._release()
            self._release = None

    def abandon(self, wait: bool) -> None:
        """After a failed call: with ``wait``, wait for the copy and hand its buffer back. A
        copy that failed as well keeps its error to itself (the call's error is the one
        raised); a buffer whose copy did not finish (or was not waited for) is not handed
        back, and is freed once the copy lets go of it."""
        try:
            if wait:
                self.release()
        except Exception:
            pass
        self._finish = None
        self._release = None
