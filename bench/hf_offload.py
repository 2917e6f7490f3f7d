"""hf_offload: a Qwen3-architecture model with random weights, larger than its budget.

The model is ``transformers.Qwen3ForCausalLM`` built from a config (no downloads) in
bfloat16 with a fixed seed, called as ``model(input_ids) -> logits`` with
``use_cache=False`` (a subclass whose ``forward`` returns the logits, so the checkpoint keeps
the usual Hugging Face key names). Default: hidden 1024, 8 layers, intermediate 3072, 16
heads (8 KV heads, head dim 128), vocab 32000 (383 MB of parameters); one regime, batch 1 x
32 tokens; the budget is half the parameter bytes (``--budget`` to set it).

Competitors, each in its own fresh process (what each holds in RAM, RSS and page cache:
``bench/offload/__init__.py``): eager with no budget (reference), Accelerate
(``infer_auto_device_map`` with ``no_split_module_classes=["Qwen3DecoderLayer"]`` then
``load_checkpoint_and_dispatch``), TensorTorrent from ``model.safetensors`` on a model built
under ``accelerate.init_empty_weights(include_buffers=False)`` (so the rotary ``inv_freq``
buffers stay real). Quality against eager's logits: cosine similarity of the flattened
float32 logits and per-position argmax agreement; pass = cosine >= 0.99 and agreement >= 0.9
(bf16).

Three rounds of the competitors' processes, interleaved (see ``bench/offload/__init__.py``):
about 2.5 minutes on the 2-core development machine.

With ``--device cuda:0`` (bench/gpu_check.sh) the budget is on the GPU: GPU eager, CPU eager,
Accelerate with ``max_memory={0: budget, "cpu": ...}`` and TensorTorrent with
``budgets={"cuda:0": budget}``.

    python -m bench.hf_offload [--layers 8 --hidden 1024 --seq 32 --repeats 3 --rounds 3
                                --quick --device cpu --budget BYTES --out-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from .offload.runner import DEFAULT_REPEATS, add_arguments, run_bench
from .offload.workload import logits_quality

SEED = 0
COMPETITORS = ("eager", "accelerate", "tensortorrent")
DEFAULTS = {
    "hidden": 1024,
    "layers": 8,
    "intermediate": 3072,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 32000,
    "batch": 1,
    "seq": 32,
}
QUICK = {**DEFAULTS, "layers": 4, "vocab": 16000}


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class Qwen3Workload:
    """The workload: a random-weight Qwen3 returning logits, one regime of token ids."""

    name = "hf_offload"
    dtype = torch.bfloat16
    no_split_module_classes = ["Qwen3DecoderLayer"]

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)
        self.regimes = [f"batch{params['batch']}_seq{params['seq']}"]

    def _config(self, positions: int | None = None, use_cache: bool = False) -> Any:
        """The model's config; ``positions`` (default the sequence length) sets the largest
        position (at least 512), ``use_cache`` the KV cache."""
        from transformers import Qwen3Config

        p = self.params
        return Qwen3Config(
            hidden_size=p["hidden"],
            num_hidden_layers=p["layers"],
            intermediate_size=p["intermediate"],
            num_attention_heads=p["heads"],
            num_key_value_heads=p["kv_heads"],
            head_dim=p["head_dim"],
            vocab_size=p["vocab"],
            max_position_embeddings=max(512, p["seq"] if positions is None else positions),
            tie_word_embeddings=False,
            use_cache=use_cache,
        )

    def _new(self) -> torch.nn.Module:
        from transformers import Qwen3ForCausalLM

        class Qwen3Logits(Qwen3ForCausalLM):  # type: ignore[misc]
            """``model(input_ids)`` is the logits tensor, without a KV cache."""

            def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
                return super().forward(input_ids=input_ids, use_cache=False).logits

        with default_dtype(self.dtype):
            model: torch.nn.Module = Qwen3Logits(self._config())
        return model.eval()

    def build(self) -> torch.nn.Module:
        torch.manual_seed(SEED)
        return self._new()

    def build_meta(self) -> torch.nn.Module:
        from accelerate import init_empty_weights

        with init_empty_weights(include_buffers=False):
            return self._new()

    def inputs(self, regime: str) -> tuple[torch.Tensor, ...]:
        generator = torch.Generator().manual_seed(SEED)
        shape = (self.params["batch"], self.params["seq"])
        return (torch.randint(0, self.params["vocab"], shape, generator=generator),)

    def quality(self, got: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
        return logits_quality(got, expected)


def make_workload(params: Mapping[str, Any]) -> Qwen3Workload:
    return Qwen3Workload(params)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for key, value in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help=f"default {value}")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N for a VRAM budget")
    add_arguments(parser)
    args = parser.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    params = {key: getattr(args, key) or value for key, value in base.items()}
    repeats = args.repeats or DEFAULT_REPEATS
    run_bench(
        "hf_offload",
        "bench.hf_offload:make_workload",
        params,
        args,
        repeats,
        COMPETITORS,
        device=args.device,
        disk_mib=64 if args.quick else 256,
    )


if __name__ == "__main__":
    main()
