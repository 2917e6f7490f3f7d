"""The competitors: what each is told (``Context``), how each loads and calls the model
(``Competitor`` and its subclasses: eager, Accelerate, TensorTorrent), by name in
``COMPETITORS``. A call is one forward, or for a ``GenerateWorkload`` one ``generate()``
(``bench.offload.generation``): eager and Accelerate with the default (dynamic) KV cache,
TensorTorrent with the model's ``forward`` compiled by ``torch.compile`` and a static cache."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .generation import Generate
from .measure import read_all
from .workload import GenerateWorkload, Workload

DISK_UNBOUNDED = 1 << 50
"""Accelerate's ``max_memory`` for the tier that takes whatever the budget leaves."""


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


Call = Callable[[], Any]
"""One call of the model: its output (a tensor, or a generation's tokens and logits)."""


class Context:
    """What a competitor is told: the workload, files, budget and device."""

    def __init__(self, spec: Mapping[str, Any], workload: Workload) -> None:
        self.workload = workload
        self.checkpoint = Path(spec["checkpoint"])
        sharded = spec.get("accelerate_checkpoint")
        self.accelerate_checkpoint = Path(sharded) if sharded else self.checkpoint
        """What Accelerate loads: the checkpoint, or the index of its sharded copy."""
        self.offload_dir = Path(spec["offload_dir"])
        self.budget = int(spec["budget_bytes"])
        # a generation regime's KV cache at its longest: room the limit has on top
        self.kv_cache_bytes = int(spec.get("kv_cache_bytes", 0))
        self.device = str(spec["device"])
        self.cuda = self.device.startswith("cuda")
        self.new_tokens = workload.new_tokens if isinstance(workload, GenerateWorkload) else None
        """Tokens each call generates; ``None``: a call is one forward."""


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
        self.generate: Generate | None = None
        """A generative workload's call, whose figures ``after_call`` reports."""

    def imports(self) -> None:
        """Import what this competitor needs (before the RSS baseline)."""

    def setup(self, model: torch.nn.Module) -> None:
        """Load weights / dispatch the model."""

    def prepare(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Call:
        """A call of the model on ``inputs`` (compiling for them if this competitor does)."""
        module = model if self.model is None else self.model
        if self.ctx.new_tokens is not None:
            return self.generation(module, inputs)
        return lambda: module(*inputs)

    def generation(
        self, module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], static_cache: bool = False
    ) -> Generate:
        """The call of a generative workload: ``module.generate`` on ``inputs`` (the prompt)."""
        assert self.ctx.new_tokens is not None
        (input_ids,) = inputs
        self.generate = Generate(module, input_ids, self.ctx.new_tokens, static_cache)
        return self.generate

    def after_call(self) -> dict[str, Any]:
        """Figures of the call just made (e.g. bytes read from disk, a generation's steps)."""
        return self.generate.figures() if self.generate is not None else {}

    def regime_info(self) -> dict[str, Any]:
        """Figures of the regime after its calls (e.g. the plan)."""
        return {}

    def read_alone(self) -> float | None:
        """Seconds this competitor's own reader takes to read, alone, the bytes one call
        reads from disk (all submitted at once, nothing computed); ``None`` where it has no
        reader of its own to ask."""
        return None


