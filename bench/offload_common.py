"""The harness of the offload benches (ram_offload, hf_offload), in one place.

A model whose parameters are larger than a memory budget is run by eager PyTorch with no
budget (the reference), by Accelerate with the budget and the rest offloaded, and by
TensorTorrent with the same budget. Every competitor runs each regime in a fresh Python
process of its own (``python -m bench.offload_common run SPEC OUT``), so that its peak RSS
is its own and nothing is left over from another regime.

One run of a bench, from the parent process:

1. Setup, in a subprocess: the model is built with real weights from a fixed seed, saved
   once as ``model.safetensors`` in the work directory, and each regime's inputs and
   eager's outputs are saved to ``reference.pt``. Every competitor loads its weights from
   that one file; none of them builds random weights.
2. The disk's read bandwidth is measured at the offload directory with the project's own
   ``DiskBench`` (one stream of O_DIRECT reads where the filesystem allows it; the method is
   recorded), before the competitors and again after them.
3. ``--rounds`` rounds (3 at full size, 1 with ``--quick``). Each round first reads
   ``model.safetensors`` cold with the project's own ``DiskReader`` (every tensor submitted at
   once, its default 4 threads; the bandwidth TensorTorrent's reader reaches on this very
   file), then runs every (regime, competitor) process, odd rounds in one order and even
   rounds in the reverse (``schedule``), so that the disk's and the CPU's drift over minutes
   on a shared host hits the competitors alike. Each process is fresh and builds the model on
   the meta device (parameters on ``meta``, buffers real), loads what it needs (setup
   seconds), compiles if it does (compile seconds), makes warm-up calls (excluded, their
   count recorded), ``repeats`` timed calls with the page cache dropped before each
   (``sync; echo 3 > /proc/sys/vm/drop_caches``: the cold figure) and ``repeats`` timed calls
   without dropping it (the warm figure). Every call's output is checked against eager's
   saved output. A competitor that fails records its error and the bench goes on (a round
   that failed fails the competitor). Where the cache cannot be dropped (not root), the JSON
   says ``page cache not dropped: <why>``.
4. The parent writes the JSON (``bench.common``): per regime and competitor the medians over
   every timed call of every round (cold and warm), each round's medians (``rounds``, with
   when each process started, so drift shows), setup and compile seconds as the median over
   rounds and RSS figures as the max over rounds. Ratios come three ways: the headline is the
   median over rounds of each round's ratio (both figures of a round were measured minutes
   apart at most), ``*_pooled`` the ratio of the pooled medians, ``*_by_round`` each round's.
   The lower bound is max(eager's warm time, streamed bytes / the highest read bandwidth
   measured in the run, by DiskBench or DiskReader); a competitor more than ``BOUND_NOISE``
   under its bound is listed as a violation: the rate was underestimated.

What each competitor holds in RAM (CPU mode; all hold the inputs and activations):

- ``eager``: every parameter, as anonymous memory: ``safetensors.torch.load_file`` reads the
  whole checkpoint (with ``pread``, not a mapping of the file) and the meta model takes the
  tensors (``load_state_dict(assign=True)``).
- ``accelerate``: ``infer_auto_device_map(max_memory={"cpu": budget, "disk": ...})`` then
  ``load_checkpoint_and_dispatch``, Accelerate's documented way to run a model whose weights
  do not fit. Modules mapped to ``"cpu"`` are resident tensors (Accelerate keeps room in the
  budget for the largest layer, so fewer than ``budget`` bytes). Modules mapped to ``"disk"``
  are written at setup as ``.dat`` files in the offload directory and, during each forward,
  read one module at a time (``np.memmap`` copied into a tensor) and dropped after it. Note
  that ``load_checkpoint_and_dispatch`` on a single-file checkpoint reads every tensor of it
  into RAM before writing the disk part, so its setup peak (``peak_rss_setup_bytes``) is
  more than the whole model; its peak during calls (``peak_rss_cold_calls_bytes``) is the
  honest steady state. Warm calls read the ``.dat`` files from the page cache.
- ``tensortorrent``: the meta model bound to ``model.safetensors`` (``checkpoint=``); the
  plan decides which parameters stay in host RAM within the budget, the rest is read from
  disk when needed. It never holds all weights at once, so it is the main TensorTorrent
  figure.
- ``tensortorrent_in_memory``: the real model loaded as for eager, then ``tt.compile`` with
  the budget and an ``offload_dir``: its lifetime peak includes the whole model (it was
  given the whole model), its peak during calls shows what it kept.

CUDA mode (``--device cuda:0``, the GPU check): the budget is on the accelerator; ``eager``
runs on it with every weight resident, ``eager_cpu`` is CPU eager, Accelerate gets
``max_memory={0: budget, "cpu": ...}`` and TensorTorrent ``budgets={"cuda:0": budget}``.

RSS figures (bytes, from ``/proc/self/status``): ``rss_baseline_bytes`` after the imports and
the meta model, before any weight is loaded; ``peak_rss_setup_bytes`` the peak up to the
end of setup; ``peak_rss_bytes`` the process's lifetime peak (``ru_maxrss`` and every
``VmHWM`` seen); ``peak_rss_{cold,warm}_calls_bytes`` the peak over the timed calls (``VmHWM``
after resetting it through ``/proc/self/clear_refs``) and ``rss_growth_*`` each over the
baseline. RSS counts file pages mapped into the process (``RssFile``, recorded apart), so
a competitor that keeps a checkpoint mapped is charged for the pages it touched; note too
that ``drop_caches`` cannot evict pages that a process keeps mapped. ``io_read_bytes`` per
call is the kernel's count of bytes the process fetched from storage (``/proc/self/io``), an
independent check of each competitor's disk traffic.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from .common import RESULTS, write_results

DROP_CACHES = Path("/proc/sys/vm/drop_caches")
CLEAR_REFS = Path("/proc/self/clear_refs")
CHECKPOINT = "model.safetensors"
REFERENCE = "reference.pt"
MAIN_TT = "tensortorrent"
"""The TensorTorrent competitor whose figures are the bench's headline ratios."""
CUDA_COMPETITORS = ("eager_cpu", "eager", "accelerate", "tensortorrent")
"""The competitors of the CUDA mode (the budget on the GPU)."""
FP32_RTOL, FP32_ATOL = 1.3e-6, 1e-5
"""``torch.testing.assert_close``'s default tolerances for float32."""
DISK_UNBOUNDED = 1 << 50
"""Accelerate's ``max_memory`` for the tier that takes whatever the budget leaves."""


