"""TORCH_LOGS registration, called by torch through the ``torch.backends`` entry point.

torch runs this before it parses ``TORCH_LOGS``, during ``import torch``: it must
be idempotent, import nothing heavy, and never raise.
"""

from __future__ import annotations

PLAN_ARTIFACT = "tensortorrent_plan"
PASSES_ARTIFACT = "tensortorrent_passes"


def register() -> None:
    """Make ``TORCH_LOGS="+tensortorrent"``, ``TORCH_LOGS="tensortorrent_plan"`` and
    ``TORCH_LOGS="tensortorrent_passes"`` valid."""
    try:
        from torch._logging import _internal

        registry = _internal.log_registry
        if "tensortorrent" not in registry.log_alias_to_log_qnames:
            _internal.register_log("tensortorrent", ["tensortorrent_dynamo"])
        if PLAN_ARTIFACT not in registry.artifact_names:
            _internal.register_artifact(
                PLAN_ARTIFACT,
                "TensorTorrent: each graph's plan (placement, streaming, predicted time)",
                off_by_default=True,
            )
        if PASSES_ARTIFACT not in registry.artifact_names:
            _internal.register_artifact(
                PASSES_ARTIFACT,
                "TensorTorrent: each graph pass's graph before and after it",
                off_by_default=True,
            )
    except Exception:  # an exception here would break `import torch` everywhere
        return
