"""generate: greedy generation with a Qwen3 model larger than its RAM budget.

The model is ``transformers.Qwen3ForCausalLM`` built from a config (no downloads) with random
weights from a fixed seed: hidden 1024, intermediate 3072, 16 heads (8 KV heads, head dim
128), vocab 32000, and as many layers as make about 1.5 GiB of parameters (21 in float32, 47
in bfloat16). Its dtype is bfloat16 where this machine's measured bf16 matmul rate is at least
its float32 rate, else float32 (measured once at the start: a few 1024x1024 matmuls of each;
``--dtype`` forces one); the JSON's ``precision`` records the rates and the choice. The RAM
budget is half the parameter bytes. Two regimes, batch 1 and batch 16: a random prompt of 64
tokens and exactly 32 new tokens, greedy (``do_sample=False``, ``min_new_tokens`` =
``max_new_tokens``).

Competitors, each regime in a fresh process of its own, in interleaved rounds (the harness of
``bench/offload/__init__.py``, which says what each holds in RAM):

- ``eager``: the whole model loaded, ``model.generate`` with the default (dynamic) KV cache,
  no budget and no memory limit: the reference figures and tokens (saved by the setup step).
- ``accelerate``: Accelerate's big-model inference under the limit:
  ``infer_auto_device_map(max_memory={"cpu": budget, "disk": ...},
  no_split_module_classes=["Qwen3DecoderLayer"])`` then ``load_checkpoint_and_dispatch(...,
  offload_folder=...)`` (what ``device_map="auto"`` does), ``model.generate`` with the
  default cache. It loads a sharded copy of the checkpoint (shards of at most 128 MiB with a
  Hugging Face index, ``--accelerate-shard-mib``), one shard at a time: from the single file
  ``load_checkpoint_and_dispatch`` holds every tensor in RAM at once during setup, which at
  1.5 GiB is over its limit.
- ``tensortorrent``: the model built on meta and bound to ``model.safetensors``
  (``tt.bind_checkpoint``: the ``checkpoint`` option binds a meta model in ``tt.compile``,
  not through ``torch.compile``), ``model.forward = torch.compile(model.forward,
  backend="tensortorrent", options={"budgets": {"cpu": budget}, "offload_dir": ...,
  "compiler": "eager", "checkpoint": ..., "objective": "throughput"})`` and ``model.generate(...,
  cache_implementation="static", disable_compile=True)``: the static cache makes one prefill
  and one decode graph. Its first call (which compiles both) is its compile seconds;
  ``explain`` of its graphs is in the JSON.

The limit (``--mem-limit``, default 1GiB here): every competitor but eager runs in a memory
cgroup of the budget plus that allowance, the page cache it fills included; one killed by it
is a failed competitor, recorded as such. Each process makes ``--warmup`` untimed calls, then
``--repeats`` timed calls with the page cache dropped before each (cold) and ``--repeats``
without (warm); a call is one ``generate()``, each of its steps timed by a logits processor
(``bench/offload/generation.py``).

Figures, per regime and competitor (medians over every call of every round, each round's
too): prefill ms (the start of generate() to the first token's logits), decode tokens/s
(batch x 31 over the time from the first new token to the last), peak RSS during the timed
calls, bytes read per step and per new token (``/proc/self/io`` read_bytes, and
TensorTorrent's reader), setup and compile seconds. The lower bound of a decode step is
max(eager's decode ms per step, (parameter bytes - budget) / the disk read rate measured in
the run); each competitor's decode tokens/s over the bound's. Ratios TensorTorrent /
Accelerate of decode tokens/s, cold and warm. Outputs: in float32 the greedy tokens must
equal eager's (the first step where they differ is recorded); in bf16 the first step's
logits must agree (cosine >= 0.99, argmax agreement >= 0.9). Targets (a benchmark, not a
test; ``targets`` in the JSON): TensorTorrent at least 2x Accelerate's decode tokens/s at
batch 1 and 3x at batch 16, its cold decode step within 1.15x of the bound.

Writes ``bench/results/generate.json`` (``generate_cuda.json`` with ``--device cuda:0``: the
budget on the GPU, GPU eager, CPU eager, Accelerate with ``max_memory={0: budget, "cpu":
...}``, TensorTorrent with ``budgets={"cuda:0": budget}``, no bound). ``--quick``: a 35M
parameter model (134 MiB in float32), a prompt of 16 tokens, 8 new tokens, one round: about
3 minutes on the 2-core development machine; the full size with 3 rounds is estimated at
25-35 minutes there (``--rounds 1``: about 10).

    python -m bench.generate [--rounds 3 --repeats 1 --mem-limit 1GiB --dtype auto
                              --quick --device cpu --out-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .hf_offload import SEED, Qwen3Workload, default_dtype
from .offload.runner import add_arguments, run_bench
from .offload.summary import summarize_generate_regime
from .offload.workload import generation_quality

NAME = "generate"
COMPETITORS = ("eager", "accelerate", "tensortorrent")
UNLIMITED = ("eager", "eager_cpu")
"""The reference: no budget and no memory limit."""
DEFAULT_REPEATS = 1
"""Cold and warm timed generate() calls per process (each is 32 forwards)."""
TARGET_BYTES = 3 << 29
"""About 1.5 GiB of parameters."""
MODEL = {
    "hidden": 1024,
    "intermediate": 3072,
    "heads": 16,
    "kv_heads": 8,
    "head_dim": 128,
    "vocab": 32000,
    "prompt": 64,
    "new_tokens": 32,
}
QUICK = {
    "hidden": 512,
    "layers": 6,
    "intermediate": 1536,
    "heads": 8,
    "kv_heads": 4,
    "head_dim": 64,
    "vocab": 16000,
    "prompt": 16,
    "new_tokens": 8,
}
CALL = (
    "a timed call is one greedy model.generate(input_ids, max_new_tokens=min_new_tokens="
    "new_tokens, do_sample=False): eager and Accelerate with the default (dynamic) KV cache, "
    "TensorTorrent with cache_implementation='static' and model.forward compiled by "
    "torch.compile(backend='tensortorrent'); a logits processor stamps each step (each step "
    "is one forward); TensorTorrent's compile_s is its first generate() call, which compiles "
    "the prefill and the decode graphs"
)
BATCHES = (1, 16)
TARGET_OVER_ACCELERATE = {1: 2.0, 16: 3.0}
"""TensorTorrent's decode tokens/s over Accelerate's, by batch."""
TARGET_STEP_OVER_BOUND = 1.15
"""TensorTorrent's cold decode step over the bound's, at most."""
ACCELERATE_SHARD_MIB = 128
"""Accelerate loads a sharded copy of the checkpoint (``--accelerate-shard-mib``): from the
single file, ``load_checkpoint_and_dispatch`` would hold every weight in RAM at once during
setup, over the memory limit."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def matmul_rates(device: str, size: int = 1024, repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of ``size`` x ``size`` matmuls on ``device`` per dtype: the median of
    ``repeats`` timed ones after one untimed."""
    rates = {}
    for name, dtype in DTYPES.items():
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        times = []
        for i in range(repeats + 1):
            start = time.perf_counter()
            torch.mm(a, b)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - start)
        rates[name] = 2 * size**3 / statistics.median(times) / 1e9
    return rates


def precision(device: str, forced: str) -> dict[str, Any]:
    """The model's dtype: bfloat16 where its measured matmul rate is at least float32's."""
    rates = matmul_rates(device)
    measured = "bfloat16" if rates["bfloat16"] >= rates["float32"] else "float32"
    return {
        "matmul_gflops": rates,
        "matmul": "1024x1024 torch.mm, median of 5 after 1 untimed, on " + device,
        "measured_choice": measured,
        "dtype": measured if forced == "auto" else forced,
        "chosen_by": "measured: bfloat16 when its rate is at least float32's"
        if forced == "auto"
        else "--dtype",
        "quality_check": "greedy tokens equal eager's"
        if (measured if forced == "auto" else forced) == "float32"
        else "first step's logits: cosine >= 0.99, argmax agreement >= 0.9",
    }


def layer_params(p: Mapping[str, Any]) -> tuple[int, int]:
    """Parameters of one decoder layer, and of the rest (embedding, final norm, lm head)."""
    hidden, head_dim = p["hidden"], p["head_dim"]
    attention = 2 * hidden * p["heads"] * head_dim + 2 * hidden * p["kv_heads"] * head_dim
    layer = attention + 3 * hidden * p["intermediate"] + 2 * hidden + 2 * head_dim
    return layer, 2 * p["vocab"] * hidden + hidden


def layers_for(p: Mapping[str, Any], dtype: torch.dtype, target: int = TARGET_BYTES) -> int:
    """Layers that make about ``target`` parameter bytes."""
    layer, rest = layer_params(p)
    size = torch.empty((), dtype=dtype).element_size()
    return max(1, round((target / size - rest) / layer))


class Qwen3Generate(Qwen3Workload):
    """The workload: a random-weight Qwen3 (``Qwen3ForCausalLM``, KV cache on) generating
    ``new_tokens`` tokens after a random prompt, one regime per batch."""

    name = NAME

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)
        self.dtype = DTYPES[params["dtype"]]
        self.new_tokens = int(params["new_tokens"])
        self.batches = {f"batch{b}": int(b) for b in params["batches"]}
        self.regimes = list(self.batches)

    def kv_cache_bytes(self, regime: str) -> int:
        """Keys and values of every layer for the prompt and every new token."""
        p = self.params
        positions = p["prompt"] + self.new_tokens
        size = torch.empty((), dtype=self.dtype).element_size()
        per_layer = 2 * self.batches[regime] * p["kv_heads"] * p["head_dim"] * positions
        return int(p["layers"] * per_layer * size)

    def _config(self, positions: int | None = None, use_cache: bool = True) -> Any:
        """The forward bench's config, long enough for the prompt and every new token, with
        a KV cache."""
        p = self.params
        longest = p["prompt"] + p["new_tokens"] if positions is None else positions
        return super()._config(longest, use_cache)

    def _new(self) -> torch.nn.Module:
        from transformers import Qwen3ForCausalLM

        with default_dtype(self.dtype):
            model: torch.nn.Module = Qwen3ForCausalLM(self._config())
        return model.eval()

    def inputs(self, regime: str) -> tuple[torch.Tensor, ...]:
        """The prompt: token ids in [1, vocab) (0 is the pad token)."""
        batch = self.batches[regime]
        generator = torch.Generator().manual_seed(SEED + batch)
        shape = (batch, self.params["prompt"])
        return (torch.randint(1, self.params["vocab"], shape, generator=generator),)

    def quality(self, got: Any, expected: Any) -> dict[str, Any]:
        return generation_quality(got, expected, exact=self.dtype == torch.float32)


def make_workload(params: Mapping[str, Any]) -> Qwen3Generate:
    return Qwen3Generate(params)


def targets(regime: Mapping[str, Any], batch: int | None) -> dict[str, Any]:
    """The bench's targets for TensorTorrent in one regime, and whether they were met."""
    ratios = regime["ratios"].get("tensortorrent", {})
    over = TARGET_OVER_ACCELERATE.get(batch or 0)
    got = ratios.get("decode_tokens_per_s_cold_over_accelerate")
    step = ratios.get("decode_step_over_bound_cold")
    return {
        "decode_tokens_per_s_over_accelerate": {
            "target": over,
            "cold": got,
            "warm": ratios.get("decode_tokens_per_s_warm_over_accelerate"),
            "met": None if over is None or got is None else got >= over,
        },
        "decode_step_over_bound": {
            "target": TARGET_STEP_OVER_BOUND,
            "cold": step,
            "met": None if step is None else step <= TARGET_STEP_OVER_BOUND,
        },
    }