# --- What a bench supplies ----------------------------------------------------------------


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

    def quality(self, got: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
        """How ``got`` compares with eager's output: at least ``ok`` and ``max_abs_diff``."""


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
    worst["ok"] = not failed
    # a check that is itself a worst of several calls counts its calls
    worst["calls_checked"] = sum(c.get("calls_checked", 1) for c in checks)
    return worst


# --- Measurements inside a competitor's process ------------------------------------------


def drop_page_cache(path: Path = DROP_CACHES) -> str | None:
    """``sync; echo 3 > drop_caches``; ``None`` when done, else why the cache was kept."""
    try:
        os.sync()
        with open(path, "w") as f:
            f.write("3\n")
    except OSError as exc:
        return f"page cache not dropped: cannot write {path} ({exc.strerror or exc})"
    return None


def proc_status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile and RssShmem of this process, in bytes."""
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in keys:
                out[name] = int(rest.split()[0]) * 1024
    return out


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0)."""
    try:
        CLEAR_REFS.write_text("5\n")
    except OSError:
        return False
    return True


def io_read_bytes() -> int | None:
    """Bytes this process caused to be fetched from storage (``/proc/self/io``)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return None


def lifetime_peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def load_checkpoint_into(model: torch.nn.Module, checkpoint: Path) -> torch.nn.Module:
    """Give a meta model the checkpoint's tensors, all of them in anonymous memory.

    safetensors >= 0.8 maps the file by default (the weights would then be page cache pages
    mapped into the process); ``backend="pread"`` reads them into memory of their own.
    """
    from safetensors.torch import load_file

    try:
        state = load_file(str(checkpoint), backend="pread")
    except TypeError:  # an older safetensors: copy out of the mapping
        state = {k: v.clone() for k, v in load_file(str(checkpoint)).items()}
    model.load_state_dict(state, assign=True)
    return model.eval()


# --- The competitors ----------------------------------------------------------------------

Call = Callable[[], torch.Tensor]


class Context:
    """What a competitor is told: the workload, files, budget and device."""

    def __init__(self, spec: Mapping[str, Any], workload: Workload) -> None:
        self.workload = workload
        self.checkpoint = Path(spec["checkpoint"])
        self.offload_dir = Path(spec["offload_dir"])
        self.budget = int(spec["budget_bytes"])
        self.device = str(spec["device"])
        self.cuda = self.device.startswith("cuda")


class Competitor:
    """One way of running the model on one regime: ``setup`` (its seconds are the setup
    figure), then ``prepare`` (the compile figure), then the calls."""

    holds = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.device = ctx.device
        """Where the model runs and its inputs are put."""
        self.model: torch.nn.Module | None = None
        self.info: dict[str, Any] = {}

    def imports(self) -> None:
        """Import what this competitor needs (before the RSS baseline)."""

    def setup(self, model: torch.nn.Module) -> None:
        """Load weights / dispatch the model."""

    def prepare(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Call:
        """A call of the model on ``inputs`` (compiling for them if this competitor does)."""
        module = model if self.model is None else self.model
        return lambda: module(*inputs)

    def after_call(self) -> dict[str, Any]:
        """Figures of the call just made (e.g. bytes read from disk)."""
        return {}

    def regime_info(self) -> dict[str, Any]:
        """Figures of the regime after its calls (e.g. the plan)."""
        return {}


class Eager(Competitor):
    holds = (
        "every parameter, as anonymous memory (safetensors.torch.load_file of the whole "
        "checkpoint, assigned to the meta model)"
    )

    def setup(self, model: torch.nn.Module) -> None:
        self.model = load_checkpoint_into(model, self.ctx.checkpoint).to(self.device)


class EagerCpu(Eager):
    holds = Eager.holds + "; runs on the CPU whatever the bench's device"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.device = "cpu"


class Accelerate(Competitor):
    holds = (
        "modules its device_map puts on 'cpu' as resident tensors; modules on 'disk' are "
        ".dat files in the offload dir, each read (np.memmap copied into a tensor) for its "
        "forward and dropped after it; load_checkpoint_and_dispatch reads the whole "
        "single-file checkpoint into RAM during setup"
    )

    def imports(self) -> None:
        import accelerate  # noqa: F401

    def setup(self, model: torch.nn.Module) -> None:
        from accelerate import infer_auto_device_map, load_checkpoint_and_dispatch

        ctx = self.ctx
        max_memory: dict[int | str, int] = (
            {int(self.device.partition(":")[2] or 0): ctx.budget, "cpu": DISK_UNBOUNDED}
            if ctx.cuda
            else {"cpu": ctx.budget, "disk": DISK_UNBOUNDED}
        )
        device_map = infer_auto_device_map(
            model,
            max_memory=max_memory,
            no_split_module_classes=ctx.workload.no_split_module_classes,
            dtype=ctx.workload.dtype,
        )
        self.info["max_memory"] = {str(k): v for k, v in max_memory.items()}
        self.info["device_map"] = {k: str(v) for k, v in device_map.items()}
        self.info["device_map_split"] = device_map_split(model, device_map)
        self.model = load_checkpoint_and_dispatch(
            model,
            str(ctx.checkpoint),
            device_map=device_map,
            offload_folder=str(ctx.offload_dir),
        )


def device_map_split(model: torch.nn.Module, device_map: Mapping[str, Any]) -> dict[str, Any]:
    """Per device of a device_map: modules holding parameters, and their parameter bytes."""
    split: dict[str, dict[str, int]] = {}
    sizes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    for module, device in device_map.items():
        prefix = f"{module}." if module else ""
        nbytes = sum(n for name, n in sizes.items() if name.startswith(prefix))
        if nbytes:
            row = split.setdefault(str(device), {"modules": 0, "param_bytes": 0})
            row["modules"] += 1
            row["param_bytes"] += nbytes
    return split


class TensorTorrent(Competitor):
    holds = (
        "the meta model bound to model.safetensors (checkpoint=): the plan keeps parameters "
        "in host RAM within the budget and reads the rest from disk; never all weights at once"
    )

    use_checkpoint = True
    compiled: Any = None

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # Inputs stay on the host, as for the model: the plan places the work.
        self.device = "cpu"

    def imports(self) -> None:
        import tensortorrent  # noqa: F401

    def options(self) -> dict[str, Any]:
        ctx = self.ctx
        options: dict[str, Any] = {
            "budgets": {ctx.device if ctx.cuda else "cpu": ctx.budget},
            "offload_dir": str(ctx.offload_dir),
            "compiler": "eager",
        }
        if ctx.cuda:
            options["devices"] = [ctx.device]
        if self.use_checkpoint:
            options["checkpoint"] = str(ctx.checkpoint)
        return options

    def prepare(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Call:
        import tensortorrent as tt

        source = model if self.model is None else self.model
        compiled = tt.compile(source, example_inputs=inputs, **self.options())
        self.compiled = compiled
        return lambda: compiled(*inputs)

    def after_call(self) -> dict[str, Any]:
        return {"disk_bytes_read": int(self.compiled.disk_bytes_read())}

    def regime_info(self) -> dict[str, Any]:
        return {"explain": self.compiled.explain()}


class TensorTorrentInMemory(TensorTorrent):
    holds = (
        "the real model loaded as for eager (all weights), then tt.compile with the budget "
        "and offload_dir: the lifetime peak includes the whole model"
    )
    use_checkpoint = False

    def setup(self, model: torch.nn.Module) -> None:
        self.model = load_checkpoint_into(model, self.ctx.checkpoint)


COMPETITORS: dict[str, type[Competitor]] = {
    "eager": Eager,
    "eager_cpu": EagerCpu,
    "accelerate": Accelerate,
    "tensortorrent": TensorTorrent,
    "tensortorrent_in_memory": TensorTorrentInMemory,
}


# --- A competitor's process ----------------------------------------------------------------


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_calls(
    call: Call,
    competitor: Competitor,
    expected: torch.Tensor,
    workload: Workload,
    count: int,
    drop: bool,
    peaks: PeakRss,
) -> dict[str, Any]:
    """``count`` timed calls; with ``drop``, the page cache is dropped before each."""
    times: list[float] = []
    per_call: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    notes: set[str] = set()
    reset = peaks.reset()
    for _ in range(count):
        if drop:
            problem = drop_page_cache()
            if problem:
                notes.add(problem)
        io_before = io_read_bytes()
        start = time.perf_counter()
        out = call()
        synchronize(competitor.ctx.device)
        times.append(time.perf_counter() - start)
        io_after = io_read_bytes()
        extra = competitor.after_call()
        if io_before is not None and io_after is not None:
            extra["io_read_bytes"] = io_after - io_before
        per_call.append(extra)
        checks.append(workload.quality(out, expected))
        del out
    status = proc_status()
    return {
        "times_ms": [1e3 * t for t in times],
        "median_ms": 1e3 * statistics.median(times) if times else None,
        "per_call": per_call,
        "quality": worst_quality(checks),
        "peak_rss_calls_bytes": status.get("VmHWM") if reset else None,
        "rss_after_calls": status,
        "page_cache": sorted(notes)[0] if notes else ("dropped" if drop else "not dropped"),
    }


class PeakRss:
    """The process's peak RSS over spans: VmHWM is reset at the start of each span, and the
    lifetime peak is kept here (a reset lowers ``ru_maxrss`` too)."""

    def __init__(self) -> None:
        self.seen = 0

    def reset(self) -> bool:
        self.seen = max(self.seen, proc_status().get("VmHWM", 0))
        return reset_peak_rss()

    def lifetime(self) -> int:
        return max(self.seen, proc_status().get("VmHWM", 0), lifetime_peak_rss())


def run_competitor(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a competitor's process measures on one regime (see the module docstring)."""
    torch.set_grad_enabled(False)
    workload = load_workload(spec["workload"], spec["params"])
    ctx = Context(spec, workload)
    competitor = COMPETITORS[spec["competitor"]](ctx)
    competitor.imports()
    reference = torch.load(spec["reference"], weights_only=True)[spec["regime"]]
    model = workload.build_meta()
    peaks = PeakRss()
    baseline = proc_status()
    start = time.perf_counter()
    competitor.setup(model)
    setup_s = time.perf_counter() - start
    after_setup = proc_status()
    inputs = tuple(t.to(competitor.device) for t in reference["inputs"])
    expected = reference["output"]
    start = time.perf_counter()
    call = competitor.prepare(model, inputs)
    compile_s = time.perf_counter() - start
    warm_checks = [workload.quality(call(), expected) for _ in range(spec["warmup"])]
    synchronize(ctx.device)
    drop = bool(spec["drop_caches"])
    cold = timed_calls(call, competitor, expected, workload, spec["repeats"], drop, peaks)
    warm = timed_calls(call, competitor, expected, workload, spec["repeats"], False, peaks)
    for phase in (cold, warm):
        peak, base = phase["peak_rss_calls_bytes"], baseline.get("VmRSS")
        phase["rss_growth_bytes"] = peak - base if peak and base else None
    quality = worst_quality([*warm_checks, cold["quality"], warm["quality"]])
    return {
        "ok": quality["ok"],
        "holds_in_ram": competitor.holds,
        "rss_baseline": baseline,
        "setup_s": setup_s,
        "rss_after_setup": after_setup,
        "compile_s": compile_s,
        "warmup_calls": spec["warmup"],
        "cold": cold,
        "warm": warm,
        "quality": quality,
        "peak_rss_bytes": peaks.lifetime(),
        "info": competitor.info,
        **competitor.regime_info(),
    }


def child_main(spec_path: Path, out_path: Path) -> int:
    spec = json.loads(spec_path.read_text())
    try:
        result = run_competitor(spec)
    except Exception as exc:
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0]
        result = {"ok": False, "error": f"{type(exc).__name__}: {first}"}
    out_path.write_text(json.dumps(result, indent=1))
    return 0


