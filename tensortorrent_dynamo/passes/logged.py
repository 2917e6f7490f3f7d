"""Every pass can show its graph before and after: ``TORCH_LOGS="tensortorrent_passes"``
prints both (the graph's code) for each pass that runs."""

from __future__ import annotations

import logging

import torch
import torch.fx

from .._logs import PASSES_ARTIFACT

passes_log = torch._logging._internal.getArtifactLogger(__name__, PASSES_ARTIFACT)


def dump(name: str, when: str, gm: torch.fx.GraphModule) -> None:
    """Log ``gm``'s code as the pass ``name`` sees it ``when`` ("before" or "after")."""
    if passes_log.isEnabledFor(logging.DEBUG):
        passes_log.debug("%s pass %s:\n%s", when, name, gm.code)