def summarize(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    param_nbytes: int,
    budget: int,
    disk_bw: float | None,
    cuda: bool,
) -> dict[str, Any]:
    """The harness's summary of generate() calls, with the bench's targets."""
    out = summarize_generate_regime(runs, param_nbytes, budget, disk_bw, cuda)
    batches = [r["generate"]["batch"] for r in out["competitors"].values() if "generate" in r]
    out["targets"] = targets(out, batches[0] if batches else None)
    return out


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_summary(name: str, payload: Mapping[str, Any]) -> None:
    """A table per regime: prefill, decode tokens/s, peak RSS, bytes read, the bound."""
    mib = 2**20
    limit = payload.get("mem_limit") or {}
    precision = payload["precision"]
    rates = ", ".join(f"{k} {v:.1f}" for k, v in precision["matmul_gflops"].items())
    print(
        f"{name}: {payload['param_bytes'] / mib:.0f} MiB of {precision['dtype']} parameters "
        f"(matmul GFLOP/s: {rates}), budget {payload['budget_bytes'] / mib:.0f} MiB, "
        + (
            f"memory limit {limit['limit_bytes'] / mib:.0f} MiB but for eager"
            if "limit_bytes" in limit
            else f"no memory limit ({limit.get('skipped', 'not asked')})"
        )
        + f"; disk {_f((payload['disk']['read_bytes_per_s'] or 0) / 1e9, '.2f')} GB/s"
    )
    head = (
        f"  {'competitor':<16}{'tokens':>10}{'prefill ms':>12}{'decode tok/s':>14}"
        f"{'(warm)':>9}{'peak RSS MiB':>14}{'MiB read/token':>16}{'tok/s / bound':>15}"
    )
    for regime, data in payload["regimes"].items():
        bound = data["lower_bound"]
        print(
            f"{name} {regime}: bound {_f(bound.get('step_ms'), '.1f')} ms per decode step = "
            f"{_f(bound.get('decode_tokens_per_s'), '.2f')} tok/s (cold medians)"
        )
        print(head)
        for competitor, row in data["competitors"].items():
            if not row.get("ok") and "generate" not in row:
                print(f"  {competitor:<16}failed: {str(row.get('error'))[:200]}")
                continue
            gen = row["generate"]
            quality = row["quality"]
            tokens = (
                "equal"
                if quality.get("tokens_equal")
                else f"differ@{quality.get('first_difference')}"
            )
            peak = max(row["peak_rss_cold_calls_bytes"] or 0, row["peak_rss_warm_calls_bytes"] or 0)
            read = gen.get("io_read_bytes_per_new_token_cold")
            over = data["ratios"].get(competitor, {}).get("decode_tokens_per_s_over_bound_cold")
            print(
                f"  {competitor:<16}{tokens:>10}{_f(gen['prefill_ms_cold'], '.1f'):>12}"
                f"{_f(gen['decode_tokens_per_s_cold'], '.2f'):>14}"
                f"{_f(gen['decode_tokens_per_s_warm'], '.2f'):>9}{peak / mib:>14.0f}"
                f"{_f(None if read is None else read / mib, '.2f'):>16}{_f(over, '.2f'):>15}"
            )
            if row.get("disk_busy_share_cold") is not None:
                rate = (row.get("disk_read_bytes_per_s_while_busy_cold") or 0) / 1e9
                print(
                    f"  {'':<16}disk busy {100 * row['disk_busy_share_cold']:.0f}% of a cold "
                    f"generate(), reading {_f(rate, '.2f')} GB/s meanwhile"
                )
        aims = data["targets"]
        accel, step = aims["decode_tokens_per_s_over_accelerate"], aims["decode_step_over_bound"]
        print(
            f"  tensortorrent / accelerate decode tok/s: cold {_f(accel['cold'], '.2f')}x, warm "
            f"{_f(accel['warm'], '.2f')}x (target {_f(accel['target'], '.0f')}x: "
            f"{accel['met']}); decode step / bound {_f(step['cold'], '.2f')}x (target <= "
            f"{step['target']}x: {step['met']})"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for key in ("layers", *MODEL):
        flag = "--" + key.replace("_", "-")
        parser.add_argument(flag, type=int, default=None, help=f"default {MODEL.get(key)}")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 16")
    parser.add_argument(
        "--dtype",
        choices=["auto", *DTYPES],
        default="auto",
        help="the model's dtype (default: bfloat16 where its measured matmul rate is at least "
        "float32's)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda:N for a VRAM budget")
    add_arguments(parser, default_repeats=DEFAULT_REPEATS)
    parser.set_defaults(mem_limit="1GiB", accelerate_shard_mib=ACCELERATE_SHARD_MIB)
    args = parser.parse_args(argv)
    chosen = precision(args.device, args.dtype)
    print(
        f"{NAME}: matmul GFLOP/s "
        + ", ".join(f"{k} {v:.1f}" for k, v in chosen["matmul_gflops"].items())
        + f": the model is {chosen['dtype']} ({chosen['chosen_by']})"
    )
    base = QUICK if args.quick else MODEL
    params: dict[str, Any] = {key: getattr(args, key) or base.get(key) for key in MODEL}
    params["dtype"] = chosen["dtype"]
    params["layers"] = (
        args.layers or base.get("layers") or layers_for(params, DTYPES[chosen["dtype"]])
    )
    params["batches"] = list(args.batches or BATCHES)
    run_bench(
        NAME,
        "bench.generate:make_workload",
        params,
        args,
        args.repeats or DEFAULT_REPEATS,
        COMPETITORS,
        device=args.device,
        disk_mib=64 if args.quick else 256,
        summarize=summarize,
        unlimited=UNLIMITED,
        extra={
            "call": CALL,
            "precision": chosen,
            "targets_definition": targets_definition(),
        },
        report=print_summary,
    )


def targets_definition() -> str:
    return (
        "per regime (targets): TensorTorrent's cold decode tokens/s over Accelerate's at least "
        f"{TARGET_OVER_ACCELERATE[1]:.0f}x at batch 1 and {TARGET_OVER_ACCELERATE[16]:.0f}x at "
        f"batch 16, its cold decode step at most {TARGET_STEP_OVER_BOUND}x the bound's; a "
        "benchmark's aims, not a test"
    )


if __name__ == "__main__":
    main()