def setup_main(spec_path: Path, out_path: Path) -> int:
    """Build the seeded model, save the checkpoint, the inputs and eager's outputs."""
    from safetensors.torch import save_file

    spec = json.loads(spec_path.read_text())
    torch.set_grad_enabled(False)
    work = Path(spec["work_dir"])
    start = time.perf_counter()
    workload = load_workload(spec["workload"], spec["params"])
    model = workload.build().eval()
    built_s = time.perf_counter() - start
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(work / CHECKPOINT), metadata={"format": "pt"})
    del state
    saved_s = time.perf_counter() - start - built_s
    reference = {}
    for regime in workload.regimes:
        inputs = workload.inputs(regime)
        reference[regime] = {"inputs": list(inputs), "output": model(*inputs)}
    torch.save(reference, work / REFERENCE)
    out_path.write_text(
        json.dumps(
            {
                "param_bytes": param_bytes(model),
                "checkpoint_bytes": (work / CHECKPOINT).stat().st_size,
                "build_s": built_s,
                "save_s": saved_s,
                "seconds": time.perf_counter() - start,
                "input_shapes": {
                    r: [list(t.shape) for t in v["inputs"]] for r, v in reference.items()
                },
            }
        )
    )
    return 0


# --- The parent -----------------------------------------------------------------------------


