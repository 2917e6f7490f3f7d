"""A generative workload's call: greedy ``model.generate`` on fixed prompts, each step timed.

:class:`Generate` runs ``model.generate(input_ids, max_new_tokens=n, min_new_tokens=n,
do_sample=False)`` and returns the new tokens and the first step's logits; a logits
processor (:class:`StepClock`), which ``generate`` calls once per step right after that
step's forward, records ``time.perf_counter()`` at each step. From those stamps:

- prefill: from the start of the ``generate`` call to the first new token's logits (the
  prompt's forward, with ``generate``'s own set-up: its cache, its processors);
- decode: the ``n - 1`` steps from the first new token to the last, ``decode_tokens_per_s``
  = batch x (n - 1) / that time.

Every step is one forward of the model (``forwards`` = n), each reading the weights once.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch


class StepClock:
    """A logits processor that records when each step's logits arrive (and, at the first
    step, keeps them); it returns the scores unchanged."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.first_logits: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.is_cuda:
            torch.cuda.synchronize(scores.device)
        self.stamps.append(time.perf_counter())
        if self.first_logits is None:
            self.first_logits = scores.detach().to("cpu", torch.float32, copy=True)
        return scores


class Generate:
    """Greedy ``model.generate`` of exactly ``new_tokens`` tokens after ``input_ids`` (the
    attention mask all ones); ``static_cache`` asks for ``cache_implementation="static"``
    (one prefill and one decode graph for a compiler, instead of a graph per cache length).
    ``figures()`` describes the last call."""

    def __init__(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        new_tokens: int,
        static_cache: bool = False,
    ) -> None:
        if new_tokens < 2:
            raise ValueError(f"decode needs at least 2 new tokens, got {new_tokens}")
        self.model = model
        self.input_ids = input_ids
        self.new_tokens = new_tokens
        self.static_cache = static_cache
        self.clock = StepClock()
        self.start = 0.0

    def options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "max_new_tokens": self.new_tokens,
            "min_new_tokens": self.new_tokens,
            "do_sample": False,
            "pad_token_id": 0,
            # the model is compiled, if at all, by the competitor, never by generate()
            "disable_compile": True,
        }
        if self.static_cache:
            options["cache_implementation"] = "static"
        return options

    def __call__(self) -> dict[str, torch.Tensor]:
        from transformers import LogitsProcessorList

        self.clock = StepClock()
        generate: Any = self.model.generate
        self.start = time.perf_counter()
        with torch.no_grad():
            sequences = generate(
                self.input_ids,
                attention_mask=torch.ones_like(self.input_ids),
                logits_processor=LogitsProcessorList([self.clock]),
                **self.options(),
            )
        if self.clock.first_logits is None:
            raise RuntimeError("generate() made no step")
        return {
            "tokens": sequences[:, self.input_ids.shape[1] :].cpu(),
            "first_logits": self.clock.first_logits,
        }

    def figures(self) -> dict[str, Any]:
        """Prefill ms, decode ms per step and tokens/s, each step's ms, of the last call."""
        stamps = self.clock.stamps
        batch = int(self.input_ids.shape[0])
        out: dict[str, Any] = {
            "batch": batch,
            "new_tokens": len(stamps),
            "forwards": len(stamps),
            "prefill_ms": 1e3 * (stamps[0] - self.start) if stamps else None,
            "step_ms": [1e3 * (b - a) for a, b in itertools.pairwise(stamps)],
        }
        decode_s = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
        steps = len(stamps) - 1
        out["decode_ms_per_step"] = 1e3 * decode_s / steps if decode_s > 0 else None
        out["decode_tokens_per_s"] = batch * steps / decode_s if decode_s > 0 else None
        return out
