"""What a bench supplies: the ``Workload`` protocol (and ``GenerateWorkload``, a workload
whose call is a ``generate()``), ``load_workload``, and the checks of a competitor's output
against eager's (``fp32_quality``, ``logits_quality``, ``generation_quality``,
``worst_quality``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

FP32_RTOL, FP32_ATOL = 1.3e-6, 1e-5
"""``torch.testing.assert_close``'s default tolerances for float32."""


class Workload(Protocol):
    """One model and its regimes; made from JSON-able ``params`` by the bench module."""

    name: str
    dtype: torch.dtype
    regimes: Sequence[str]
    no_split_module_classes: list[str]

    def build(self) -> torch.nn.Module:
        """The model with real weights from the fixed seed (the setup step only)."""

    def build_meta(self) -> torch.nn.Module:
        """The same model with parameters on the meta device and real buffers."""

    def inputs(self, regime: str) -> tuple[torch.Tensor, ...]:
        """The regime's inputs, from a fixed seed."""

    def quality(self, got: Any, expected: Any) -> dict[str, Any]:
        """How ``got`` compares with eager's output (a tensor, or a generation's tokens and
        logits): at least ``ok`` and ``max_abs_diff``."""


@runtime_checkable
class GenerateWorkload(Workload, Protocol):
    """A workload whose call is greedy ``model.generate(input_ids)`` of exactly
    ``new_tokens`` tokens (``bench.offload.generation``), not one forward. Its outputs are
    ``{"tokens": the new tokens, "first_logits": the first step's logits}``."""

    new_tokens: int

    def kv_cache_bytes(self, regime: str) -> int:
        """The bytes of the KV cache a call of ``regime`` holds at its longest: what a
        memory limit gives the process on top of the weights' budget."""
        ...


def load_workload(ref: str, params: Mapping[str, Any]) -> Workload:
    """``"bench.ram_offload:make_workload"`` called with ``params``."""
    module, _, attr = ref.partition(":")
    factory: Callable[[Mapping[str, Any]], Workload] = getattr(
        importlib.import_module(module), attr
    )
    return factory(params)


def fp32_quality(got: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """``torch.testing.assert_close``'s float32 check (rtol 1.3e-6, atol 1e-5), and the max abs
    difference. ``torch.allclose`` with the same tolerances decides (the same test: a first
    ``assert_close`` imports ``torch.distributed.tensor``, over a second in a fresh process);
    ``assert_close`` then says how a mismatch fails."""
    got = got.detach().to("cpu", torch.float32)
    expected = expected.float()
    if got.shape != expected.shape:
        return {"ok": False, "max_abs_diff": None, "mismatch": f"shape {tuple(got.shape)}"}
    diff = float((got - expected).abs().max())
    if torch.allclose(got, expected, rtol=FP32_RTOL, atol=FP32_ATOL):
        return {"ok": True, "max_abs_diff": diff}
    try:
        torch.testing.assert_close(got, expected, rtol=FP32_RTOL, atol=FP32_ATOL)
    except AssertionError as exc:
        return {"ok": False, "max_abs_diff": diff, "mismatch": str(exc).splitlines()[:3]}
    return {"ok": True, "max_abs_diff": diff}


def logits_quality(
    got: torch.Tensor, expected: torch.Tensor, min_cosine: float = 0.99, min_argmax: float = 0.9
) -> dict[str, Any]:
    """bf16 logits: cosine similarity of the flattened logits (as float32) and the fraction of
    positions whose argmax agrees; ok when cosine >= 0.99 and agreement >= 0.9."""
    got = got.detach().to("cpu", torch.float32)
    expected = expected.float()
    if got.shape != expected.shape:
        return {"ok": False, "max_abs_diff": None, "mismatch": f"shape {tuple(got.shape)}"}
    # The float32 logits, reduced in float64: a float32 dot product over a million logits
    # is off by ~1e-4, which would read as a small difference between equal outputs.
    a, b = got.flatten().double(), expected.flatten().double()
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    agree = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
    return {
        "ok": cosine >= min_cosine and agree >= min_argmax,
        "max_abs_diff": float((got - expected).abs().max()),
        "cosine": cosine,
        "argmax_agreement": agree,
        "thresholds": {"cosine": min_cosine, "argmax_agreement": min_argmax},
    }


def generation_quality(
    got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], exact: bool
) -> dict[str, Any]:
    """A ``generate()`` output against eager's: whether the greedy tokens are equal, the first
    step (new token) where any sequence differs, and the first step's logits. ``exact``
    (float32): ok when the tokens are equal; else (bf16) ok when the first step's logits
    pass ``logits_quality`` (cosine and argmax agreement)."""
    tokens, reference = got["tokens"].detach().cpu(), expected["tokens"]
    if tokens.shape != reference.shape:
        return {"ok": False, "max_abs_diff": None, "mismatch": f"tokens {tuple(tokens.shape)}"}
    differs = (tokens != reference).any(0).nonzero()
    first = int(differs[0]) if len(differs) else None
    logits = logits_quality(got["first_logits"], expected["first_logits"])
    out = {
        "ok": first is None if exact else logits["ok"],
        "check": "greedy tokens equal eager's" if exact else "the first step's logits",
        "tokens_equal": first is None,
        "first_difference": first,
        "max_abs_diff": logits["max_abs_diff"],
    }
    for key in ("cosine", "argmax_agreement"):
        if key in logits:
            out[key] = logits[key]
    return out


def worst_quality(checks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The worst of several calls' checks (each call's output is checked); a check that is
    already the worst of several (``calls_checked``) counts as that many calls."""
    if not checks:
        return {"ok": False, "note": "no output was checked"}
    failed = [c for c in checks if not c["ok"]]
    worst = dict(failed[0] if failed else checks[0])
    diffs = [c["max_abs_diff"] for c in checks if c.get("max_abs_diff") is not None]
    worst["max_abs_diff"] = max(diffs) if diffs else None
    for key in ("cosine", "argmax_agreement"):
        if all(key in c for c in checks):
            worst[key] = min(c[key] for c in checks)
    if all("tokens_equal" in c for c in checks):
        worst["tokens_equal"] = all(c["tokens_equal"] for c in checks)
        firsts = [c["first_difference"] for c in checks if c["first_difference"] is not None]
        worst["first_difference"] = min(firsts) if firsts else None
    worst["ok"] = not failed
    # a check that is itself a worst of several calls counts its calls
    worst["calls_checked"] = sum(c.get("calls_checked", 1) for c in checks)
    return worst