DEFAULT_REPEATS = 3
"""Cold and warm timed calls per process."""
DEFAULT_ROUNDS = 3
"""Rounds of every competitor's processes at full size (``--quick``: 1)."""
BOUND_NOISE = 0.10
"""A competitor whose cold median is more than this fraction under its lower bound beat
the bound by more than noise: the bound's disk rate is underestimated and the JSON says so."""
RATIO_KEYS = ("over_accelerate_cold", "over_accelerate_warm", "over_lower_bound_cold")
"""The headline ratios of the main TensorTorrent competitor (the bench's ``figure``)."""


def add_arguments(parser: argparse.ArgumentParser, default_repeats: int = DEFAULT_REPEATS) -> None:
    """Options every offload bench has."""
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"cold and warm timed calls per process (default {default_repeats})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of every competitor's processes, interleaved: round 2 runs them in the "
        f"reverse order, round 3 as round 1, ... (default {DEFAULT_ROUNDS}; 1 with --quick)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per process")
    parser.add_argument("--quick", action="store_true", help="smaller model, one round")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="work directory: checkpoint, reference outputs, offload dirs, logs "
        "(default bench/results/tmp/<bench>)",
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="directory of the JSON (default bench/results)"
    )
    parser.add_argument(
        "--competitors", nargs="+", default=None, choices=sorted(COMPETITORS), help="subset"
    )
    parser.add_argument(
        "--no-drop", action="store_true", help="do not drop the page cache (cold = warm then)"
    )
    parser.add_argument(
        "--budget", default=None, help="the memory budget, e.g. 512MiB (default: a fraction)"
    )
    parser.add_argument(
        "--budget-fraction",
        type=float,
        default=0.5,
        help="the budget as a fraction of the parameter bytes (default 0.5)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    parser.add_argument(
        "--disk-mib", type=int, default=None, help="size of the DiskBench probe file"
    )


def _subprocess(
    command: str, spec: Mapping[str, Any], work: Path, label: str, timeout: float
) -> tuple[dict[str, Any] | None, str | None, float]:
    """Run ``python -m bench.offload_common COMMAND`` in a fresh process; its JSON or error."""
    spec_path = work / f"{label}.spec.json"
    out_path = work / f"{label}.result.json"
    log_path = work / "logs" / f"{label}.log"
    log_path.parent.mkdir(exist_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    out_path.unlink(missing_ok=True)
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    start = time.perf_counter()
    error = None
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "bench.offload_common", command, spec_path, out_path],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
            if proc.returncode:
                error = f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - start
    result = json.loads(out_path.read_text()) if out_path.is_file() else None
    if error or result is None:
        tail = log_path.read_text().strip().splitlines()[-5:]
        error = f"{error or 'no result written'}; log {log_path}: " + " | ".join(tail)
    return result, error, seconds


# --- The disk's read bandwidth ----------------------------------------------------------------


def measure_disk(directory: Path, mib: int) -> dict[str, Any]:
    """Read (and write) bandwidth at ``directory``, by the project's ``DiskBench``."""
    from tensortorrent_dynamo.profile.disk import BLOCK_BYTES, DiskBench

    directory.mkdir(parents=True, exist_ok=True)
    try:
        bench = DiskBench(directory, max(mib << 20, 2 * BLOCK_BYTES), 5, 50, 20.0)
        try:
            write, read = bench.write(), bench.read()
        finally:
            bench.close()
    except OSError as exc:
        return {"read_bytes_per_s": None, "error": str(exc)}
    return {"read_bytes_per_s": read.value, "read": read.to_dict(), "write": write.to_dict()}