class Eager(Competitor):
    holds = (
        "every parameter, as anonymous memory (safetensors.torch.load_file of the whole "
        "checkpoint, assigned to the meta model)"
    )
    _streamed: tuple[Any, list[Any]] | None = None

    def setup(self, model: torch.nn.Module) -> None:
        self.model = load_checkpoint_into(model, self.ctx.checkpoint).to(self.device)

    def streamed_reads(self) -> tuple[Any, list[Any]] | None:
        """What a plan under the budget must read from disk each call at the least: a
        ``DiskReader`` with the backend's default settings, and the checkpoint's last tensors
        in file order, at least its bytes over the budget, each read verified as the backend
        verifies a user's checkpoint (checksums recorded by an untimed first pass, which
        also fills the reader's pool). ``None`` on a GPU, or when the budget holds it all."""
        if self.ctx.cuda:
            return None
        if self._streamed is None:
            from tensortorrent_dynamo.io.locations import FileGuard
            from tensortorrent_dynamo.io.pool import HostBufferPool
            from tensortorrent_dynamo.io.reader import DiskReader
            from tensortorrent_dynamo.io.safetensors import safetensors_locations

            found = safetensors_locations(self.ctx.checkpoint)
            over = sum(loc.nbytes for loc in found.values()) - self.ctx.budget
            chosen: dict[str, Any] = {}
            for key, loc in sorted(found.items(), key=lambda kv: -kv[1].offset):
                if over <= 0:
                    break
                chosen[key] = loc
                over -= loc.nbytes
            if not chosen:
                return None
            guard = FileGuard(
                self.ctx.checkpoint,
                {key: (loc.offset, loc.nbytes, None) for key, loc in chosen.items()},
                source="checkpoint",
                advice="run the bench again",
            )
            reader = DiskReader(HostBufferPool())
            locations = list(guard.locate(chosen).values())
            read_all(reader, locations)
            self._streamed = (reader, locations)
        return self._streamed


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
        "single-file checkpoint into RAM during setup (a sharded copy: one shard at a time)"
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
        self.info["checkpoint"] = str(ctx.accelerate_checkpoint)
        self.model = load_checkpoint_and_dispatch(
            model,
            str(ctx.accelerate_checkpoint),
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
    _disk_read = 0
    """Bytes the last generative call read from disk (by the backend's readers)."""
    _disk_busy_s = 0.0
    """Seconds of the last call during which the backend's readers had a read in flight."""
    _alone: Any = None
    """The reader of ``read_alone``, made on its first use."""

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
        if self.ctx.new_tokens is not None:
            return self.prepare_generate(source, inputs)
        compiled = tt.compile(source, example_inputs=inputs, **self.options())
        self.compiled = compiled

        def call() -> Any:
            before = self._disk_busy_total()
            out = compiled(*inputs)
            self._disk_busy_s = self._disk_busy_total() - before
            return out

        return call

    def prepare_generate(self, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Call:
        """``model.forward`` compiled by ``torch.compile(backend="tensortorrent")``, called by
        ``generate()`` with a static cache (a prefill and a decode graph); one call made here
        compiles both. The ``checkpoint`` option does not bind a meta model through
        ``torch.compile`` (Dynamo would trace its meta tensors): ``tt.bind_checkpoint`` does."""
        import tensortorrent as tt

        # chooses as "latency" does; explain() then shows the decode step at larger batches
        options = {**self.options(), "objective": "throughput"}
        # Its plan counts the KV cache in its budget, where Accelerate's max_memory is for
        # weights alone: the budget plus the cache leaves it the same room for weights.
        cpu = self.ctx.device if self.ctx.cuda else "cpu"
        options["budgets"] = {cpu: self.ctx.budget + self.ctx.kv_cache_bytes}
        self.info["budgets"] = dict(options["budgets"])
        if "checkpoint" in options:
            tt.bind_checkpoint(model, options["checkpoint"])
        forward: Any = torch.compile(model.forward, backend="tensortorrent", options=options)
        model.forward = forward
        generate = self.generation(model, inputs, static_cache=True)

        def call() -> dict[str, torch.Tensor]:
            before, busy = self._disk_bytes_total(), self._disk_busy_total()
            out = generate()
            self._disk_read = self._disk_bytes_total() - before
            self._disk_busy_s = self._disk_busy_total() - busy
            return out

        call()
        return call

    def read_alone(self) -> float | None:
        """The parameters the plans of every graph read from disk each call, read alone: by a
        reader with the sessions' own settings (threads, request size, ``O_DIRECT``), every
        read submitted at once, into a pool of its own that an untimed first pass fills (a
        fresh buffer is faulted in by the read landing in it, which slows the read), as the
        bench's ``DiskReader`` figure is measured."""
        if self.compiled is None:
            return None
        from tensortorrent_dynamo.io.pool import HostBufferPool
        from tensortorrent_dynamo.io.reader import DiskReader

        sessions = [s for s in self.compiled.backend.sessions.values() if s.disk is not None]
        locations = [
            session.disk.locations[param.fqn]
            for session in sessions
            for graph in session.graphs
            for param, residency in zip(graph.plan.cost.params, graph.plan.residency, strict=True)
            if residency.reads_from_disk
        ]
        if not locations:
            return None
        if self._alone is None:
            like = sessions[0].disk.reader
            self._alone = DiskReader(
                HostBufferPool(),
                threads=like.threads,
                direct=like.direct,
                chunk_bytes=like.chunk_bytes,
            )
            read_all(self._alone, locations)
        return read_all(self._alone, locations)

    def _readers(self) -> list[Any]:
        """The disk readers of the backend's sessions (``tt.compile``'s backend, else the
        registered one), one a session that reads from disk."""
        from tensortorrent_dynamo import tensortorrent_backend

        backend = tensortorrent_backend if self.compiled is None else self.compiled.backend
        return [s.disk.reader for s in backend.sessions.values() if s.disk is not None]

    def _disk_bytes_total(self) -> int:
        """Bytes the backend's disk readers read so far."""
        return sum(r.bytes_read for r in self._readers())

    def _disk_busy_total(self) -> float:
        """Seconds the backend's disk readers have had a read in flight so far."""
        return sum(r.busy_seconds for r in self._readers())

    def after_call(self) -> dict[str, Any]:
        busy = {"disk_busy_s": self._disk_busy_s}
        if self.compiled is not None:
            return {"disk_bytes_read": int(self.compiled.disk_bytes_read()), **busy}
        return {**super().after_call(), "disk_bytes_read": self._disk_read, **busy}

    def regime_info(self) -> dict[str, Any]:
        if self.compiled is not None:
            return {"explain": self.compiled.explain()}
        from tensortorrent_dynamo import tensortorrent_backend
        from tensortorrent_dynamo.report.explain import explain

        return {"explain": explain(tensortorrent_backend.graphs)}


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