def measure_reader(checkpoint: Path, drop: bool) -> dict[str, Any]:
    """Read the whole checkpoint cold with the project's own ``DiskReader``; bytes per second.

    Every tensor is submitted at once to one reader (its default threads and chunks) and all
    are waited for. Two passes, the page cache dropped before each (unless ``drop`` is
    false): the first allocates the buffers (``fresh``), the second reuses them from the
    pool (``pooled``), as a reader streaming the same model call after call does. The
    figure is the faster pass.
    """
    from tensortorrent_dynamo.io.pool import HostBufferPool
    from tensortorrent_dynamo.io.reader import DEFAULT_CHUNK_BYTES, DEFAULT_READ_THREADS, DiskReader
    from tensortorrent_dynamo.io.safetensors import safetensors_locations

    passes: list[dict[str, Any]] = []
    try:
        locations = list(safetensors_locations(checkpoint).values())
        pool = HostBufferPool()
        for buffers in ("fresh", "pooled"):
            note = drop_page_cache() if drop else "page cache not dropped: --no-drop was given"
            with DiskReader(pool) as reader:
                start = time.perf_counter()
                futures = [reader.submit(loc) for loc in locations]
                reads = [future.result() for future in futures]
                seconds = time.perf_counter() - start
                nbytes = reader.bytes_read
            for read in reads:
                pool.give(read.buffer)
            del reads
            passes.append(
                {
                    "buffers": buffers,
                    "bytes": nbytes,
                    "seconds": seconds,
                    "bytes_per_s": nbytes / seconds if seconds > 0 else None,
                    "page_cache": note or "dropped",
                }
            )
        pool.trim()
    except Exception as exc:  # a failed measurement is recorded; the bench goes on
        return {"read_bytes_per_s": None, "passes": passes, "error": f"{type(exc).__name__}: {exc}"}
    rates = [p["bytes_per_s"] for p in passes if p["bytes_per_s"]]
    return {
        "read_bytes_per_s": max(rates) if rates else None,
        "tensors": len(locations),
        "tensor_bytes": sum(loc.nbytes for loc in locations),
        "threads": DEFAULT_READ_THREADS,
        "chunk_bytes": DEFAULT_CHUNK_BYTES,
        "passes": passes,
    }


def disk_figures(
    before: dict[str, Any], after: dict[str, Any], reader: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Every read bandwidth measured in the run, and the one the lower bound uses: the
    highest (a shared machine only ever makes the disk look slower)."""
    measured = [("diskbench_before", before), ("diskbench_after", after)]
    measured += [(f"disk_reader_round_{m.get('round', i + 1)}", m) for i, m in enumerate(reader)]
    rates = [(m["read_bytes_per_s"], source) for source, m in measured if m.get("read_bytes_per_s")]
    best = max(rates) if rates else (None, None)
    return {
        "read_bytes_per_s": best[0],
        "source": best[1],
        "method": "the highest read bandwidth measured in this run at the bench's disk: "
        "tensortorrent_dynamo.profile.disk.DiskBench (one stream of O_DIRECT reads at the "
        "offload directory) before and after the competitors, and "
        "tensortorrent_dynamo.io.reader.DiskReader (every tensor of model.safetensors submitted "
        "at once, its default threads, page cache dropped) at the start of every round",
        "before": before,
        "after": after,
        "reader": list(reader),
    }


# --- Rounds, medians and ratios -------------------------------------------------------------


def schedule(
    regimes: Sequence[str], competitors: Sequence[str], rounds: int
) -> list[list[tuple[str, str]]]:
    """The (regime, competitor) processes of each round: odd rounds in the given order, even
    rounds in reverse, so that two competitors run as close in time in every round and each
    runs first as often as the other (for an even number of rounds)."""
    order = [(regime, competitor) for regime in regimes for competitor in competitors]
    return [order if r % 2 == 0 else order[::-1] for r in range(rounds)]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _streamed(result: Mapping[str, Any]) -> tuple[int | float | None, str | None]:
    """The bytes a competitor's process read from disk per cold call, and where from."""
    split = result["info"].get("device_map_split")
    if split is not None:
        return split.get("disk", {}).get("param_bytes", 0), (
            "parameter bytes of the modules mapped to 'disk'"
        )
    reads = [c["disk_bytes_read"] for c in result["cold"]["per_call"] if "disk_bytes_read" in c]
    if reads:
        return _median(reads), "compiled.disk_bytes_read(), median over cold calls"
    return None, None


def _min(*values: float | None) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _max(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def summarize_competitor(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One competitor on one regime over its rounds (``runs``: per round, the process's
    ``result`` with ``round``, ``order``, ``started_s`` and ``process_s``).

    Medians over every timed call of every round; each round's own medians under
    ``rounds``; setup and compile seconds the median over rounds; RSS figures the max over
    rounds. A round that failed fails the competitor.
    """
    failed = {
        str(run["round"]): run["result"].get("error", "no result")
        for run in runs
        if not run["result"] or "error" in run["result"]
    }
    if failed or not runs:
        first = next(iter(failed.items()), ("-", "no round ran"))
        return {"ok": False, "error": f"round {first[0]}: {first[1]}", "errors_by_round": failed}
    results = [run["result"] for run in runs]
    rounds: list[dict[str, Any]] = []
    for run, r in zip(runs, results, strict=True):
        streamed, _ = _streamed(r)
        rounds.append(
            {
                "round": run["round"],
                "order": run["order"],
                "started_s": run["started_s"],
                "process_s": run["process_s"],
                "ok": r["quality"]["ok"],
                "median_ms_cold": r["cold"]["median_ms"],
                "median_ms_warm": r["warm"]["median_ms"],
                "times_ms_cold": r["cold"]["times_ms"],
                "times_ms_warm": r["warm"]["times_ms"],
                "setup_s": r["setup_s"],
                "compile_s": r["compile_s"],
                "peak_rss_bytes": r["peak_rss_bytes"],
                "peak_rss_cold_calls_bytes": r["cold"]["peak_rss_calls_bytes"],
                "streamed_bytes": streamed,
            }
        )
    cold = [t for r in results for t in r["cold"]["times_ms"]]
    warm = [t for r in results for t in r["warm"]["times_ms"]]
    cold_rounds = [x["median_ms_cold"] for x in rounds if x["median_ms_cold"]]
    warm_rounds = [x["median_ms_warm"] for x in rounds if x["median_ms_warm"]]
    peak = max(results, key=lambda r: r["peak_rss_bytes"])
    io_reads = [
        c["io_read_bytes"] for r in results for c in r["cold"]["per_call"] if "io_read_bytes" in c
    ]
    page_cache = sorted({r["cold"]["page_cache"] for r in results})
    row: dict[str, Any] = {
        "ok": all(r["quality"]["ok"] for r in results),
        "median_ms_cold": _median(cold),
        "median_ms_warm": _median(warm),
        "times_ms_cold": cold,
        "times_ms_warm": warm,
        "round_spread_cold": _ratio(max(cold_rounds, default=None), min(cold_rounds, default=0)),
        "round_spread_warm": _ratio(max(warm_rounds, default=None), min(warm_rounds, default=0)),
        "rounds": rounds,
        "warmup_calls": results[0]["warmup_calls"],
        "page_cache_cold": page_cache[0] if len(page_cache) == 1 else page_cache,
        "quality": worst_quality([r["quality"] for r in results]),
        "setup_s": _median([r["setup_s"] for r in results]),
        "compile_s": _median([r["compile_s"] for r in results]),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results),
        "peak_rss_setup_bytes": _max([r["rss_after_setup"].get("VmHWM") for r in results]),
        "peak_rss_cold_calls_bytes": _max([r["cold"]["peak_rss_calls_bytes"] for r in results]),
        "peak_rss_warm_calls_bytes": _max([r["warm"]["peak_rss_calls_bytes"] for r in results]),
        "rss_growth_cold_calls_bytes": _max([r["cold"]["rss_growth_bytes"] for r in results]),
        "rss_growth_warm_calls_bytes": _max([r["warm"]["rss_growth_bytes"] for r in results]),
        "rss_baseline_bytes": _max([r["rss_baseline"].get("VmRSS") for r in results]),
        "rss_after_setup": peak["rss_after_setup"],
        "rss_after_cold_calls": peak["cold"]["rss_after_calls"],
        "io_read_bytes_cold_median": _median(io_reads),
        "holds_in_ram": results[0]["holds_in_ram"],
    }
    disk_reads = [
        c["disk_bytes_read"]
        for r in results
        for c in r["cold"]["per_call"]
        if "disk_bytes_read" in c
    ]
    if disk_reads:
        row["disk_bytes_read_cold"] = disk_reads
    streamed, source = _streamed(results[0])
    if streamed is not None:
        row["streamed_bytes"] = _median([x["streamed_bytes"] for x in rounds])
        row["streamed_bytes_source"] = source + (", median over rounds" if len(runs) > 1 else "")
        cold_s = (row["median_ms_cold"] or 0) / 1e3
        row["implied_read_bytes_per_s_cold"] = _ratio(row["streamed_bytes"], cold_s)
    split = results[0]["info"].get("device_map_split")
    if split is not None:
        row["device_map_split"] = split
        row["device_map"] = results[0]["info"]["device_map"]
        if any(r["info"].get("device_map_split") != split for r in results):
            row["device_map_note"] = "the device_map differed between rounds; round 1's is shown"
    if "explain" in results[0]:
        row["explain"] = results[0]["explain"]
    return row


def _put_ratio(
    out: dict[str, Any],
    key: str,
    num: Mapping[int, float | None],
    den: Mapping[int, float | None],
    pooled: float | None,
) -> None:
    """``key``: the median over rounds of each round's ratio (the headline: both figures of a
    round were measured close in time); ``key_pooled``: the ratio of the pooled medians;
    ``key_by_round``: each round's ratio."""
    by_round = [_ratio(num[r], den.get(r)) for r in sorted(num)]
    known = [x for x in by_round if x is not None]
    out[key] = _median(known)
    out[f"{key}_pooled"] = pooled
    out[f"{key}_by_round"] = by_round


def summarize_regime(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    param_nbytes: int,
    budget: int,
    disk_bw: float | None,
    cuda: bool,
) -> dict[str, Any]:
    """Per competitor figures of one regime over its rounds (``runs``: each competitor's
    processes, one a round), the lower bound and the ratios."""
    rows = {name: summarize_competitor(competitor_runs) for name, competitor_runs in runs.items()}

    def pooled(name: str, key: str) -> float | None:
        row = rows.get(name, {})
        return row.get(key) if row.get("ok") else None

    def per_round(name: str, key: str) -> dict[int, float | None]:
        row = rows.get(name, {})
        return {x["round"]: x[key] for x in row.get("rounds", [])} if row.get("ok") else {}

    out: dict[str, Any] = {"competitors": rows}
    eager_warm = pooled("eager", "median_ms_warm")
    eager_warm_rounds = per_round("eager", "median_ms_warm")
    # Eager holds every weight in RAM: its cold and warm calls both time the compute alone,
    # and the lower of the two is the better floor (a burst of load on a shared host can
    # slow one phase of one process, as a dropped cache can slow a cold call's code pages).
    compute_ms = _min(eager_warm, pooled("eager", "median_ms_cold"))
    eager_cold_rounds = per_round("eager", "median_ms_cold")
    compute_rounds = {
        r: _min(warm, eager_cold_rounds.get(r)) for r, warm in eager_warm_rounds.items()
    }
    bound: dict[str, Any] = {
        "compute_ms": compute_ms,
        "compute_ms_by_round": [compute_rounds[r] for r in sorted(compute_rounds)],
        "compute_source": "eager, no budget: the lower of its cold and warm medians (it holds "
        "every weight in RAM, so both time the compute alone); per round, that round's",
        "disk_read_bytes_per_s": disk_bw,
        "min_streamed_bytes": max(0, param_nbytes - budget),
    }
    has_bound = not cuda and compute_ms is not None and bool(disk_bw)

    def lower(compute: float | None, streamed: float | None) -> float | None:
        if compute is None or streamed is None or not disk_bw:
            return None
        return max(compute, 1e3 * streamed / disk_bw)

    ratios: dict[str, Any] = {}
    violations: dict[str, Any] = {}
    for name, row in rows.items():
        if not row.get("ok"):
            continue
        ratios[name] = {}
        cold, warm = per_round(name, "median_ms_cold"), per_round(name, "median_ms_warm")
        if name.startswith("tensortorrent"):
            for phase, mine in (("cold", cold), ("warm", warm)):
                field = f"median_ms_{phase}"
                theirs = per_round("accelerate", field)
                ratio = _ratio(row[field], pooled("accelerate", field))
                _put_ratio(ratios[name], f"over_accelerate_{phase}", mine, theirs, ratio)
        if name != "eager":
            ratio = _ratio(row["median_ms_warm"], eager_warm)
            _put_ratio(ratios[name], "over_eager_warm", warm, eager_warm_rounds, ratio)
        streamed = row.get("streamed_bytes")
        if has_bound and streamed is not None:
            streamed_rounds = {x["round"]: x["streamed_bytes"] for x in row["rounds"]}
            bounds = {r: lower(compute_rounds.get(r), s) for r, s in streamed_rounds.items()}
            bound[f"{name}_ms"] = lower(compute_ms, streamed)
            bound[f"{name}_ms_by_round"] = [bounds[r] for r in sorted(bounds)]
            ratio = _ratio(row["median_ms_cold"], bound[f"{name}_ms"])
            _put_ratio(ratios[name], "over_lower_bound_cold", cold, bounds, ratio)
            headline = ratios[name]["over_lower_bound_cold"]
            if headline is not None and headline < 1 - BOUND_NOISE:
                violations[name] = {
                    "over_lower_bound_cold": headline,
                    "median_ms_cold": row["median_ms_cold"],
                    "bound_ms": bound[f"{name}_ms"],
                    "streamed_bytes": streamed,
                    "implied_read_bytes_per_s_cold": row.get("implied_read_bytes_per_s_cold"),
                }
    if has_bound:
        bound["min_bytes_ms"] = lower(compute_ms, bound["min_streamed_bytes"])
        bound["check"] = (
            f"the disk rate is underestimated: {', '.join(violations)} beat the bound by more "
            f"than {BOUND_NOISE:.0%} (see violations)"
            if violations
            else f"no competitor beat its bound by more than {BOUND_NOISE:.0%}"
        )
        bound["violations"] = violations
    if cuda:
        bound["note"] = "not computed in CUDA mode (needs the host-to-device bandwidth)"
    bound["definition"] = (
        "max(compute_ms, streamed bytes / disk read bandwidth) per competitor, with its own "
        "streamed bytes; min_bytes_ms uses the bytes that cannot fit the budget. The disk "
        "read bandwidth is the highest measured in this run (disk.source): DiskBench's single "
        "stream of O_DIRECT reads before and after the competitors, and DiskReader reading "
        "model.safetensors cold with every tensor submitted at once (4 threads by default) "
        "once per round. Per round the bound uses that round's eager compute_ms; "
        "over_lower_bound_cold is the median over rounds of the round's cold median over the "
        "round's bound (_pooled: pooled cold median over the bound of the pooled figures). A "
        f"competitor more than {BOUND_NOISE:.0%} under its bound is listed in violations: "
        "the bound would then not be a bound, the disk rate being underestimated. A "
        "competitor's implied_read_bytes_per_s_cold is its streamed bytes over its cold "
        "median: the least rate it read at (its calls compute too)"
    )
    out["lower_bound"] = bound
    out["ratios"] = ratios
    return out


# --- A run of a bench -------------------------------------------------------------------------


def run_bench(
    name: str,
    workload_ref: str,
    params: Mapping[str, Any],
    args: argparse.Namespace,
    repeats: int,
    competitors: Sequence[str],
    device: str = "cpu",
    disk_mib: int = 256,
) -> Path:
    """Setup, disk bandwidth, every competitor in its own process, in rounds; write the JSON.

    ``competitors`` are the CPU mode's defaults; ``--competitors`` overrides them.
    """
    started = time.perf_counter()
    rounds = (1 if args.quick else DEFAULT_ROUNDS) if args.rounds is None else args.rounds
    if rounds < 1 or repeats < 1:
        raise ValueError(f"--rounds and --repeats must be at least 1, got {rounds}, {repeats}")
    work = (args.out_dir or RESULTS / "tmp" / name).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "offload").mkdir(parents=True)
    cuda = device.startswith("cuda")
    base = {"workload": workload_ref, "params": dict(params), "work_dir": str(work)}
    setup, error, _ = _subprocess("setup", base, work, "setup", args.timeout)
    if setup is None or error:
        raise RuntimeError(f"{name}: setup failed: {error}")
    param_nbytes = int(setup["param_bytes"])
    if args.budget is not None:
        from tensortorrent_dynamo.units import parse_bytes

        budget = parse_bytes(args.budget, "--budget")
    else:
        budget = int(param_nbytes * args.budget_fraction)
    print(
        f"{name}: setup {setup['seconds']:.1f} s, {param_nbytes} parameter bytes, budget {budget} B"
        f", {rounds} round(s) of {repeats} cold + {repeats} warm calls per process"
    )
    disk_before = measure_disk(work / "offload", args.disk_mib or disk_mib)
    drop_note = "page cache not dropped: --no-drop was given" if args.no_drop else None
    if drop_note is None:
        drop_note = drop_page_cache()
    names = list(args.competitors or (CUDA_COMPETITORS if cuda else competitors))
    regimes_run = list(setup["input_shapes"])
    plan = schedule(regimes_run, names, rounds)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        regime: {competitor: [] for competitor in names} for regime in regimes_run
    }
    reader: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    process_s: dict[str, float] = {}
    for number, order in enumerate(plan, start=1):
        measured = measure_reader(work / CHECKPOINT, drop=drop_note is None)
        reader.append({"round": number, **measured})
        rate = measured.get("read_bytes_per_s")
        print(
            f"{name} round {number}/{rounds}: DiskReader "
            + (f"{rate / 1e9:.2f} GB/s" if rate else f"failed: {measured.get('error')}")
        )
        for position, (regime, competitor) in enumerate(order):
            label = f"{competitor}-{regime}-r{number}"
            offload = work / "offload" / label
            offload.mkdir(parents=True)
            spec = {
                **base,
                "competitor": competitor,
                "regime": regime,
                "checkpoint": str(work / CHECKPOINT),
                "reference": str(work / REFERENCE),
                "offload_dir": str(offload),
                "budget_bytes": budget,
                "device": device,
                "repeats": repeats,
                "warmup": args.warmup,
                "drop_caches": drop_note is None,
            }
            start_s = time.perf_counter() - started
            result, error, process_s[label] = _subprocess("run", spec, work, label, args.timeout)
            if error and (result is None or "error" not in result):
                result = {**(result or {}), "ok": False, "error": error}
            result = result or {"ok": False, "error": "no result"}
            if "error" in result:
                errors[label] = result["error"]
            runs[regime][competitor].append(
                {
                    "round": number,
                    "order": position,
                    "started_s": start_s,
                    "process_s": process_s[label],
                    "result": result,
                }
            )
            print_row(f"{competitor} {regime}", result, process_s[label])
            shutil.rmtree(offload, ignore_errors=True)
    disk = disk_figures(
        disk_before, measure_disk(work / "offload", args.disk_mib or disk_mib), reader
    )
    regimes = {
        regime: summarize_regime(by_name, param_nbytes, budget, disk["read_bytes_per_s"], cuda)
        for regime, by_name in runs.items()
    }
    payload = {
        "method": (
            f"each competitor and regime in its own fresh Python process, {rounds} round(s) of "
            "them, interleaved (odd rounds in the order of `schedule`, even rounds in "
            f"reverse); per process {args.warmup} warm-up call(s) excluded, then {repeats} timed "
            f"calls with the page cache dropped before each (cold), then {repeats} without "
            "dropping it (warm); medians over every timed call of every round, each round's "
            "medians kept under `rounds`; setup and compile seconds the median over rounds, "
            "peak RSS the max over rounds; every call's output checked against eager's, saved "
            "by the setup step"
        ),
        "ratios_definition": (
            "the headline ratio (e.g. over_accelerate_cold, and `figure`) is the median over "
            "rounds of the ratio of the two figures measured in the same round, which ran close "
            "in time, so that the disk's and CPU's drift over minutes cancels; *_pooled is the "
            "ratio of the medians over every call of every round; *_by_round each round's ratio"
        ),
        "quick": bool(args.quick),
        "device": device,
        "params": dict(params),
        "param_bytes": param_nbytes,
        "budget_bytes": budget,
        "budget_device": device if cuda else "cpu",
        "rounds": rounds,
        "repeats": repeats,
        "warmup": args.warmup,
        "schedule": [[f"{c}-{r}" for r, c in order] for order in plan],
        "page_cache": drop_note
        or "dropped before each cold timed call (sync; echo 3 > /proc/sys/vm/drop_caches)",
        "setup": setup,
        "disk": disk,
        "regimes": regimes,
        "figure": {
            regime: {k: v for k, v in data["ratios"].get(MAIN_TT, {}).items() if k in RATIO_KEYS}
            for regime, data in regimes.items()
        },
        "errors": errors,
        "process_s": process_s,
        "runtime_s": time.perf_counter() - started,
        "work_dir": str(work),
    }
    # A GPU run must not overwrite the CPU run's figures.
    path = write_results(f"{name}_cuda" if cuda else name, payload, args.results)
    print_summary(name, payload)
    print(f"wrote {path} ({payload['runtime_s']:.0f} s)")
    return path


def print_row(label: str, result: Mapping[str, Any], seconds: float) -> None:
    if "error" in result:
        print(f"  {label:<34} failed ({seconds:.0f} s): {result['error'][:300]}")
        return
    mib = 2**20
    print(
        f"  {label:<34} cold {result['cold']['median_ms']:9.1f} ms  "
        f"warm {result['warm']['median_ms']:9.1f} ms  "
        f"peak RSS {result['peak_rss_bytes'] / mib:6.0f} MiB "
        f"(cold calls {(result['cold']['peak_rss_calls_bytes'] or 0) / mib:6.0f} MiB)  "
        f"ok={result['ok']}  ({seconds:.0f} s)"
    )


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_summary(name: str, payload: Mapping[str, Any]) -> None:
    """Pooled medians, each round's, and the ratios (headline, pooled, per round)."""
    disk = payload["disk"]
    print(
        f"{name}: bound's disk rate {_fmt((disk['read_bytes_per_s'] or 0) / 1e9)} GB/s "
        f"({disk['source']}); DiskReader by round: "
        + ", ".join(_fmt((m.get("read_bytes_per_s") or 0) / 1e9) for m in disk["reader"])
        + f"; DiskBench before {_fmt((disk['before'].get('read_bytes_per_s') or 0) / 1e9)}, "
        f"after {_fmt((disk['after'].get('read_bytes_per_s') or 0) / 1e9)}"
    )
    for regime, data in payload["regimes"].items():
        print(f"{name} {regime}: median ms over all rounds (each round's medians)")
        for competitor, row in data["competitors"].items():
            if not row.get("ok"):
                print(f"  {competitor:<24} failed: {str(row.get('error'))[:200]}")
                continue
            cold = " ".join(_fmt(x["median_ms_cold"], ".0f") for x in row["rounds"])
            warm = " ".join(_fmt(x["median_ms_warm"], ".0f") for x in row["rounds"])
            print(
                f"  {competitor:<24} cold {_fmt(row['median_ms_cold'], '8.1f')} ({cold})  "
                f"warm {_fmt(row['median_ms_warm'], '8.1f')} ({warm})"
            )
        for competitor, ratios in data["ratios"].items():
            for key in (*RATIO_KEYS, "over_eager_warm"):
                if key in ratios:
                    rounds = " ".join(_fmt(x) for x in ratios[f"{key}_by_round"])
                    print(
                        f"  {competitor} {key}: {_fmt(ratios[key])} "
                        f"(pooled {_fmt(ratios[f'{key}_pooled'])}; rounds {rounds})"
                    )
        check = data["lower_bound"].get("check")
        if check:
            print(f"  lower bound: {check}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 3 or argv[0] not in ("run", "setup"):
        print("usage: python -m bench.offload_common {run,setup} SPEC.json OUT.json")
        return 2
    command, spec, out = argv
    if command == "setup":
        return setup_main(Path(spec), Path(out))
    return child_main(Path(spec), Path(out))


if __name__ == "__main__":
    sys.exit(main())
